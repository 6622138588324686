//! Readers of families whose layers all keep attention KV (or none): dense stacks, sliding and
//! chunked patterns, heterogeneous head counts, latent attention. Each says whose rule it is.

use serde_json::Value;

use super::{
    attention_shape, by_kind, heads_and_split, mla, named_kinds, uniform, window, AttentionKeys,
    HEADS, KV_HEADS, STANDARD,
};
use crate::error::{bail, quoted, PlanResult};
use crate::model::config::{as_u64, field, shown, Config};
use crate::model::layers::{AttentionShape, Layer, MlaShape};

/// `layer_types` of full and sliding attention of one shape, the window `sliding_window`.
pub(super) fn typed(
    c: &Config,
    count: u64,
    full: AttentionShape,
    types: &[Value],
) -> PlanResult<Vec<Layer>> {
    let sliding = || {
        let w = window(c, "sliding_window", "layer_types")?;
        Ok(Layer::Attention(full.sliding(Some(w))))
    };
    let kinds: [&dyn Fn() -> PlanResult<Layer>; 2] = [&|| Ok(Layer::Attention(full)), &sliding];
    let names = [("full_attention", 0), ("sliding_attention", 1)];
    by_kind(count, &kinds, named_kinds("layer_types", types, &names))
}

/// vLLM's `llama.py` (Llama, Mistral, Phi-3 and their derivatives): a layer is sliding where
/// `layer_types` says `"sliding_attention"`; without `layer_types`, a `sliding_window` applies
/// to every layer (vLLM's model-wide window).
pub fn llama(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    let full = attention_shape(c, STANDARD)?;
    if let Some(types) = c.layer_list("layer_types", count)? {
        return typed(c, count, full, types);
    }
    let window = c.u64("sliding_window")?.filter(|&w| w > 0);
    Ok(uniform(count, Layer::Attention(full.sliding(window))))
}

/// transformers' `Qwen2Config` (and `Qwen2Moe`, `Qwen3`, `Qwen3Moe`, the VL text configs):
/// `sliding_window` counts only with `use_sliding_window` (default false), and then layers
/// `i >= max_window_layers` (default 28) slide; `layer_types`, where given, decides instead.
pub fn qwen(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    let full = if qwen2_based(c)? {
        // vLLM's qwen2.py and qwen2_moe.py (the Qwen2 VL models' language model too) take
        // hidden_size / heads as the head size and never read head_dim.
        let _ = c.u64("head_dim")?;
        let (heads, split) = heads_and_split(c, STANDARD, "an attention layer")?;
        AttentionShape::full(c.u64("num_key_value_heads")?.unwrap_or(heads), split)
    } else {
        attention_shape(c, STANDARD)?
    };
    let use_window = c.bool("use_sliding_window")?.unwrap_or(false);
    let named_window = c.u64("sliding_window")?.filter(|&w| w > 0);
    let max_window_layers = c.u64("max_window_layers")?.unwrap_or(28);
    if let Some(types) = c.layer_list("layer_types", count)? {
        return typed(c, count, full, types);
    }
    let window = named_window.filter(|_| use_window);
    Ok((0..count)
        .map(|i| match window {
            Some(w) if i >= max_window_layers => Layer::Attention(full.sliding(Some(w))),
            _ => Layer::Attention(full),
        })
        .collect())
}

/// Whether the model runs on vLLM's Qwen2 attention (`qwen2.py`, `qwen2_moe.py`: every
/// `Qwen2*` architecture, the VL and audio models' language model too), by its architectures,
/// else its model type; Qwen3 reads `head_dim`.
fn qwen2_based(c: &Config) -> PlanResult<bool> {
    let architectures = c.parts.names("architectures")?;
    if !architectures.is_empty() {
        return Ok(architectures.iter().any(|a| a.starts_with("Qwen2")));
    }
    Ok(c.parts
        .names("model_type")?
        .iter()
        .any(|t| t.starts_with("qwen2")))
}

/// Every layer full attention as the standard keys name it (Gemma 1, Command R, `OLMo` 1/2/E,
/// GLM-4, EXAONE 3; their modeling code reads no window or pattern).
pub fn dense(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    Ok(uniform(
        count,
        Layer::Attention(attention_shape(c, STANDARD)?),
    ))
}

/// Full and sliding layers from `layer_types`, or else every `period`-th layer full and the
/// rest sliding (`(i + 1) % period != 0`): transformers' `Gemma2Config` (period 2),
/// `Gemma3TextConfig` (`sliding_window_pattern`, default 6) and `Cohere2Config` (default 4).
fn periodic(
    c: &Config,
    count: u64,
    default_period: u64,
    pattern_key: Option<&str>,
) -> PlanResult<Vec<Layer>> {
    let full = attention_shape(c, STANDARD)?;
    if let Some(types) = c.layer_list("layer_types", count)? {
        return typed(c, count, full, types);
    }
    let period = match pattern_key {
        Some(key) => c.positive(key)?.unwrap_or(default_period),
        None => default_period,
    };
    let sliding = || {
        let w = window(c, "sliding_window", "the layer pattern")?;
        Ok(Layer::Attention(full.sliding(Some(w))))
    };
    let kinds: [&dyn Fn() -> PlanResult<Layer>; 2] = [&|| Ok(Layer::Attention(full)), &sliding];
    by_kind(count, &kinds, |i| Ok(usize::from((i + 1) % period != 0)))
}

pub fn gemma2(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    periodic(c, count, 2, None)
}

/// Cohere 2 (Command R7B, Command A): `Cohere2Config`'s pattern, and a sliding layer sees
/// `[pos - sliding_window, pos]`, one token more than the window it names: vLLM's `commandr.py`
/// `CohereAttention` passes `sliding_window + 1` to the cache (and its eviction) for it.
pub fn cohere2(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    let layers = periodic(c, count, 4, Some("sliding_window_pattern"))?;
    layers
        .into_iter()
        .map(|layer| match layer {
            Layer::Attention(shape) => match shape.sliding_window {
                Some(w) => {
                    let Some(seen) = w.checked_add(1) else {
                        bail!("config.json: sliding_window {w} is too large");
                    };
                    Ok(Layer::Attention(shape.sliding(Some(seen))))
                }
                None => Ok(Layer::Attention(shape)),
            },
            other => Ok(other),
        })
        .collect()
}

/// `Olmo3Config` gives `layer_types`; pdplan reads them and refuses a config without them.
pub fn olmo3(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    if c.layer_list("layer_types", count)?.is_none() {
        bail!("config.json: an OLMo 3 config must list layer_types, which say where the sliding layers are");
    }
    llama(c, count)
}

/// The last `num_kv_shared_layers` layers keep no KV: each reads the last earlier layer of
/// its own type (vLLM's `gemma3n.py`/`gemma4.py` `kv_sharing_target_layer_name`).
fn share_tail(c: &Config, layers: &mut [Layer], types: &[&str]) -> PlanResult<()> {
    let Some(shared) = c.u64("num_kv_shared_layers")?.filter(|&n| n > 0) else {
        return Ok(());
    };
    let count = layers.len() as u64;
    if shared >= count {
        bail!("config.json: num_kv_shared_layers={shared} leaves none of the {count} layers its own KV");
    }
    let first = usize::try_from(count - shared).unwrap_or(usize::MAX);
    for i in first..layers.len() {
        let Some(source) = (0..first).rev().find(|&j| types[j] == types[i]) else {
            bail!(
                "config.json: layer {i} shares KV with an earlier {} layer, but the layers \
                 before {first} have none",
                types[i]
            );
        };
        layers[i] = Layer::SharedKv {
            source_layer: source as u64,
        };
    }
    Ok(())
}

/// The layer kinds of a Gemma 3n or 4 config: its `layer_types`, or transformers' default
/// (every sixth layer full, the last forced full: `Gemma4TextConfig.__post_init__`).
fn gemma_types(c: &Config, count: u64, last_full: bool) -> PlanResult<Vec<&'static str>> {
    if let Some(types) = c.layer_list("layer_types", count)? {
        return types
            .iter()
            .enumerate()
            .map(|(i, t)| match t.as_str() {
                Some("full_attention") => Ok("full_attention"),
                Some("sliding_attention") => Ok("sliding_attention"),
                _ => bail!("config.json: layer_types[{i}] is {t}; this family reads full_attention and sliding_attention"),
            })
            .collect();
    }
    if let Some(pattern) = c.u64("sliding_window_pattern")?.filter(|&p| p != 6) {
        bail!(
            "config.json: sliding_window_pattern={pattern}, but Gemma 3n/4 configs without \
             layer_types are read with every sixth layer global (transformers ignores the \
             pattern); list layer_types"
        );
    }
    let mut types: Vec<&str> = (0..count)
        .map(|i| {
            if (i + 1) % 6 == 0 {
                "full_attention"
            } else {
                "sliding_attention"
            }
        })
        .collect();
    if last_full {
        if let Some(last) = types.last_mut() {
            *last = "full_attention";
        }
    }
    Ok(types)
}

/// Gemma 3n (vLLM `gemma3n.py`): sliding and full layers of one shape, the last
/// `num_kv_shared_layers` reusing earlier layers' KV.
pub fn gemma3n(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    let types = gemma_types(c, count, false)?;
    let full = attention_shape(c, STANDARD)?;
    let sliding = full.sliding(Some(window(c, "sliding_window", "layer_types")?));
    let mut layers: Vec<Layer> = types
        .iter()
        .map(|t| {
            Layer::Attention(if *t == "full_attention" {
                full
            } else {
                sliding
            })
        })
        .collect();
    share_tail(c, &mut layers, &types)?;
    Ok(layers)
}

/// Gemma 4 (vLLM `gemma4.py` `Gemma4DecoderLayer`, transformers `Gemma4TextConfig`): sliding
/// layers use `head_dim` and `num_key_value_heads`; full layers `global_head_dim` and, where
/// `attention_k_eq_v` is set, `num_global_key_value_heads` (K is reused as V, but vLLM still
/// caches both); the last `num_kv_shared_layers` reuse earlier layers' KV.
pub fn gemma4(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    let types = gemma_types(c, count, true)?;
    let local = attention_shape(c, STANDARD)?;
    let sliding = local.sliding(Some(window(c, "sliding_window", "layer_types")?));
    let global = || -> PlanResult<AttentionShape> {
        let head_dim = c.require(&["global_head_dim"], "Gemma 4's full-attention layers")?;
        let k_eq_v = c.bool("attention_k_eq_v")?.unwrap_or(false);
        let kv_heads = match c.u64("num_global_key_value_heads")? {
            Some(heads) if k_eq_v => heads,
            _ => local.kv_heads,
        };
        Ok(AttentionShape::full(kv_heads, head_dim))
    };
    let global = if types.contains(&"full_attention") {
        Some(global()?)
    } else {
        None
    };
    let mut layers: Vec<Layer> = types
        .iter()
        .map(|t| match (*t, global) {
            ("full_attention", Some(g)) => Layer::Attention(g),
            _ => Layer::Attention(sliding),
        })
        .collect();
    share_tail(c, &mut layers, &types)?;
    Ok(layers)
}

/// EXAONE 4 (transformers `Exaone4Config`): `layer_types`, or `sliding_window_pattern` as a
/// string of `L` (local, sliding) and `G` (global) repeated over the layers, or a period
/// (`(i + 1) % period != 0` slides); no `sliding_window` means every layer is global.
pub fn exaone4(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    let full = attention_shape(c, STANDARD)?;
    if c.layer_list("layer_types", count)?.is_some() {
        return llama(c, count);
    }
    let Some(w) = c.u64("sliding_window")?.filter(|&w| w > 0) else {
        return Ok(uniform(count, Layer::Attention(full)));
    };
    let sliding = Layer::Attention(full.sliding(Some(w)));
    let key = "sliding_window_pattern";
    let slides: Box<dyn Fn(u64) -> PlanResult<bool>> = match c.get(key)? {
        None => {
            bail!("config.json: EXAONE 4 names a sliding_window but neither layer_types nor {key}")
        }
        Some(Value::String(text)) => {
            let chars: Vec<char> = text.chars().collect();
            if chars.is_empty() || chars.iter().any(|ch| !matches!(ch, 'L' | 'G')) {
                bail!(
                    "config.json: {key}={} must be letters L (local) and G (global)",
                    quoted(text)
                );
            }
            Box::new(move |i| Ok(chars[usize::try_from(i).unwrap_or(0) % chars.len()] == 'L'))
        }
        Some(value) => {
            let period = as_u64(value, key)?;
            if period == 0 {
                bail!("config.json: {key} must be positive");
            }
            Box::new(move |i| Ok((i + 1) % period != 0))
        }
    };
    (0..count)
        .map(|i| {
            Ok(if slides(i)? {
                sliding
            } else {
                Layer::Attention(full)
            })
        })
        .collect()
}

/// Every layer alike: `kv_heads(heads)` KV heads of `hidden / heads` dims, for the families
/// whose configs derive the head dim and name the KV heads their own way.
fn derived_heads(
    c: &Config,
    count: u64,
    keys: AttentionKeys,
    kv_heads: impl FnOnce(u64) -> PlanResult<u64>,
) -> PlanResult<Vec<Layer>> {
    let (heads, head_dim) = heads_and_split(c, keys, "an attention layer")?;
    let layer = AttentionShape::full(kv_heads(heads)?, head_dim);
    Ok(uniform(count, Layer::Attention(layer)))
}

/// `ChatGLM` (vLLM `chatglm.py` `GLMAttention`): `multi_query_group_num` KV heads when
/// `multi_query_attention`, else every head; the head dim `hidden_size / num_attention_heads`
/// (`kv_channels` states it).
pub fn chatglm(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    let keys = AttentionKeys {
        kv_heads: &[],
        head_dim: &[],
        ..STANDARD
    };
    let (_, head_dim) = heads_and_split(c, keys, "an attention layer")?;
    if let Some(channels) = c.u64("kv_channels")?.filter(|&k| k != head_dim) {
        bail!(
            "config.json: kv_channels={channels} but hidden_size / num_attention_heads is \
             {head_dim}"
        );
    }
    derived_heads(c, count, keys, |heads| {
        if c.bool("multi_query_attention")?.unwrap_or(false) {
            c.require(&["multi_query_group_num"], "multi-query attention")
        } else {
            Ok(heads)
        }
    })
}

/// MLA models' head counts and dims, which shape no cache: read (so their types are checked)
/// and set aside.
fn set_aside_mla_heads(c: &Config) -> PlanResult<()> {
    for key in [
        "num_key_value_heads",
        "qk_nope_head_dim",
        "v_head_dim",
        "head_dim",
    ] {
        let _ = c.u64(key)?;
    }
    Ok(())
}

/// `DeepSeek` V2/V3/V3.2 and Kimi K2 (vLLM `deepseek_v2.py`, MLA): one latent of
/// `kv_lora_rank` plus `qk_rope_head_dim` values a token, and V3.2's indexer keys; the head
/// counts and dims shape no cache (they are read and set aside).
pub fn deepseek(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    set_aside_mla_heads(c)?;
    let latent = mla(c, true)?;
    with_indexers(c, count, latent)
}

/// Each layer's latent, its indexer kept where vLLM keeps one (`models/deepseek_v32/
/// attention.py`, shared by `DeepSeek`-V3.2 and GLM-5): a layer `l` skips it (reading the top-k
/// of the layer before) where `index_topk_pattern[l]` is `"S"`, or, without a pattern, where
/// `max(l - index_skip_topk_offset + 1, 0) % index_topk_freq` is not 0 (offset 2 and frequency
/// 1 when omitted: no layer skips).
fn with_indexers(c: &Config, count: u64, latent: MlaShape) -> PlanResult<Vec<Layer>> {
    let freq = c.positive("index_topk_freq")?.unwrap_or(1);
    let offset = c.u64("index_skip_topk_offset")?.unwrap_or(2);
    let bad = |what: &str| -> PlanResult<Vec<char>> {
        bail!("config.json: index_topk_pattern holds {what}; vLLM reads 'F' (an indexer) or 'S' (skipped) a layer")
    };
    let pattern: Option<Vec<char>> = match c.get("index_topk_pattern")? {
        None => None,
        // A string of one letter a layer, or a list of one-letter strings (vLLM indexes both).
        Some(Value::String(text)) => Some(text.chars().collect()),
        Some(Value::Array(list)) => Some(
            list.iter()
                .map(|v| match v.as_str() {
                    Some(one) if one.chars().count() == 1 => Ok(one.chars().next().unwrap_or('F')),
                    _ => bad(&v.to_string()).map(|_| 'F'),
                })
                .collect::<PlanResult<_>>()?,
        ),
        Some(other) => bail!(
            "config.json: index_topk_pattern must be a string of 'F' and 'S', one a layer, got {}",
            shown(other)
        ),
    };
    if let Some(odd) = pattern.iter().flatten().find(|ch| !matches!(ch, 'F' | 'S')) {
        bad(&format!("{odd:?}"))?;
    }
    let skipped = |layer: u64| match &pattern {
        Some(chars) => usize::try_from(layer)
            .ok()
            .and_then(|i| chars.get(i))
            .is_some_and(|ch| *ch == 'S'),
        None => (layer + 1).saturating_sub(offset) % freq != 0,
    };
    Ok((0..count)
        .map(|layer| {
            let index_head_dim = if skipped(layer) {
                0
            } else {
                latent.index_head_dim
            };
            Layer::Mla(MlaShape {
                index_head_dim,
                ..latent
            })
        })
        .collect())
}

/// GLM-5 (vLLM runs `GlmMoeDsaForCausalLM` as `DeepSeek`-V3.2's model): MLA with an indexer,
/// `GlmMoeDsaConfig`'s defaults for what the file omits (`kv_lora_rank` 512,
/// `qk_rope_head_dim` 64, `index_head_dim` 128), layers skipping the indexer as V3.2's do.
pub fn glm_dsa(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    set_aside_mla_heads(c)?;
    let or = |key: &str, default: u64| -> PlanResult<u64> {
        Ok(match c.u64(key)? {
            Some(value) => value,
            None if c.names_key(key)? => 0,
            None => default,
        })
    };
    let kv_lora_rank = or("kv_lora_rank", 512)?;
    if kv_lora_rank == 0 {
        bail!("config.json: kv_lora_rank must be positive");
    }
    let latent = MlaShape {
        kv_lora_rank,
        rope_head_dim: or("qk_rope_head_dim", 64)?,
        index_head_dim: or("index_head_dim", 128)?,
    };
    with_indexers(c, count, latent)
}

/// `MiniMax`-M2 (vLLM `minimax_m2.py`): full attention on every layer; an `attn_type_list`, where
/// given, must say so (1 a layer).
pub fn minimax_m2(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    if let Some(list) = c.layer_list("attn_type_list", count)? {
        for (i, v) in list.iter().enumerate() {
            if as_u64(v, "attn_type_list")? != 1 {
                bail!("config.json: attn_type_list[{i}] is {}; MiniMax-M2 layers are full attention (1)", shown(v));
            }
        }
    }
    dense(c, count)
}

/// Falcon (vLLM `falcon.py` `FalconAttention`): `num_kv_heads` KV heads with the new decoder
/// architecture, one with `multi_query`, else every head; the head dim `hidden_size /
/// num_attention_heads`. The original `RefinedWeb` configs (`n_head`, `n_head_kv`, `n_embed`)
/// are read by vLLM's `RWConfig` (`transformers_utils/configs/falcon.py`), whose defaults
/// differ from transformers' `FalconConfig`: `n_head_kv` is 1 when absent (not every head),
/// and a `hidden_size` of 8192 forces the new decoder architecture ("Hack for falcon-40b").
pub fn falcon(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    let keys = AttentionKeys {
        heads: &["num_attention_heads", "n_head"],
        kv_heads: &[],
        head_dim: &[],
        hidden: &["hidden_size", "n_embed"],
    };
    let types = c.parts.names("model_type")?;
    let refined_web = types
        .iter()
        .any(|t| matches!(*t, "RefinedWeb" | "RefinedWebModel"));
    let hidden = c.first_u64(keys.hidden)?;
    derived_heads(c, count, keys, |heads| {
        let new_architecture = c.bool("new_decoder_architecture")?.unwrap_or(false)
            || (refined_web && hidden == Some(8192));
        Ok(if new_architecture {
            let unnamed = if refined_web { 1 } else { heads };
            c.first_u64(&["num_kv_heads", "n_head_kv"])?
                .unwrap_or(unnamed)
        } else if c.bool("multi_query")?.unwrap_or(true) {
            1
        } else {
            heads
        })
    })
}

/// GPT-BigCode and `StarCoder` (vLLM `gpt_bigcode.py` `GPTBigCodeAttention`): one KV head with
/// `multi_query` (the default), else every head; the head dim `n_embd / n_head`.
pub fn gpt_bigcode(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    let keys = AttentionKeys {
        heads: &["n_head", "num_attention_heads"],
        kv_heads: &[],
        head_dim: &[],
        hidden: &["n_embd", "hidden_size"],
    };
    derived_heads(c, count, keys, |heads| {
        Ok(if c.bool("multi_query")?.unwrap_or(true) {
            1
        } else {
            heads
        })
    })
}

/// Llama 4 (vLLM `llama4.py` `Llama4Attention`, transformers `Llama4TextConfig`): a layer with
/// `no_rope_layers[i] == 0` is a `NoPE` layer of full attention; the others are chunked local
/// attention of `attention_chunk_size` tokens (full where there is no chunk size). An empty
/// or absent `no_rope_layers` is transformers' default: every `no_rope_layer_interval`-th
/// layer (default 4) `NoPE`.
pub fn llama4(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    let full = attention_shape(c, STANDARD)?;
    let chunk = c.positive("attention_chunk_size")?;
    let interval = c.positive("no_rope_layer_interval")?.unwrap_or(4);
    let listed = c.list("no_rope_layers")?.filter(|l| !l.is_empty());
    let rope: Vec<bool> = match listed {
        Some(list) => {
            if list.len() as u64 != count {
                bail!(
                    "config.json: no_rope_layers lists {} layers but the model has {count}",
                    list.len()
                );
            }
            list.iter()
                .map(|v| Ok(as_u64(v, "no_rope_layers")? != 0))
                .collect::<PlanResult<_>>()?
        }
        None => (0..count).map(|i| (i + 1) % interval != 0).collect(),
    };
    let chunked = AttentionShape {
        attention_chunk: chunk,
        ..full
    };
    Ok(rope
        .into_iter()
        .map(|uses_rope| Layer::Attention(if uses_rope { chunked } else { full }))
        .collect())
}

/// `DeciLM` / Nemotron-NAS (vLLM `nemotron_nas.py` `DeciLMDecoderLayer`): each of
/// `block_configs` says its layer's attention: none (`no_op`), a linear map that keeps no KV
/// (`replace_with_linear`), or attention with `num_attention_heads / n_heads_in_group` KV
/// heads; the head dim `hidden_size / num_attention_heads` (or `head_dim`).
pub fn nemotron_nas(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    let _ = c.u64("num_key_value_heads")?; // null in published configs: heads are per block
    let Some(blocks) = c.layer_list("block_configs", count)? else {
        bail!("config.json: a Nemotron-NAS (DeciLM) config must list block_configs");
    };
    let heads = c.require(HEADS, "an attention layer")?;
    let head_dim = match c.u64("head_dim")? {
        Some(dim) => dim,
        None => heads_and_split(c, STANDARD, "an attention layer")?.1,
    };
    blocks
        .iter()
        .enumerate()
        .map(|(i, block)| {
            let path = format!("block_configs[{i}].attention");
            let Some(attention) = field(block, "attention", &format!("block_configs[{i}]"))? else {
                bail!("config.json: block_configs[{i}] has no attention");
            };
            let flag = |name: &str| -> PlanResult<bool> {
                match field(attention, name, &path)? {
                    None => Ok(false),
                    Some(Value::Bool(b)) => Ok(*b),
                    Some(other) => bail!("config.json: {path}.{name} must be true or false, got {}", shown(other)),
                }
            };
            for unread in ["window_length", "sparsify", "num_sink_tokens"] {
                if let Some(value) = field(attention, unread, &path)? {
                    bail!("config.json: {path}.{unread} is {}, an attention variant pdplan does not read; describe the layers with ModelShape(layer_kinds=...)", shown(value));
                }
            }
            if flag("no_op")? || flag("replace_with_linear")? {
                return Ok(Layer::Mlp);
            }
            let Some(group) = field(attention, "n_heads_in_group", &path)? else {
                bail!("config.json: {path} keeps attention but names no n_heads_in_group");
            };
            let group = as_u64(group, &format!("{path}.n_heads_in_group"))?;
            if group == 0 || heads % group != 0 {
                bail!("config.json: {path}.n_heads_in_group={group} does not divide num_attention_heads={heads}");
            }
            Ok(Layer::Attention(AttentionShape::full(heads / group, head_dim)))
        })
        .collect()
}

/// `MiMo`-V2-Flash (vLLM and `SGLang` `mimo_v2_flash.py`): `hybrid_layer_pattern[i] == 1` is a
/// sliding layer with the `swa_*` shapes and `sliding_window` (or `sliding_window_size`), 0 a
/// full layer; K head dims `head_dim`/`swa_head_dim`, V head dims `v_head_dim`/`swa_v_head_dim`.
pub fn mimo_v2(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    let Some(pattern) = c.layer_list("hybrid_layer_pattern", count)? else {
        bail!("config.json: a MiMo-V2 config must list hybrid_layer_pattern");
    };
    let what = "an attention layer";
    let full = AttentionShape {
        v_head_dim: c.u64("v_head_dim")?,
        ..AttentionShape::full(c.require(KV_HEADS, what)?, c.require(&["head_dim"], what)?)
    };
    let sliding = || -> PlanResult<Layer> {
        let w = match c.first_u64(&["sliding_window", "sliding_window_size"])? {
            Some(w) if w > 0 => w,
            _ => bail!("config.json: hybrid_layer_pattern names sliding layers but no positive sliding_window"),
        };
        let what = "a sliding-window layer";
        Ok(Layer::Attention(AttentionShape {
            v_head_dim: c.u64("swa_v_head_dim")?,
            sliding_window: Some(w),
            ..AttentionShape::full(
                c.require(&["swa_num_key_value_heads"], what)?,
                c.require(&["swa_head_dim"], what)?,
            )
        }))
    };
    let kinds: [&dyn Fn() -> PlanResult<Layer>; 2] = [&|| Ok(Layer::Attention(full)), &sliding];
    by_kind(count, &kinds, |i| {
        let v = &pattern[usize::try_from(i).unwrap_or(0)];
        match as_u64(v, "hybrid_layer_pattern")? {
            0 => Ok(0),
            1 => Ok(1),
            other => bail!(
                "config.json: hybrid_layer_pattern[{i}] is {other}; 0 is full attention, 1 sliding"
            ),
        }
    })
}
