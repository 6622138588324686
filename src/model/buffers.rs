//! Buffer layouts derived from a model's shape at one TP size.
//!
//! Buffer order: for each layer its K and V (or one replicated MLA latent buffer), then for
//! each Mamba layer its SSM state and (when the shape has one) its conv state, then each draft
//! layer's K and V. KV pages are head-major (HND) or token-major (NHD: a row per token).

use super::shape::{ConvShape, KvLayout, MambaShape, ModelShape};
use crate::error::{bail, PlanError, PlanResult};
use crate::layout::{
    BufferKind, BufferLayout, LogicalAxis, LogicalParts, MAX_STAGES, MAX_VALUE, MAX_WORLD_SIZE,
};
use crate::stages::is_staged;

/// Most layers of each kind a model may have: buffers are listed one by one.
const MAX_LAYERS: u64 = 1 << 16;

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

/// Both sides' buffers for `shape`: prefill at TP `prefill_tp` with `prefill_pp` stages, decode
/// likewise. With stages on either side every buffer names its layer (`tag_layers`).
pub fn pair_buffers(
    shape: &ModelShape,
    (prefill_tp, decode_tp): (u64, u64),
    (prefill_stages, decode_stages): (u64, u64),
    kv_layout: KvLayout,
) -> PlanResult<(Vec<BufferLayout>, Vec<BufferLayout>)> {
    for (name, pp) in [("prefill_pp", prefill_stages), ("decode_pp", decode_stages)] {
        if pp == 0 || pp > MAX_STAGES {
            bail!("{name}={pp} must be between 1 and {MAX_STAGES}");
        }
    }
    let side = |tp, role: &str| {
        model_buffers(shape, tp, kv_layout).map_err(|e| PlanError::new(format!("{role} side: {e}")))
    };
    let (mut prefill, mut decode) = (side(prefill_tp, "prefill")?, side(decode_tp, "decode")?);
    if is_staged(prefill_stages) || is_staged(decode_stages) {
        tag_layers(shape, &mut prefill);
        tag_layers(shape, &mut decode);
    }
    Ok((prefill, decode))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::shape::preset;

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
}
