//! Buffer layouts derived from a model's shape (or from the byte lengths a runtime knows), so
//! runtimes and the command line do not hand-build them.
//!
//! Buffer order: for each layer its K and V (or one replicated MLA latent buffer), then for
//! each Mamba layer its SSM state and (when the shape has one) its conv state, then each draft
//! layer's K and V. KV pages are head-major (HND) or token-major (NHD: a row per token).

use serde_json::Value;

use crate::error::{bail, PlanError, PlanResult};
use crate::layout::{
    BufferKind, BufferLayout, LogicalAxis, LogicalParts, MAX_VALUE, MAX_WORLD_SIZE,
};

/// Most layers of each kind a model may have: buffers are listed one by one.
const MAX_LAYERS: u64 = 1 << 16;

/// Cache element types, each with the name a model's config gives it and the names runtimes
/// use for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    BFloat16,
    Float16,
    Float32,
    Float8E4M3Fn,
    Float8E5M2,
    Float8E4M3Fnuz,
    Float8E5M2Fnuz,
    Int8,
    UInt8,
}

impl Dtype {
    pub const ALL: [Self; 9] = [
        Self::BFloat16,
        Self::Float16,
        Self::Float32,
        Self::Float8E4M3Fn,
        Self::Float8E5M2,
        Self::Float8E4M3Fnuz,
        Self::Float8E5M2Fnuz,
        Self::Int8,
        Self::UInt8,
    ];

    /// The name as `PyTorch` and Hugging Face configs spell it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::BFloat16 => "bfloat16",
            Self::Float16 => "float16",
            Self::Float32 => "float32",
            Self::Float8E4M3Fn => "float8_e4m3fn",
            Self::Float8E5M2 => "float8_e5m2",
            Self::Float8E4M3Fnuz => "float8_e4m3fnuz",
            Self::Float8E5M2Fnuz => "float8_e5m2fnuz",
            Self::Int8 => "int8",
            Self::UInt8 => "uint8",
        }
    }

    const fn aliases(self) -> &'static [&'static str] {
        match self {
            Self::BFloat16 => &["bf16"],
            Self::Float16 => &["fp16", "half"],
            Self::Float32 => &["fp32", "float"],
            Self::Float8E4M3Fn => &["fp8", "float8", "fp8_e4m3", "float8_e4m3"],
            Self::Float8E5M2 => &["fp8_e5m2"],
            Self::Float8E4M3Fnuz | Self::Float8E5M2Fnuz | Self::Int8 | Self::UInt8 => &[],
        }
    }

    pub const fn bytes(self) -> u64 {
        match self {
            Self::Float32 => 4,
            Self::BFloat16 | Self::Float16 => 2,
            Self::Float8E4M3Fn
            | Self::Float8E5M2
            | Self::Float8E4M3Fnuz
            | Self::Float8E5M2Fnuz
            | Self::Int8
            | Self::UInt8 => 1,
        }
    }

    /// A dtype by name, case-insensitive, with or without a `torch.` prefix.
    pub fn parse(name: &str) -> PlanResult<Self> {
        let lower = name.trim().to_ascii_lowercase();
        let bare = lower.strip_prefix("torch.").unwrap_or(&lower);
        Self::ALL
            .into_iter()
            .find(|d| d.as_str() == bare || d.aliases().contains(&bare))
            .ok_or_else(|| {
                let known: Vec<&str> = Self::ALL.iter().map(|d| d.as_str()).collect();
                PlanError::new(format!(
                    "unknown dtype {name:?}: use one of {} (or bf16, fp16, fp32, fp8)",
                    known.join(", ")
                ))
            })
    }
}

/// Bytes of one element of a cache dtype, by the names runtimes and Hugging Face use.
pub fn dtype_bytes(name: &str) -> PlanResult<u64> {
    Dtype::parse(name).map(Dtype::bytes)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MlaShape {
    pub kv_lora_rank: u64,
    pub rope_head_dim: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MambaShape {
    pub layers: u64,
    /// SSM state channels across all TP ranks (sharded by TP).
    pub channels: u64,
    /// Bytes of one channel's SSM state.
    pub bytes_per_channel: u64,
    /// The conv state, when the model keeps one (Mamba2 does).
    pub conv: Option<ConvShape>,
}

/// Mamba2's conv state: channels `x | B | C` (each sharded by TP on its own), each holding the
/// last `width` inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConvShape {
    /// Channels of `x` (the SSM's inner size).
    pub x_channels: u64,
    /// Channels of `B`, and again of `C` (groups x state size).
    pub bc_channels: u64,
    /// Inputs kept per channel (the conv kernel size minus one).
    pub width: u64,
}

/// How a KV page stores its tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvLayout {
    /// `[heads][page_size][head_dim]`: a rank's heads one after another (one row a page).
    #[default]
    Hnd,
    /// `[page_size][heads][head_dim]`: a row per token (`rows_per_page = page_size`).
    Nhd,
}

impl KvLayout {
    pub fn parse(text: &str) -> PlanResult<Self> {
        match text {
            "HND" => Ok(Self::Hnd),
            "NHD" => Ok(Self::Nhd),
            other => bail!("kv_layout must be 'HND' or 'NHD', got {other:?}"),
        }
    }

    /// Rows of a page of `page_size` tokens.
    const fn rows(self, page_size: u64) -> u64 {
        match self {
            Self::Hnd => 1,
            Self::Nhd => page_size,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DraftShape {
    pub layers: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelShape {
    /// Attention layers with a KV cache (0 for a pure state-space model).
    pub layers: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub dtype: Dtype,
    pub page_size: u64,
    pub mla: Option<MlaShape>,
    pub mamba: Option<MambaShape>,
    pub draft: Option<DraftShape>,
}

fn product(values: &[u64], what: &str) -> PlanResult<u64> {
    values
        .iter()
        .try_fold(1u64, |acc, &v| acc.checked_mul(v))
        .filter(|&v| v <= MAX_VALUE)
        .ok_or_else(|| PlanError::new(format!("{what} overflows 2^63 bytes")))
}

/// (replica group, heads a rank holds) for `heads` KV heads over `tp` ranks.
fn head_split(heads: u64, tp: u64, what: &str) -> PlanResult<(u64, u64)> {
    if heads == 0 {
        bail!("{what}: kv_heads must be positive");
    }
    if tp > heads {
        if tp % heads != 0 {
            bail!(
                "{what}: TP {tp} is above the {heads} KV heads but not a multiple of them, so \
                 heads cannot be replicated evenly; use a TP size that is a multiple of {heads}"
            );
        }
        return Ok((tp / heads, 1));
    }
    if heads % tp != 0 {
        bail!(
            "{what}: {heads} KV heads do not split evenly over TP {tp}; use a TP size that \
             divides {heads} or is a multiple of it"
        );
    }
    Ok((1, heads / tp))
}

#[allow(clippy::too_many_arguments)]
fn kv_pair(
    first_index: u64,
    kinds: (BufferKind, BufferKind),
    heads: u64,
    head_dim: u64,
    shape: &ModelShape,
    tp: u64,
    kv_layout: KvLayout,
    what: &str,
) -> PlanResult<[BufferLayout; 2]> {
    let (replica, local) = head_split(heads, tp, what)?;
    let unit = product(&[shape.page_size, head_dim, shape.dtype.bytes()], what)?;
    let buffer = |index, kind| BufferLayout {
        buffer_index: index,
        buffer_kind: kind,
        logical_axis: LogicalAxis::KvHead,
        logical_size: heads,
        page_size: shape.page_size,
        bytes_per_logical_unit: unit,
        item_stride_bytes: local * unit,
        tp_replica_group_size: replica,
        layer: None,
        rows_per_page: kv_layout.rows(shape.page_size),
        logical_parts: LogicalParts::WHOLE,
    };
    Ok([
        buffer(first_index, kinds.0),
        buffer(first_index + 1, kinds.1),
    ])
}

/// Sizes that must be positive and counts that must stay bounded, before any buffer is made.
fn check_shape(shape: &ModelShape, tp: u64) -> PlanResult<()> {
    if tp == 0 || shape.page_size == 0 || shape.head_dim == 0 {
        bail!("TP size, page_size and head_dim must be positive");
    }
    if tp > MAX_WORLD_SIZE {
        bail!("TP {tp} is above the largest world size {MAX_WORLD_SIZE}");
    }
    let layer_counts = [
        ("layers", shape.layers),
        ("mamba_layers", shape.mamba.map_or(0, |m| m.layers)),
        ("draft_layers", shape.draft.map_or(0, |d| d.layers)),
    ];
    for (name, count) in layer_counts {
        if count > MAX_LAYERS {
            bail!("{name}={count} is implausibly large; at most {MAX_LAYERS}");
        }
    }
    Ok(())
}

/// The buffers one side (TP size `tp`) holds for `shape`, in the documented order.
pub fn model_buffers(
    shape: &ModelShape,
    tp: u64,
    kv_layout: KvLayout,
) -> PlanResult<Vec<BufferLayout>> {
    check_shape(shape, tp)?;
    let mut out = Vec::new();
    let mut next = 0u64;
    for _ in 0..shape.layers {
        if let Some(mla) = shape.mla {
            let unit = product(
                &[
                    shape.page_size,
                    mla.kv_lora_rank + mla.rope_head_dim,
                    shape.dtype.bytes(),
                ],
                "the MLA latent cache",
            )?;
            out.push(BufferLayout {
                buffer_index: next,
                buffer_kind: BufferKind::TargetK,
                logical_axis: LogicalAxis::Replicated,
                logical_size: 1,
                page_size: shape.page_size,
                bytes_per_logical_unit: unit,
                item_stride_bytes: unit,
                tp_replica_group_size: 1,
                layer: None,
                rows_per_page: kv_layout.rows(shape.page_size),
                logical_parts: LogicalParts::WHOLE,
            });
            next += 1;
        } else {
            let kinds = (BufferKind::TargetK, BufferKind::TargetV);
            out.extend(kv_pair(
                next,
                kinds,
                shape.kv_heads,
                shape.head_dim,
                shape,
                tp,
                kv_layout,
                "target KV cache",
            )?);
            next += 2;
        }
    }
    if let Some(mamba) = shape.mamba {
        let ssm = ssm_buffer(&mamba, tp)?;
        let conv = mamba.conv.map(|c| conv_buffer(&c, shape, tp)).transpose()?;
        for _ in 0..mamba.layers {
            for buffer in std::iter::once(ssm).chain(conv) {
                out.push(BufferLayout {
                    buffer_index: next,
                    ..buffer
                });
                next += 1;
            }
        }
    }
    if let Some(draft) = shape.draft {
        let kinds = (BufferKind::DraftK, BufferKind::DraftV);
        for _ in 0..draft.layers {
            out.extend(kv_pair(
                next,
                kinds,
                draft.kv_heads,
                draft.head_dim,
                shape,
                tp,
                kv_layout,
                "draft KV cache",
            )?);
            next += 2;
        }
    }
    for buffer in &out {
        buffer.validate()?;
    }
    Ok(out)
}

/// Tags `buffers` (as `model_buffers` returns them for `shape`) with their model layers, for
/// pipeline stages: attention layer `i` is layer `i`, Mamba layer `j` comes after the attention
/// layers (`layers + j`), and the draft model's layers sit on the last layer (so the last
/// stage), where speculative decoding runs them.
pub fn tag_layers(shape: &ModelShape, buffers: &mut [BufferLayout]) {
    let per_attention = if shape.mla.is_some() { 1 } else { 2 };
    let mamba = shape.mamba.unwrap_or_default();
    let per_mamba = if mamba.conv.is_some() { 2 } else { 1 };
    let model_layers = shape.layers + mamba.layers;
    let attention = shape.layers * per_attention;
    let states = mamba.layers * per_mamba;
    for (position, buffer) in (0u64..).zip(buffers.iter_mut()) {
        buffer.layer = Some(if position < attention {
            position / per_attention
        } else if position < attention + states {
            shape.layers + (position - attention) / per_mamba
        } else {
            model_layers.saturating_sub(1)
        });
    }
}

/// A Mamba SSM state buffer (index 0): `channels` sharded by TP.
fn ssm_buffer(mamba: &MambaShape, tp: u64) -> PlanResult<BufferLayout> {
    if mamba.channels == 0 || mamba.bytes_per_channel == 0 {
        bail!("Mamba state: channels and bytes_per_channel must be positive");
    }
    if mamba.channels % tp != 0 {
        bail!(
            "Mamba state: {} channels do not split evenly over TP {tp}; use a TP size that \
             divides {}",
            mamba.channels,
            mamba.channels
        );
    }
    Ok(BufferLayout {
        buffer_index: 0,
        buffer_kind: BufferKind::MambaState,
        logical_axis: LogicalAxis::StateChannel,
        logical_size: mamba.channels,
        page_size: 1,
        bytes_per_logical_unit: mamba.bytes_per_channel,
        item_stride_bytes: product(
            &[mamba.channels / tp, mamba.bytes_per_channel],
            "the Mamba state",
        )?,
        tp_replica_group_size: 1,
        layer: None,
        rows_per_page: 1,
        logical_parts: LogicalParts::WHOLE,
    })
}

/// A Mamba2 conv state buffer (index 0): channels `x | B | C`, each part sharded by TP, a
/// channel holding `width` inputs of the model's dtype.
fn conv_buffer(conv: &ConvShape, shape: &ModelShape, tp: u64) -> PlanResult<BufferLayout> {
    if conv.x_channels == 0 || conv.bc_channels == 0 || conv.width == 0 {
        bail!("Mamba conv state: x channels, B/C channels and width must be positive");
    }
    for (name, part) in [("x", conv.x_channels), ("B and C", conv.bc_channels)] {
        if part % tp != 0 {
            bail!(
                "Mamba conv state: the {part} channels of {name} do not split evenly over TP \
                 {tp}; use a TP size that divides {part}"
            );
        }
    }
    let logical_size = product(&[conv.bc_channels, 2], "the conv state")?
        .checked_add(conv.x_channels)
        .filter(|&v| v <= MAX_VALUE)
        .ok_or_else(|| PlanError::new("the conv state's channels overflow"))?;
    let unit = product(&[conv.width, shape.dtype.bytes()], "the conv state")?;
    Ok(BufferLayout {
        buffer_index: 0,
        buffer_kind: BufferKind::MambaState,
        logical_axis: LogicalAxis::StateChannel,
        logical_size,
        page_size: 1,
        bytes_per_logical_unit: unit,
        item_stride_bytes: product(&[logical_size / tp, unit], "the conv state")?,
        tp_replica_group_size: 1,
        layer: None,
        rows_per_page: 1,
        logical_parts: LogicalParts::new(&[conv.x_channels, conv.bc_channels, conv.bc_channels])?,
    })
}

/// What a runtime knows of one buffer: its per-rank item length on each side and the length
/// of one logical unit (a head, a channel) in a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ItemLengths {
    pub buffer_index: u64,
    pub buffer_kind: BufferKind,
    pub prefill_item_bytes: u64,
    pub decode_item_bytes: u64,
    pub unit_bytes: u64,
    pub page_size: u64,
    /// Logical units in the whole buffer (e.g. the KV heads), when known; disambiguates
    /// replica groups on both sides.
    pub logical_size: Option<u64>,
    /// Rows a page on both sides (`page_size` for token-major pages).
    pub rows_per_page: u64,
}

/// Infers both sides' layouts of one buffer from its byte lengths: equal global units means
/// sharded; equal items on both sides means replicated; more units on one side than the
/// other means that side's TP runs above the logical size, in replica groups.
pub fn from_item_lengths(
    item: &ItemLengths,
    prefill_tp: u64,
    decode_tp: u64,
) -> PlanResult<(BufferLayout, BufferLayout)> {
    let name = format!(
        "buffer {} ({})",
        item.buffer_index,
        item.buffer_kind.as_str()
    );
    if item.unit_bytes == 0 || prefill_tp == 0 || decode_tp == 0 {
        bail!("{name}: unit_bytes and TP sizes must be positive");
    }
    if prefill_tp > MAX_WORLD_SIZE || decode_tp > MAX_WORLD_SIZE {
        bail!("{name}: TP sizes must be at most {MAX_WORLD_SIZE}");
    }
    for (side, bytes) in [
        ("prefill", item.prefill_item_bytes),
        ("decode", item.decode_item_bytes),
    ] {
        if bytes == 0 || bytes % item.unit_bytes != 0 {
            bail!(
                "{name}: the {side} item of {bytes} bytes is not a whole number of \
                 {}-byte units",
                item.unit_bytes
            );
        }
    }
    let prefill_units = item.prefill_item_bytes / item.unit_bytes;
    let decode_units = item.decode_item_bytes / item.unit_bytes;
    let prefill_global = prefill_units.checked_mul(prefill_tp);
    let decode_global = decode_units.checked_mul(decode_tp);
    let (Some(prefill_global), Some(decode_global)) = (prefill_global, decode_global) else {
        bail!("{name}: item lengths overflow");
    };
    let side = |logical_axis, logical_size, item_bytes, replica| BufferLayout {
        buffer_index: item.buffer_index,
        buffer_kind: item.buffer_kind,
        logical_axis,
        logical_size,
        page_size: item.page_size.max(1),
        bytes_per_logical_unit: item.unit_bytes,
        item_stride_bytes: item_bytes,
        tp_replica_group_size: replica,
        layer: None,
        rows_per_page: item.rows_per_page,
        logical_parts: LogicalParts::WHOLE,
    };
    let axis = if item.buffer_kind == BufferKind::MambaState {
        LogicalAxis::StateChannel
    } else {
        LogicalAxis::KvHead
    };
    let replica = |logical: u64, global: u64, units: u64, tp: u64| -> Option<u64> {
        // `tp / replica` shards of `units` units each must make `logical` units.
        (logical > 0 && global % logical == 0)
            .then(|| global / logical)
            .filter(|r| *r >= 1 && tp % r == 0 && units.checked_mul(tp / r) == Some(logical))
    };
    let sharded = |logical: u64| {
        Some((
            replica(logical, prefill_global, prefill_units, prefill_tp)?,
            replica(logical, decode_global, decode_units, decode_tp)?,
        ))
    };
    let split = |logical: u64, (pr, dr): (u64, u64)| {
        (
            side(axis, logical, item.prefill_item_bytes, pr),
            side(axis, logical, item.decode_item_bytes, dr),
        )
    };
    let refuse = || {
        PlanError::new(format!(
            "{name}: prefill TP {prefill_tp} x {prefill_units} units and decode TP {decode_tp} \
             x {decode_units} units describe neither the same sharded buffer ({prefill_global} \
             vs {decode_global} units) nor a replicated one (items of {} vs {} bytes); check \
             the item lengths, or pass the buffer's logical size",
            item.prefill_item_bytes, item.decode_item_bytes
        ))
    };
    let out = if let Some(logical) = item.logical_size {
        // Known logical size: only replica groups can explain a difference.
        split(logical, sharded(logical).ok_or_else(refuse)?)
    } else if prefill_global == decode_global {
        split(prefill_global, (1, 1))
    } else if item.prefill_item_bytes == item.decode_item_bytes {
        (
            side(
                LogicalAxis::Replicated,
                prefill_units,
                item.prefill_item_bytes,
                1,
            ),
            side(
                LogicalAxis::Replicated,
                decode_units,
                item.decode_item_bytes,
                1,
            ),
        )
    } else {
        // The side with more global units runs its TP above the logical size.
        let logical = prefill_global.min(decode_global);
        split(logical, sharded(logical).ok_or_else(refuse)?)
    };
    out.0.validate()?;
    out.1.validate()?;
    Ok(out)
}

fn config_u64(config: &Value, keys: &[&str]) -> PlanResult<Option<u64>> {
    for key in keys {
        match config.get(*key) {
            None | Some(Value::Null) => {}
            Some(value) => {
                return value.as_u64().map(Some).ok_or_else(|| {
                    PlanError::new(format!(
                        "config.json: {key} must be a non-negative integer, got {value}"
                    ))
                })
            }
        }
    }
    Ok(None)
}

/// A model shape from a Hugging Face `config.json` (read locally; nothing is fetched).
pub fn shape_from_hf_config(text: &str, page_size: u64) -> PlanResult<ModelShape> {
    let parsed: Value = serde_json::from_str(text)
        .map_err(|e| PlanError::new(format!("config.json is not valid JSON: {e}")))?;
    // Multimodal configs nest the language model.
    let config = parsed
        .get("text_config")
        .filter(|v| v.is_object())
        .unwrap_or(&parsed);
    if !config.is_object() {
        bail!("config.json must hold a JSON object");
    }
    let require = |keys: &[&str]| -> PlanResult<u64> {
        config_u64(config, keys)?.ok_or_else(|| {
            PlanError::new(format!(
                "config.json has no {}; is it a decoder model's config?",
                keys.join(" or ")
            ))
        })
    };
    let layers = require(&["num_hidden_layers", "n_layer", "num_layers"])?;
    let attention_heads = require(&["num_attention_heads", "n_head"])?;
    let kv_heads = config_u64(config, &["num_key_value_heads", "multi_query_group_num"])?
        .unwrap_or(attention_heads);
    let head_dim = if let Some(dim) = config_u64(config, &["head_dim"])? {
        dim
    } else {
        let hidden = require(&["hidden_size", "n_embd"])?;
        if attention_heads == 0 || hidden % attention_heads != 0 {
            bail!(
                "config.json: hidden_size={hidden} is not a multiple of \
                 num_attention_heads={attention_heads}"
            );
        }
        hidden / attention_heads
    };
    // Newer configs say `dtype`, older ones `torch_dtype`; multimodal ones may keep it outside
    // `text_config`. A config that names none is taken as bfloat16, the common cache type.
    let named = ["dtype", "torch_dtype"]
        .iter()
        .find_map(|k| config.get(*k).filter(|v| !v.is_null()))
        .or_else(|| {
            ["dtype", "torch_dtype"]
                .iter()
                .find_map(|k| parsed.get(*k).filter(|v| !v.is_null()))
        });
    let dtype = match named {
        None => Dtype::BFloat16,
        Some(Value::String(name)) => {
            Dtype::parse(name).map_err(|e| PlanError::new(format!("config.json: {e}")))?
        }
        Some(other) => {
            bail!("config.json: dtype must be a string such as \"bfloat16\", got {other}")
        }
    };
    let mla = match config_u64(config, &["kv_lora_rank"])? {
        Some(rank) if rank > 0 => Some(MlaShape {
            kv_lora_rank: rank,
            rope_head_dim: config_u64(config, &["qk_rope_head_dim"])?.unwrap_or(0),
        }),
        _ => None,
    };
    Ok(ModelShape {
        layers,
        kv_heads,
        head_dim,
        dtype,
        page_size,
        mla,
        mamba: None,
        draft: None,
    })
}

/// Named shapes for the command line and examples.
pub const PRESET_NAMES: [&str; 6] = [
    "llama-3-8b",
    "llama-3-70b",
    "llama-3-70b-eagle",
    "qwen2.5-32b",
    "deepseek-v3",
    "mamba2-hybrid-8b",
];

pub fn preset(name: &str, page_size: u64) -> PlanResult<ModelShape> {
    let base = ModelShape {
        layers: 32,
        kv_heads: 8,
        head_dim: 128,
        dtype: Dtype::BFloat16,
        page_size,
        mla: None,
        mamba: None,
        draft: None,
    };
    Ok(match name {
        "llama-3-8b" => base,
        "llama-3-70b" => ModelShape { layers: 80, ..base },
        "llama-3-70b-eagle" => ModelShape {
            layers: 80,
            draft: Some(DraftShape {
                layers: 1,
                kv_heads: 8,
                head_dim: 128,
            }),
            ..base
        },
        "qwen2.5-32b" => ModelShape { layers: 64, ..base },
        "deepseek-v3" => ModelShape {
            layers: 61,
            kv_heads: 1,
            head_dim: 576,
            mla: Some(MlaShape {
                kv_lora_rank: 512,
                rope_head_dim: 64,
            }),
            ..base
        },
        "mamba2-hybrid-8b" => ModelShape {
            layers: 4,
            mamba: Some(MambaShape {
                layers: 24,
                channels: 8192,
                bytes_per_channel: 128 * 2,
                // d_inner 8192, 8 groups x 128 state, kernel 4.
                conv: Some(ConvShape {
                    x_channels: 8192,
                    bc_channels: 1024,
                    width: 3,
                }),
            }),
            ..base
        },
        other => bail!(
            "unknown model preset {other:?}; choose one of {}",
            PRESET_NAMES.join(", ")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_70b_tp8_holds_one_head_per_rank_and_tp16_replicates() {
        let shape = preset("llama-3-70b", 16).unwrap();
        let tp8 = model_buffers(&shape, 8, KvLayout::Hnd).unwrap();
        assert_eq!(tp8.len(), 160);
        assert_eq!(tp8[0].item_stride_bytes, 16 * 128 * 2);
        assert_eq!(tp8[1].buffer_kind, BufferKind::TargetV);
        let tp16 = model_buffers(&shape, 16, KvLayout::Hnd).unwrap();
        assert_eq!(tp16[0].tp_replica_group_size, 2);
        assert!(model_buffers(&shape, 3, KvLayout::Hnd).is_err());
        assert!(model_buffers(&shape, 12, KvLayout::Hnd)
            .unwrap_err()
            .message()
            .contains("multiple"));
    }

    #[test]
    fn mla_mamba_and_draft_buffers() {
        let mla = model_buffers(&preset("deepseek-v3", 64).unwrap(), 8, KvLayout::Hnd).unwrap();
        assert_eq!(mla.len(), 61);
        assert_eq!(mla[0].logical_axis, LogicalAxis::Replicated);
        assert_eq!(mla[0].item_stride_bytes, 64 * 576 * 2);
        let hybrid =
            model_buffers(&preset("mamba2-hybrid-8b", 16).unwrap(), 4, KvLayout::Hnd).unwrap();
        let states: Vec<&BufferLayout> = hybrid
            .iter()
            .filter(|b| b.buffer_kind == BufferKind::MambaState)
            .collect();
        assert_eq!(states.len(), 48);
        // SSM state, then conv state (x | B | C over TP 4, 3 inputs of bf16 a channel).
        assert_eq!(states[1].logical_parts.given(), &[8192, 1024, 1024]);
        assert_eq!(states[1].item_stride_bytes, (8192 + 2048) / 4 * 3 * 2);
        assert_eq!(states[1].buffer_index, states[0].buffer_index + 1);
        let eagle =
            model_buffers(&preset("llama-3-70b-eagle", 16).unwrap(), 2, KvLayout::Nhd).unwrap();
        assert_eq!(eagle[0].rows_per_page, 16);
        assert_eq!(eagle.last().unwrap().rows_per_page, 16);
        assert_eq!(eagle.last().unwrap().buffer_kind, BufferKind::DraftV);
        assert_eq!(eagle.len(), 162);
    }

    #[test]
    fn item_lengths_infer_sharding_replication_and_replicas() {
        let item = |p, d, logical| ItemLengths {
            buffer_index: 0,
            buffer_kind: BufferKind::TargetK,
            prefill_item_bytes: p,
            decode_item_bytes: d,
            unit_bytes: 100,
            page_size: 16,
            logical_size: logical,
            rows_per_page: 1,
        };
        let (p, d) = from_item_lengths(&item(100, 400, None), 8, 2).unwrap();
        assert_eq!(
            (p.logical_axis, p.logical_size, d.logical_size),
            (LogicalAxis::KvHead, 8, 8)
        );
        let (p, _) = from_item_lengths(&item(100, 200, None), 4, 1).unwrap();
        assert_eq!((p.logical_size, p.tp_replica_group_size), (2, 2));
        let (p, d) = from_item_lengths(&item(100, 100, Some(2)), 8, 4).unwrap();
        assert_eq!((p.tp_replica_group_size, d.tp_replica_group_size), (4, 2));
        let (p, _) = from_item_lengths(&item(300, 300, None), 4, 2).unwrap();
        assert_eq!(p.logical_axis, LogicalAxis::Replicated);
        assert!(from_item_lengths(&item(100, 300, None), 4, 2).is_err());
        assert!(from_item_lengths(&item(150, 400, None), 8, 2).is_err());
    }

    #[test]
    fn hf_config() {
        let llama = r#"{"num_hidden_layers": 80, "num_attention_heads": 64,
            "num_key_value_heads": 8, "hidden_size": 8192, "torch_dtype": "bfloat16"}"#;
        let shape = shape_from_hf_config(llama, 16).unwrap();
        assert_eq!(
            (
                shape.layers,
                shape.kv_heads,
                shape.head_dim,
                shape.dtype.bytes()
            ),
            (80, 8, 128, 2)
        );
        let ds = r#"{"num_hidden_layers": 61, "num_attention_heads": 128, "hidden_size": 7168,
            "kv_lora_rank": 512, "qk_rope_head_dim": 64, "torch_dtype": "bfloat16"}"#;
        assert_eq!(
            shape_from_hf_config(ds, 64)
                .unwrap()
                .mla
                .unwrap()
                .kv_lora_rank,
            512
        );
        assert!(shape_from_hf_config("{}", 16)
            .unwrap_err()
            .message()
            .contains("num_hidden_layers"));
        assert!(shape_from_hf_config("[", 16).is_err());
        assert!(shape_from_hf_config(r#"{"num_hidden_layers": "80"}"#, 16).is_err());
    }
}
