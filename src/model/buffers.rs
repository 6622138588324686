//! Buffer layouts derived from a model's shape at one TP size.
//!
//! Buffer order: each model layer's buffers in model order (`layers.rs` says which a kind
//! keeps), then each draft layer's K and V. Every buffer names its model layer; the draft
//! model's sit on the last layer (so the last stage), where speculative decoding runs them.
//! KV pages are head-major (HND) or token-major (NHD: a row per token).

use super::layers::{attention, AttentionShape, Cache, Layer};
use super::shape::{check_layer_count, KvLayout, ModelShape};
use crate::error::{PlanError, PlanResult};
use crate::layout::{BufferKind, BufferLayout, ContextParallel, ParallelLayout, Role};
use crate::limits;
use crate::pairs::validate_context;

/// Both sides' buffers for `shape`: prefill at TP `prefill_tp` with `prefill_pp` stages, decode
/// likewise.
pub fn pair_buffers(
    shape: &ModelShape,
    (prefill_tp, decode_tp): (u64, u64),
    (prefill_stages, decode_stages): (u64, u64),
    kv_layout: KvLayout,
    contexts: [ContextParallel; 2],
) -> PlanResult<(Vec<BufferLayout>, Vec<BufferLayout>)> {
    for (name, pp) in [("prefill_pp", prefill_stages), ("decode_pp", decode_stages)] {
        limits::STAGES.check(name, pp)?;
    }
    let side = |tp, role: Role, context| {
        let in_role = |e: PlanError| PlanError::new(format!("{} side: {e}", role.as_str()));
        let buffers = model_buffers(shape, tp, kv_layout).map_err(in_role)?;
        check_context(shape, role, (tp, context), &buffers)?;
        Ok::<_, PlanError>(buffers)
    };
    let [prefill, decode] = contexts;
    Ok((
        side(prefill_tp, Role::Prefill, prefill)?,
        side(decode_tp, Role::Decode, decode)?,
    ))
}

/// One side's buffers can be held with its context parallelism: the planner's rules, the
/// error naming the model layer.
fn check_context(
    shape: &ModelShape,
    role: Role,
    (tp, context): (u64, ContextParallel),
    buffers: &[BufferLayout],
) -> PlanResult<()> {
    if !context.is_active() {
        return Ok(());
    }
    let world = tp.saturating_mul(context.cp_size);
    let layout = ParallelLayout::with_context(role, (world, 1, 1), None, context)?;
    for buffer in buffers {
        validate_context(&layout, buffer).map_err(|e| {
            let layer = buffer.layer.unwrap_or(0);
            let label = usize::try_from(layer)
                .ok()
                .and_then(|at| shape.layers.get(at))
                .map_or_else(|| "?".to_owned(), Layer::label);
            PlanError::new(format!("layer {layer} ({label}): {e}"))
        })?;
    }
    Ok(())
}

/// The buffers one side (TP size `tp`) holds for `shape`, in the documented order.
pub fn model_buffers(
    shape: &ModelShape,
    tp: u64,
    kv_layout: KvLayout,
) -> PlanResult<Vec<BufferLayout>> {
    limits::WORLD_SIZE.check("tp_size", tp)?;
    limits::PAGE_SIZE.check("page_size", shape.page_size)?;
    check_layer_count(shape.layers.len() as u64)?;
    shape.check_dtypes()?;
    let cache = Cache {
        dtype: shape.dtype,
        kv: shape.kv_dtype(),
        state: shape.state_dtype(),
        page_size: shape.page_size,
        rows: kv_layout.rows(shape.page_size),
        tp,
    };
    let mut out = Vec::new();
    let named = |out: &mut Vec<BufferLayout>, from: usize, layer: u64| {
        for buffer in &mut out[from..] {
            buffer.layer = Some(layer);
        }
    };
    for (layer, kind) in (0u64..).zip(&shape.layers) {
        let from = out.len();
        kind.buffers(&cache, &mut out)
            .map_err(|e| PlanError::new(format!("layer {layer} ({}): {e}", kind.label())))?;
        named(&mut out, from, layer);
    }
    if let Some(draft) = shape.draft {
        check_layer_count(draft.layers)?;
        let from = out.len();
        let layer = AttentionShape::full(draft.kv_heads, draft.head_dim);
        for _ in 0..draft.layers {
            attention(
                &layer,
                &cache,
                (BufferKind::DraftK, BufferKind::DraftV),
                &mut out,
            )
            .map_err(|e| PlanError::new(format!("the draft model: {e}")))?;
        }
        named(
            &mut out,
            from,
            (shape.layers.len() as u64).saturating_sub(1),
        );
    }
    for (index, buffer) in (0u64..).zip(&mut out) {
        buffer.buffer_index = index;
        buffer.validate()?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::LogicalAxis;
    use crate::model::dtype::Dtype;
    use crate::model::preset;

    #[test]
    fn llama_70b_tp8_holds_one_head_per_rank_and_tp16_replicates() {
        let shape = preset("llama-3-70b", 16).unwrap();
        let tp8 = model_buffers(&shape, 8, KvLayout::Hnd).unwrap();
        assert_eq!(tp8.len(), 160);
        assert_eq!(tp8[0].item_stride_bytes, 16 * 128 * 2);
        assert_eq!(tp8[1].buffer_kind, BufferKind::TargetV);
        assert_eq!((tp8[2].layer, tp8[159].layer), (Some(1), Some(79)));
        let tp16 = model_buffers(&shape, 16, KvLayout::Hnd).unwrap();
        assert_eq!(tp16[0].tp_replica_group_size, 2);
        assert!(model_buffers(&shape, 3, KvLayout::Hnd).is_err());
        assert!(model_buffers(&shape, 12, KvLayout::Hnd)
            .unwrap_err()
            .message()
            .contains("multiple"));
    }

    #[test]
    fn hybrid_buffers_follow_the_layers_in_order() {
        let mla = model_buffers(&preset("deepseek-v3", 64).unwrap(), 8, KvLayout::Hnd).unwrap();
        assert_eq!(mla.len(), 61);
        assert_eq!(mla[0].logical_axis, LogicalAxis::Replicated);
        assert_eq!(mla[0].item_stride_bytes, 64 * 576 * 2);
        // Nemotron-H 8B: M - M - M - M * ...: layer 0 Mamba2 (SSM, conv), layer 7 attention.
        let hybrid =
            model_buffers(&preset("nemotron-h-8b", 16).unwrap(), 4, KvLayout::Hnd).unwrap();
        assert_eq!(
            (hybrid[0].layer, hybrid[1].layer, hybrid[2].layer),
            (Some(0), Some(0), Some(2))
        );
        assert_eq!(hybrid[1].logical_parts.given(), &[8192, 1024, 1024]);
        assert_eq!(hybrid[1].item_stride_bytes, (8192 + 2048) / 4 * 3 * 2);
        let attention: Vec<u64> = hybrid
            .iter()
            .filter(|b| b.buffer_kind == BufferKind::TargetK)
            .filter_map(|b| b.layer)
            .collect();
        assert_eq!(attention, vec![7, 18, 29, 40]);
        let eagle =
            model_buffers(&preset("llama-3-70b-eagle", 16).unwrap(), 2, KvLayout::Nhd).unwrap();
        assert_eq!(eagle[0].rows_per_page, 16);
        let last = eagle.last().unwrap();
        assert_eq!(
            (last.buffer_kind, last.layer, eagle.len()),
            (BufferKind::DraftV, Some(79), 162)
        );
    }

    #[test]
    fn cache_dtypes_size_values_in_bits() {
        let mut shape = preset("llama-3-8b", 16).unwrap();
        shape.kv_cache_dtype = Some(Dtype::Nvfp4);
        let buffers = model_buffers(&shape, 2, KvLayout::Hnd).unwrap();
        // K, V (64 bytes a head and token), then their scales (8 a head and token).
        assert_eq!(buffers.len(), 4 * 32);
        let units: Vec<u64> = buffers[..4]
            .iter()
            .map(|b| b.bytes_per_logical_unit)
            .collect();
        assert_eq!(units, vec![16 * 64, 16 * 64, 16 * 8, 16 * 8]);
        shape.layers[0] = Layer::Attention(AttentionShape::full(8, 24));
        let err = model_buffers(&shape, 2, KvLayout::Hnd).unwrap_err();
        assert!(
            err.message().contains("layer 0") && err.message().contains("scale blocks"),
            "{err}"
        );
        let mut ds = preset("deepseek-v3.2", 64).unwrap();
        ds.kv_cache_dtype = Some(Dtype::Float8E4M3Fn);
        let buffers = model_buffers(&ds, 8, KvLayout::Hnd).unwrap();
        assert_eq!(buffers[0].bytes_per_logical_unit, 64 * 656);
        assert_eq!(buffers[1].bytes_per_logical_unit, 64 * 132);
    }
}
