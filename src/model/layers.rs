//! One model layer: its kind, its dimensions, and the cache buffers it keeps on one TP rank.
//!
//! Each kind's buffers, in order (sizes per token for token-indexed buffers):
//! - attention: K and V (`kv_head`, `head_dim` values a head); with NVFP4 also K's and V's
//!   block scales (one fp8 byte per 16 values), sharded like the heads. A sliding-window layer
//!   names its window on every buffer.
//! - MLA: the latent (`replicated`, `kv_lora_rank + rope_head_dim` values; FP8 caches use
//!   `FlashMLA`'s layout), then with an indexer its key cache (`index_head_dim` fp8 values and
//!   a 4-byte scale per 128 of them, `replicated`).
//! - Mamba2: SSM state `[heads, head_dim, state_size]` sharded by heads, then the conv state
//!   `x | B | C` (`heads * head_dim`, `groups * state_size` twice) of `conv_kernel - 1` inputs.
//! - Mamba1: SSM state `[inner, state_size]`, then the conv state `[inner, conv_kernel - 1]`.
//! - Gated `DeltaNet`: recurrent state `[value_heads, key_head_dim, value_head_dim]` sharded by
//!   value heads, then the conv state over `q | k | v` (key heads x key dim twice, value
//!   heads x value dim).
//! - Kimi Delta Attention (KDA): recurrent state `[heads, head_dim, head_dim]` sharded by heads,
//!   then the conv states of q, k and v (`heads * head_dim` channels each), as vLLM keeps them.
//! - lightning attention (`MiniMax`'s linear layers): state `[heads, head_dim, head_dim]`.
//! - short conv (LFM2): the conv state `[channels, conv_kernel - 1]`.
//! - attention + Mamba2 in one layer (Falcon-H1, Zamba2's hybrid layers): the attention buffers,
//!   then the Mamba2 ones.
//! - `DeepSeek`-V4 attention: up to five caches of their own page sizes (`deepseek_v4.rs`).
//! - MLP only, and attention that reuses an earlier layer's KV (Gemma 3n and 4): none.
//!
//! States use the state dtype; conv states the model's dtype (vLLM's `mamba_ssm_cache_dtype`
//! covers the SSM state only).

use super::deepseek_v4::DeepseekV4Shape;
use super::dtype::Dtype;
use crate::error::{bail, PlanError, PlanResult};
use crate::layout::{BufferKind, BufferLayout, LogicalAxis, LogicalParts, TokenPieces};
use crate::limits::MAX_VALUE;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AttentionShape {
    pub kv_heads: u64,
    /// K's head dim (and V's, unless `v_head_dim` says otherwise).
    pub head_dim: u64,
    /// Tokens the layer attends back over; `None` for full attention.
    pub sliding_window: Option<u64>,
    /// V's head dim where it differs from K's (`MiMo`-V2): K and V buffers of different sizes.
    pub v_head_dim: Option<u64>,
    /// Chunked local attention (Llama 4): a token attends only within its chunk of this many
    /// tokens, so a request of `n` tokens keeps only tokens `t >= (n / chunk) * chunk`.
    pub attention_chunk: Option<u64>,
    /// A sparse layer's index key dim (`MiniMax`-M3): one bf16 key a token, the same on every
    /// rank, beside K and V; 0 without one.
    pub index_head_dim: u64,
}

impl AttentionShape {
    /// Full attention of `kv_heads` heads of `head_dim` for K and V.
    pub const fn full(kv_heads: u64, head_dim: u64) -> Self {
        Self {
            kv_heads,
            head_dim,
            sliding_window: None,
            v_head_dim: None,
            attention_chunk: None,
            index_head_dim: 0,
        }
    }

    /// The same heads with a sliding window.
    #[must_use]
    pub const fn sliding(self, window: Option<u64>) -> Self {
        Self {
            sliding_window: window,
            ..self
        }
    }

    pub fn v_dim(&self) -> u64 {
        self.v_head_dim.unwrap_or(self.head_dim)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MlaShape {
    pub kv_lora_rank: u64,
    pub rope_head_dim: u64,
    /// The indexer's key dimension (`DeepSeek`-V3.2's sparse attention); 0 without one.
    pub index_head_dim: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mamba2Shape {
    pub heads: u64,
    pub head_dim: u64,
    pub state_size: u64,
    pub groups: u64,
    pub conv_kernel: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mamba1Shape {
    pub inner_size: u64,
    pub state_size: u64,
    pub conv_kernel: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GatedDeltaNetShape {
    pub key_heads: u64,
    pub value_heads: u64,
    pub key_head_dim: u64,
    pub value_head_dim: u64,
    pub conv_kernel: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KdaShape {
    pub heads: u64,
    pub head_dim: u64,
    pub conv_kernel: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LightningShape {
    pub heads: u64,
    pub head_dim: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ShortConvShape {
    pub channels: u64,
    pub conv_kernel: u64,
}

/// A model layer as its cache sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layer {
    Attention(AttentionShape),
    Mla(MlaShape),
    Mamba2(Mamba2Shape),
    Mamba1(Mamba1Shape),
    GatedDeltaNet(GatedDeltaNetShape),
    Kda(KdaShape),
    Lightning(LightningShape),
    ShortConv(ShortConvShape),
    /// Attention and Mamba2 side by side in one layer (Falcon-H1).
    AttentionMamba2(AttentionShape, Mamba2Shape),
    /// Attention that reads an earlier layer's KV and keeps none of its own (Gemma 3n and 4).
    SharedKv {
        source_layer: u64,
    },
    /// A layer without a cache (an MLP or `MoE` block).
    Mlp,
    /// `DeepSeek`-V4's attention: a sliding latent, compressed latents, compressor states.
    DeepseekV4(DeepseekV4Shape),
}

impl Layer {
    /// The kind's name, as the Python layer classes give it (its layer-kind schema row's).
    pub fn kind(&self) -> &'static str {
        self.schema().kind
    }

    /// What a reader calls the layer: its kind, with a window or an indexer when it has one.
    pub fn label(&self) -> String {
        match self {
            Self::Attention(a) => a.label(),
            Self::Mla(m) if m.index_head_dim > 0 => "MLA + indexer".to_owned(),
            Self::Mla(_) => "MLA".to_owned(),
            Self::Mamba2(_) => "Mamba2".to_owned(),
            Self::Mamba1(_) => "Mamba1".to_owned(),
            Self::GatedDeltaNet(_) => "Gated DeltaNet".to_owned(),
            Self::Kda(_) => "Kimi Delta Attention".to_owned(),
            Self::Lightning(_) => "lightning attention".to_owned(),
            Self::ShortConv(_) => "short conv".to_owned(),
            Self::AttentionMamba2(a, _) => format!("{} + Mamba2", a.label()),
            Self::SharedKv { source_layer } => {
                format!("attention reusing layer {source_layer}'s KV (no cache)")
            }
            Self::Mlp => "MLP only (no cache)".to_owned(),
            Self::DeepseekV4(d) => d.label(),
        }
    }

    /// Appends the layer's buffers on one rank (index 0, no layer: the caller numbers them).
    pub fn buffers(&self, cache: &Cache, out: &mut Vec<BufferLayout>) -> PlanResult<()> {
        match self {
            Self::Attention(a) => attention(a, cache, KV_KINDS, out),
            Self::Mla(m) => mla(m, cache, out),
            Self::Mamba2(m) => mamba2(m, cache, out),
            Self::Mamba1(m) => mamba1(m, cache, out),
            Self::GatedDeltaNet(g) => gated_deltanet(g, cache, out),
            Self::Kda(k) => kda(k, cache, out),
            Self::Lightning(l) => lightning(l, cache, out),
            Self::ShortConv(c) => {
                conv(&[c.channels], None, c.conv_kernel, cache).map(|b| out.push(b))
            }
            Self::AttentionMamba2(a, m) => {
                attention(a, cache, KV_KINDS, out)?;
                mamba2(m, cache, out)
            }
            Self::DeepseekV4(d) => d.buffers(cache.kv, cache.page_size, out),
            Self::SharedKv { .. } | Self::Mlp => Ok(()),
        }
    }
}

impl AttentionShape {
    fn label(&self) -> String {
        let base = match (self.sliding_window, self.attention_chunk) {
            (Some(w), _) => format!("sliding-window attention (window {w})"),
            (None, Some(c)) => format!("chunked local attention (chunk {c})"),
            (None, None) => "full attention".to_owned(),
        };
        let dims = match self.v_head_dim.filter(|&v| v != self.head_dim) {
            Some(v) => format!(
                ", {} KV heads, K dim {} / V dim {v}",
                self.kv_heads, self.head_dim
            ),
            None => String::new(),
        };
        let index = if self.index_head_dim > 0 {
            " + index keys"
        } else {
            ""
        };
        base + &dims + index
    }
}

/// How one side stores its cache: element types, page size, rows a page, TP size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cache {
    /// The model's dtype (conv states, MLA's rope part in FP8 caches is bf16 regardless).
    pub dtype: Dtype,
    pub kv: Dtype,
    pub state: Dtype,
    pub page_size: u64,
    /// Rows of a KV page (1 head-major, `page_size` token-major).
    pub rows: u64,
    pub tp: u64,
}

pub const KV_KINDS: (BufferKind, BufferKind) = (BufferKind::TargetK, BufferKind::TargetV);

/// Indexer keys a scale covers (vLLM's `quant_block_size`).
const INDEX_QUANT_BLOCK: u64 = 128;

fn product(values: &[u64], what: &str) -> PlanResult<u64> {
    values
        .iter()
        .try_fold(1u64, |acc, &v| acc.checked_mul(v))
        .filter(|&v| v <= MAX_VALUE)
        .ok_or_else(|| PlanError::new(format!("{what} overflows 2^63 bytes")))
}

fn positive(values: &[(&str, u64)], what: &str) -> PlanResult<()> {
    for (name, value) in values {
        if *value == 0 {
            bail!("{what}: {name} must be positive");
        }
    }
    Ok(())
}

/// (replica group, heads a rank holds) for `heads` KV heads over `tp` ranks.
fn head_split(heads: u64, tp: u64, what: &str) -> PlanResult<(u64, u64)> {
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

/// A token-indexed buffer of `token_bytes` bytes a unit and token.
fn token_buffer(
    cache: &Cache,
    kind: BufferKind,
    token_bytes: u64,
    what: &str,
) -> PlanResult<BufferLayout> {
    let unit = product(&[cache.page_size, token_bytes], what)?;
    Ok(BufferLayout {
        buffer_index: 0,
        buffer_kind: kind,
        logical_axis: LogicalAxis::Replicated,
        logical_size: 1,
        page_size: cache.page_size,
        bytes_per_logical_unit: unit,
        item_stride_bytes: unit,
        tp_replica_group_size: 1,
        layer: None,
        rows_per_page: cache.rows,
        page_bytes: None,
        logical_parts: LogicalParts::WHOLE,
        sliding_window: None,
        attention_chunk_size: None,
        token_pieces: TokenPieces::NONE,
    })
}

/// K and V of `a` (and their block scales for block-scaled dtypes), as `kinds`.
pub fn attention(
    a: &AttentionShape,
    cache: &Cache,
    kinds: (BufferKind, BufferKind),
    out: &mut Vec<BufferLayout>,
) -> PlanResult<()> {
    let what = "the KV cache";
    positive(
        &[
            ("kv_heads", a.kv_heads),
            ("head_dim", a.head_dim),
            ("v_head_dim", a.v_dim()),
        ],
        what,
    )?;
    if a.sliding_window.is_some() && a.attention_chunk.is_some() {
        bail!("{what}: a layer has a sliding window or an attention chunk, not both");
    }
    let (replica, local) = head_split(a.kv_heads, cache.tp, what)?;
    // (kind, bytes a head and token) of each buffer: K, V, then with block scales their scales.
    let mut sizes = vec![
        (
            kinds.0,
            cache.kv.bytes_of(a.head_dim, "a KV head of one token")?,
        ),
        (
            kinds.1,
            cache.kv.bytes_of(a.v_dim(), "a KV head of one token")?,
        ),
    ];
    if let Some(block) = cache.kv.scale_block() {
        for dim in [a.head_dim, a.v_dim()] {
            if dim % block != 0 {
                bail!(
                    "{what}: head_dim={dim} is not a multiple of {}'s {block}-value scale \
                     blocks; use another kv_cache_dtype",
                    cache.kv.as_str()
                );
            }
        }
        // One fp8 scale byte per block, kept as its own buffer per K and V.
        sizes.extend([(kinds.0, a.head_dim / block), (kinds.1, a.v_dim() / block)]);
    }
    for (kind, token_bytes) in sizes {
        let buffer = token_buffer(cache, kind, token_bytes, what)?;
        let item = product(&[local, buffer.bytes_per_logical_unit], what)?;
        out.push(BufferLayout {
            logical_axis: LogicalAxis::KvHead,
            logical_size: a.kv_heads,
            item_stride_bytes: item,
            tp_replica_group_size: replica,
            sliding_window: a.sliding_window,
            attention_chunk_size: a.attention_chunk,
            token_pieces: TokenPieces::NONE,
            ..buffer
        });
    }
    if a.index_head_dim > 0 {
        // vLLM's MiniMaxM3IndexerCache: one key head on every rank (the indexer's default
        // bfloat16; its fp8 option is a runtime setting a config does not name).
        let keys = Dtype::BFloat16.bytes_of(a.index_head_dim, "an index key")?;
        out.push(BufferLayout {
            sliding_window: a.sliding_window,
            attention_chunk_size: a.attention_chunk,
            token_pieces: TokenPieces::NONE,
            ..token_buffer(cache, kinds.0, keys, "the index key cache")?
        });
    }
    Ok(())
}

/// `FlashMLA`'s FP8 latent: fp8 values with one fp32 scale per 128, and the rope part in bf16.
const FLASH_MLA_TILE: u64 = 128;

fn mla(m: &MlaShape, cache: &Cache, out: &mut Vec<BufferLayout>) -> PlanResult<()> {
    let what = "the MLA latent cache";
    positive(&[("kv_lora_rank", m.kv_lora_rank)], what)?;
    let token_bytes = if cache.kv.is_fp8() {
        if m.kv_lora_rank % FLASH_MLA_TILE != 0 {
            bail!(
                "{what}: FP8 MLA caches (FlashMLA) scale the latent in tiles of \
                 {FLASH_MLA_TILE}, and kv_lora_rank={} is not a multiple of it",
                m.kv_lora_rank
            );
        }
        let scales = m.kv_lora_rank / FLASH_MLA_TILE * 4;
        let rope = product(&[m.rope_head_dim, 2], what)?;
        m.kv_lora_rank + scales + rope
    } else if cache.kv.scale_block().is_some() {
        bail!(
            "{what}: MLA has no {} cache layout; use the model's dtype or an fp8 kv_cache_dtype",
            cache.kv.as_str()
        );
    } else {
        let values = m
            .kv_lora_rank
            .checked_add(m.rope_head_dim)
            .ok_or_else(|| PlanError::new(format!("{what} overflows")))?;
        cache.kv.bytes_of(values, what)?
    };
    out.push(token_buffer(cache, BufferKind::TargetK, token_bytes, what)?);
    if m.index_head_dim > 0 {
        // The indexer keeps fp8 keys and a 4-byte scale per 128 of them, whatever the KV dtype
        // (vLLM models/deepseek_v32/attention.py: head_dim + head_dim // 128 * 4 bytes).
        let keys = m
            .index_head_dim
            .checked_add(m.index_head_dim / INDEX_QUANT_BLOCK * 4)
            .ok_or_else(|| PlanError::new("the indexer's key cache overflows"))?;
        out.push(token_buffer(
            cache,
            BufferKind::TargetK,
            keys,
            "the indexer's key cache",
        )?);
    }
    Ok(())
}

/// A state buffer of `parts` channels (each split evenly over TP) of `unit` bytes each.
fn state(parts: &[u64], unit: u64, cache: &Cache, what: &str) -> PlanResult<BufferLayout> {
    grouped_state(parts, None, unit, cache, what)
}

/// A state buffer of `parts` channels of `unit` bytes each, each part in `groups` groups where
/// given (a part of fewer groups than TP ranks copied onto the ranks of each group).
fn grouped_state(
    parts: &[u64],
    groups: Option<&[u64]>,
    unit: u64,
    cache: &Cache,
    what: &str,
) -> PlanResult<BufferLayout> {
    let channels = parts
        .iter()
        .try_fold(0u64, |sum, &p| sum.checked_add(p))
        .filter(|&v| v <= MAX_VALUE)
        .ok_or_else(|| PlanError::new(format!("{what}: channels overflow")))?;
    let mut logical_parts = if parts.len() > 1 || groups.is_some() {
        LogicalParts::new(parts)?
    } else {
        LogicalParts::WHOLE
    };
    if let Some(groups) = groups {
        logical_parts = logical_parts.with_groups(groups)?;
    }
    if let Err(why) = logical_parts.check_cuts(channels, cache.tp) {
        bail!(
            "{what}: the channels do not split over TP {}: {why}; use a TP size that divides \
             them",
            cache.tp
        );
    }
    let share = logical_parts.shard_units(channels, cache.tp);
    Ok(BufferLayout {
        buffer_index: 0,
        buffer_kind: BufferKind::MambaState,
        logical_axis: LogicalAxis::StateChannel,
        logical_size: channels,
        page_size: 1,
        bytes_per_logical_unit: unit,
        item_stride_bytes: product(&[share, unit], what)?,
        tp_replica_group_size: 1,
        layer: None,
        rows_per_page: 1,
        page_bytes: None,
        logical_parts,
        sliding_window: None,
        attention_chunk_size: None,
        token_pieces: TokenPieces::NONE,
    })
}

/// Heads that every rank must hold a whole share of.
fn split_heads(heads: u64, name: &str, cache: &Cache, what: &str) -> PlanResult<()> {
    if heads % cache.tp != 0 {
        bail!(
            "{what}: {heads} {name} do not split evenly over TP {}; use a TP size that divides \
             {heads} (runtimes that replicate them at higher TP are not planned yet)",
            cache.tp
        );
    }
    Ok(())
}

/// The conv state: `parts` channels, each holding `conv_kernel - 1` inputs of the model's dtype.
fn conv(
    parts: &[u64],
    groups: Option<&[u64]>,
    conv_kernel: u64,
    cache: &Cache,
) -> PlanResult<BufferLayout> {
    let what = "the conv state";
    if conv_kernel < 2 {
        bail!("{what}: conv_kernel={conv_kernel} keeps no inputs; it must be at least 2");
    }
    let unit = cache.dtype.bytes_of(conv_kernel - 1, what)?;
    grouped_state(parts, groups, unit, cache, what)
}

fn mamba2(m: &Mamba2Shape, cache: &Cache, out: &mut Vec<BufferLayout>) -> PlanResult<()> {
    let what = "the Mamba2 state";
    positive(
        &[
            ("heads", m.heads),
            ("head_dim", m.head_dim),
            ("state_size", m.state_size),
            ("groups", m.groups),
        ],
        what,
    )?;
    split_heads(m.heads, "heads", cache, what)?;
    if m.heads % m.groups != 0 {
        bail!(
            "{what}: {} heads do not split into n_groups={} groups (each group serves whole \
             heads)",
            m.heads,
            m.groups
        );
    }
    let ssm = cache
        .state
        .bytes_of(product(&[m.head_dim, m.state_size], what)?, what)?;
    out.push(state(&[m.heads], ssm, cache, what)?);
    let inner = product(&[m.heads, m.head_dim], what)?;
    let bc = product(&[m.groups, m.state_size], what)?;
    // x by heads, B and C by group: below n_groups TP ranks, vLLM and SGLang copy each group
    // onto the ranks of its heads (`extra_groups_for_head_shards`).
    let groups = [m.heads, m.groups, m.groups];
    out.push(conv(&[inner, bc, bc], Some(&groups), m.conv_kernel, cache)?);
    Ok(())
}

fn mamba1(m: &Mamba1Shape, cache: &Cache, out: &mut Vec<BufferLayout>) -> PlanResult<()> {
    let what = "the Mamba1 state";
    positive(
        &[("inner_size", m.inner_size), ("state_size", m.state_size)],
        what,
    )?;
    let ssm = cache.state.bytes_of(m.state_size, what)?;
    out.push(state(&[m.inner_size], ssm, cache, what)?);
    out.push(conv(&[m.inner_size], None, m.conv_kernel, cache)?);
    Ok(())
}

fn gated_deltanet(
    g: &GatedDeltaNetShape,
    cache: &Cache,
    out: &mut Vec<BufferLayout>,
) -> PlanResult<()> {
    let what = "the Gated DeltaNet state";
    positive(
        &[
            ("key_heads", g.key_heads),
            ("value_heads", g.value_heads),
            ("key_head_dim", g.key_head_dim),
            ("value_head_dim", g.value_head_dim),
        ],
        what,
    )?;
    split_heads(g.key_heads, "key heads", cache, what)?;
    split_heads(g.value_heads, "value heads", cache, what)?;
    let recurrent = cache
        .state
        .bytes_of(product(&[g.key_head_dim, g.value_head_dim], what)?, what)?;
    out.push(state(&[g.value_heads], recurrent, cache, what)?);
    let qk = product(&[g.key_heads, g.key_head_dim], what)?;
    let v = product(&[g.value_heads, g.value_head_dim], what)?;
    out.push(conv(&[qk, qk, v], None, g.conv_kernel, cache)?);
    Ok(())
}

/// A state of `[heads, head_dim, head_dim]` in the state dtype, sharded by heads.
fn square_state(heads: u64, head_dim: u64, cache: &Cache, what: &str) -> PlanResult<BufferLayout> {
    positive(&[("heads", heads), ("head_dim", head_dim)], what)?;
    split_heads(heads, "heads", cache, what)?;
    let unit = cache
        .state
        .bytes_of(product(&[head_dim, head_dim], what)?, what)?;
    state(&[heads], unit, cache, what)
}

fn kda(k: &KdaShape, cache: &Cache, out: &mut Vec<BufferLayout>) -> PlanResult<()> {
    let what = "the Kimi Delta Attention state";
    out.push(square_state(k.heads, k.head_dim, cache, what)?);
    let channels = product(&[k.heads, k.head_dim], what)?;
    for _ in ["q", "k", "v"] {
        out.push(conv(&[channels], None, k.conv_kernel, cache)?);
    }
    Ok(())
}

fn lightning(l: &LightningShape, cache: &Cache, out: &mut Vec<BufferLayout>) -> PlanResult<()> {
    out.push(square_state(
        l.heads,
        l.head_dim,
        cache,
        "the lightning attention state",
    )?);
    Ok(())
}
