//! A model read back per layer kind: which layers have each kind, and what each keeps, so a user
//! sees at a glance that a config was read right.

use super::deepseek_v4::{DeepseekV4Shape, Role};
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
    /// Tokens an entry of the kind's compressed caches covers (`DeepSeek`-V4); 1 without.
    pub compress_ratio: u64,
    /// Bytes one compressed entry takes in one such layer, its pages' padding shared out.
    pub entry_bytes: u64,
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
        let (token_bytes, state_bytes, (compress_ratio, entry_bytes)) =
            if let Layer::DeepseekV4(d) = layer {
                deepseek_v4_sizes(d, &cache)?
            } else {
                let mut buffers = Vec::new();
                layer.buffers(&cache, &mut buffers)?;
                let (token, state) = sizes(&buffers);
                (token, state, (1, 0))
            };
        let (sliding_window, attention_chunk) = match layer {
            Layer::Attention(a) | Layer::AttentionMamba2(a, _) => {
                (a.sliding_window, a.attention_chunk)
            }
            Layer::DeepseekV4(d) => (Some(d.sliding_window), None),
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
                compress_ratio,
                entry_bytes,
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
            compress_ratio: 1,
            entry_bytes: 0,
        });
    }
    Ok(out)
}

/// A `DeepSeek`-V4 layer's (bytes a token of its sliding latent, bytes of its compressor
/// states a request, (ratio, bytes a compressed entry)): the states are sliding windows of
/// raw tokens, kept whole; a compressed entry covers `ratio` tokens.
fn deepseek_v4_sizes(d: &DeepseekV4Shape, cache: &Cache) -> PlanResult<(u64, u64, (u64, u64))> {
    let (mut token, mut state, mut entry) = (0, 0, 0);
    for c in d.caches(cache.kv, cache.page_size)? {
        let share = c.page_stride / c.page_items;
        match (c.role, c.window) {
            (Role::CompressedLatent | Role::IndexerKeys, _) => entry += share,
            (Role::SlidingLatent, _) => token += share,
            (_, window) => state += share * window.unwrap_or(1),
        }
    }
    Ok((token, state, (d.compress_ratio, entry)))
}
