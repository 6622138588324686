//! A model read back per layer kind: which layers have each kind, and what each keeps, so a user
//! sees at a glance that a config was read right.

use super::layers::{attention, AttentionShape, Cache, Layer};
use super::shape::{KvLayout, ModelShape};
use crate::error::PlanResult;
use crate::layout::{BufferKind, BufferLayout};

/// One kind of layer in a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KindSummary {
    pub label: String,
    /// The layers of this kind, ascending.
    pub layers: Vec<u64>,
    /// Bytes one token takes in one such layer, over all TP ranks (0 for layers without a KV
    /// cache).
    pub token_bytes: u64,
    /// Bytes of state one request keeps in one such layer, over all TP ranks.
    pub state_bytes: u64,
    pub sliding_window: Option<u64>,
    pub attention_chunk: Option<u64>,
}

/// Bytes a token and bytes of state of `buffers` as one TP rank holds them at TP 1.
fn sizes(buffers: &[BufferLayout]) -> (u64, u64) {
    buffers.iter().fold((0, 0), |(token, state), b| {
        if b.logical_axis.is_token_indexed() {
            (token + b.item_stride_bytes / b.page_size, state)
        } else {
            (token, state + b.item_stride_bytes)
        }
    })
}

/// The model's layer kinds in the order they first appear, then the draft model's layers.
pub fn summarize(shape: &ModelShape) -> PlanResult<Vec<KindSummary>> {
    shape.check_dtypes()?;
    let cache = Cache {
        dtype: shape.dtype,
        kv: shape.kv_dtype(),
        state: shape.state_dtype(),
        page_size: shape.page_size,
        rows: KvLayout::Hnd.rows(shape.page_size),
        tp: 1,
    };
    let mut kinds: Vec<(Layer, KindSummary)> = Vec::new();
    for (index, layer) in (0u64..).zip(&shape.layers) {
        if let Some((_, summary)) = kinds.iter_mut().find(|(l, _)| l == layer) {
            summary.layers.push(index);
            continue;
        }
        let mut buffers = Vec::new();
        layer.buffers(&cache, &mut buffers)?;
        let (token_bytes, state_bytes) = sizes(&buffers);
        let (sliding_window, attention_chunk) = match layer {
            Layer::Attention(a) | Layer::AttentionMamba2(a, _) => {
                (a.sliding_window, a.attention_chunk)
            }
            _ => (None, None),
        };
        kinds.push((
            *layer,
            KindSummary {
                label: layer.label(),
                layers: vec![index],
                token_bytes,
                state_bytes,
                sliding_window,
                attention_chunk,
            },
        ));
    }
    let mut out: Vec<KindSummary> = kinds.into_iter().map(|(_, s)| s).collect();
    if let Some(draft) = shape.draft.filter(|d| d.layers > 0) {
        let mut buffers = Vec::new();
        let layer = AttentionShape::full(draft.kv_heads, draft.head_dim);
        attention(
            &layer,
            &cache,
            (BufferKind::DraftK, BufferKind::DraftV),
            &mut buffers,
        )?;
        let last = (shape.layers.len() as u64).saturating_sub(1);
        out.push(KindSummary {
            label: format!("draft attention ({} layers, on layer {last})", draft.layers),
            layers: vec![last],
            token_bytes: sizes(&buffers).0 * draft.layers,
            state_bytes: 0,
            sliding_window: None,
            attention_chunk: None,
        });
    }
    Ok(out)
}
