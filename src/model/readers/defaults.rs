//! Readers whose rule is a config class's defaults: what transformers fills in for keys a
//! published file omits (Mistral's window, ERNIE's KV heads), and the families vLLM 0.32 runs
//! through its Transformers backend, whose layers are the config object's, defaults included.

use super::attention::typed;
use super::{by_kind, heads_and_split, named_kinds, uniform, window, HEADS, STANDARD};
use crate::error::{bail, PlanError, PlanResult};
use crate::model::config::{as_u64, field, shown, Config};
use crate::model::layers::{AttentionShape, Layer};
use serde_json::Value;

/// vLLM 0.32 runs these families through its Transformers backend (`models/registry.py`
/// `_TRANSFORMERS_SUPPORTED_MODELS`; `models/transformers/base.py`
/// `_create_attention_instances`): every layer an `Attention` of the config's KV heads and
/// head size (`head_dim`, else `hidden_size / heads`: `model_arch_config_convertor.py`
/// `get_head_size`), sliding where `layer_types` says `sliding_attention`, else by the
/// model-wide `sliding_window` (`engine/arg_utils.py`, `CacheConfig.sliding_window`). Keys the
/// file omits take the config class's defaults.
fn backend(c: &Config, count: u64, omitted: Omitted) -> PlanResult<(AttentionShape, Vec<Layer>)> {
    let (full, window) = with_defaults(c, omitted)?;
    if let Some(types) = c.layer_list("layer_types", count)? {
        return Ok((full, typed(c, count, full, types)?));
    }
    Ok((full, uniform(count, Layer::Attention(full.sliding(window)))))
}

/// Phi-1 and Phi-2 (transformers `PhiConfig`: KV heads default to the query heads, no
/// `head_dim`), through vLLM's Transformers backend.
pub fn phi(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    Ok(backend(c, count, Omitted::default())?.1)
}

/// Seed-OSS (transformers `SeedOssConfig`: `num_key_value_heads` 8 and `head_dim` 128 when
/// absent), through vLLM's Transformers backend.
pub fn seed_oss(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    let omitted = Omitted {
        kv_heads: Some(8),
        head_dim: Some(128),
        ..Omitted::default()
    };
    Ok(backend(c, count, omitted)?.1)
}

/// `StarCoder2` (transformers `Starcoder2Config`: `num_key_value_heads` 2 when absent; a
/// `sliding_window` applies to every layer), through vLLM's Transformers backend.
pub fn starcoder2(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    let omitted = Omitted {
        kv_heads: Some(2),
        ..Omitted::default()
    };
    Ok(backend(c, count, omitted)?.1)
}

/// `SmolLM3` (transformers `SmolLM3Config.__post_init__`): `num_key_value_heads` 4 when absent;
/// without `layer_types`, a layer slides where `use_sliding_window`, a `sliding_window` and
/// `no_rope_layers[i] == 0` (default: every `no_rope_layer_interval`-th layer, 4) all hold.
/// Through vLLM's Transformers backend, which slides where `layer_types` says so.
pub fn smollm3(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    let omitted = Omitted {
        kv_heads: Some(4),
        ..Omitted::default()
    };
    if c.has("layer_types")? {
        return Ok(backend(c, count, omitted)?.1);
    }
    let (full, _) = backend(c, count, omitted)?;
    let interval = c.positive("no_rope_layer_interval")?.unwrap_or(4);
    let rope: Vec<bool> = match c.layer_list("no_rope_layers", count)? {
        Some(list) => list
            .iter()
            .map(|v| Ok(as_u64(v, "no_rope_layers")? != 0))
            .collect::<PlanResult<_>>()?,
        None => (0..count).map(|i| (i + 1) % interval != 0).collect(),
    };
    let window = c.u64("sliding_window")?;
    let sliding = c.bool("use_sliding_window")?.unwrap_or(false) && window.is_some();
    rope.iter()
        .map(|&has_rope| {
            if sliding && !has_rope {
                let w = self::window(c, "sliding_window", "use_sliding_window")?;
                Ok(Layer::Attention(full.sliding(Some(w))))
            } else {
                Ok(Layer::Attention(full))
            }
        })
        .collect()
}

/// Hunyuan dense and `MoE` V1 (transformers `HunYuanDenseV1Config`, `HunYuanMoEV1Config`; the
/// remote-code `HunYuanConfig`), through vLLM's Transformers backend: KV heads default to the
/// query heads, the head size is `head_dim` or `hidden_size / heads`, and an
/// `attention_head_dim` must agree with it. Cross-layer attention (`use_cla`) is refused: no
/// runtime serves it (the Transformers classes have none; `SGLang`'s `HunYuanModel.forward`
/// hands its cross layers no KV).
pub fn hunyuan(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    if c.bool("use_cla")?.unwrap_or(false) {
        let factor = c.u64("cla_share_factor")?.unwrap_or(1);
        bail!(
            "config.json: use_cla is true (cross-layer attention, cla_share_factor {factor}): \
             no runtime serves it (vLLM 0.32 runs Hunyuan through its Transformers backend, \
             whose HunYuan classes have no cross-layer attention; SGLang's hunyuan.py passes \
             its cross layers no KV); describe the layers with ModelShape(layer_kinds=...)"
        );
    }
    let _ = c.u64("cla_share_factor")?; // read with use_cla only
    let (full, layers) = backend(c, count, Omitted::default())?;
    if let Some(named) = c.u64("attention_head_dim")? {
        if named != full.head_dim {
            bail!(
                "config.json: attention_head_dim {named} differs from the head size vLLM \
                 allocates ({}: head_dim, else hidden_size / num_attention_heads)",
                full.head_dim
            );
        }
    }
    Ok(layers)
}

/// What a config class fills in for keys a file omits (a `null` in the file is not omitted:
/// KV heads then default to the query heads, the head dim to `hidden_size / heads`, the window
/// to none).
#[derive(Clone, Copy, Default)]
pub struct Omitted {
    pub heads: Option<u64>,
    pub kv_heads: Option<u64>,
    pub head_dim: Option<u64>,
    pub window: Option<u64>,
}

/// The attention shape, then the window, with `omitted`'s defaults for keys the file lacks.
fn with_defaults(c: &Config, omitted: Omitted) -> PlanResult<(AttentionShape, Option<u64>)> {
    let what = "an attention layer";
    let heads = match omitted.heads {
        Some(heads) if !c.names_key(HEADS[0])? => heads,
        _ => c.require(HEADS, what)?,
    };
    let kv = match c.u64("num_key_value_heads")? {
        Some(kv) => kv,
        None if c.names_key("num_key_value_heads")? => heads,
        None => omitted.kv_heads.unwrap_or(heads),
    };
    let dim = match c.u64("head_dim")?.filter(|&d| d > 0) {
        Some(dim) => dim,
        None => match omitted.head_dim {
            Some(dim) if !c.names_key("head_dim")? => dim,
            _ => heads_and_split(c, STANDARD, what)?.1,
        },
    };
    let window = match c.u64("sliding_window")? {
        Some(w) => Some(w).filter(|&w| w > 0), // vLLM's config/model.py: 0 is no window
        None if c.names_key("sliding_window")? => None,
        None => omitted.window,
    };
    Ok((AttentionShape::full(kv, dim), window))
}

/// Each layer full or sliding (`window`): as `layer_types` names it, else as `otherwise` says
/// of layer `i` (1: sliding).
fn full_or_sliding(
    c: &Config,
    count: u64,
    (full, window): (AttentionShape, Option<u64>),
    otherwise: impl Fn(u64) -> PlanResult<usize>,
) -> PlanResult<Vec<Layer>> {
    let sliding = || match window {
        Some(w) => Ok(Layer::Attention(full.sliding(Some(w)))),
        None => bail!("config.json: the layers name sliding layers but no positive sliding_window"),
    };
    let kinds: [&dyn Fn() -> PlanResult<Layer>; 2] = [&|| Ok(Layer::Attention(full)), &sliding];
    if let Some(types) = c.layer_list("layer_types", count)? {
        let names = [("full_attention", 0), ("sliding_attention", 1)];
        return by_kind(count, &kinds, named_kinds("layer_types", types, &names));
    }
    by_kind(count, &kinds, otherwise)
}

/// vLLM's `llama.py` rule (a layer slides where `layer_types` says `sliding_attention`, else
/// every layer by the model-wide window) over a config class's defaults.
fn llama_defaults(c: &Config, count: u64, omitted: Omitted) -> PlanResult<Vec<Layer>> {
    let (full, window) = with_defaults(c, omitted)?;
    let every = usize::from(window.is_some());
    full_or_sliding(c, count, (full, window), |_| Ok(every))
}

/// Mistral, Mixtral, Ministral 3 and the Mistral 3 wrappers (vLLM `mistral.py` on `llama.py`'s
/// rule; `mistral3.py` reads `text_config`): transformers' `MistralConfig` gives 8 KV heads and
/// a 4,096-token window to every layer when the file omits them, `MixtralConfig` and
/// `Ministral3Config` 8 KV heads and no window (`Ministral3Config` a head dim of 128).
pub fn mistral(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    let model_type = c.parts.text.get("model_type").and_then(|v| v.as_str());
    let omitted = match model_type {
        Some("mixtral") => Omitted {
            kv_heads: Some(8),
            ..Omitted::default()
        },
        Some("ministral3") => Omitted {
            kv_heads: Some(8),
            head_dim: Some(128),
            ..Omitted::default()
        },
        // MistralConfig's, also for a Mistral 3 text_config that names no model_type.
        _ => Omitted {
            kv_heads: Some(8),
            window: Some(4096),
            ..Omitted::default()
        },
    };
    llama_defaults(c, count, omitted)
}

/// ERNIE 4.5: the dense model runs on vLLM's `llama.py` rule with `Ernie4_5Config`'s defaults
/// (2 KV heads, head dim 128 when omitted); the `MoE` (`ernie45_moe.py`) reads
/// `num_key_value_heads` as given (`Ernie4_5_MoeConfig`: 4 when omitted) and `head_dim` or
/// `hidden_size / heads`, with only a model-wide window.
pub fn ernie45(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    let moe = c
        .parts
        .names("architectures")?
        .contains(&"Ernie4_5_MoeForCausalLM");
    if !moe {
        let omitted = Omitted {
            kv_heads: Some(2),
            head_dim: Some(128),
            ..Omitted::default()
        };
        return llama_defaults(c, count, omitted);
    }
    if c.names_key("num_key_value_heads")? && c.u64("num_key_value_heads")?.is_none() {
        bail!("config.json: num_key_value_heads is null; vLLM's ernie45_moe.py reads it as given (name the KV heads)");
    }
    if c.has("layer_types")? {
        bail!("config.json: ERNIE 4.5 MoE layers take no layer_types in vLLM's ernie45_moe.py; drop the key or describe the layers with ModelShape(layer_kinds=...)");
    }
    let (full, window) = with_defaults(
        c,
        Omitted {
            kv_heads: Some(4),
            ..Omitted::default()
        },
    )?;
    Ok(uniform(count, Layer::Attention(full.sliding(window))))
}

/// Voxtral (vLLM `voxtral.py`; its audio encoder keeps no paged cache): the `text_config`
/// language model on `llama.py`'s rule, with `VoxtralConfig`'s text defaults (8 KV heads,
/// head dim 128) for keys it omits.
pub fn voxtral(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    llama_defaults(
        c,
        count,
        Omitted {
            kv_heads: Some(8),
            head_dim: Some(128),
            ..Omitted::default()
        },
    )
}

/// dots.llm1 (vLLM 0.32 runs it through its Transformers backend): `Dots1Config` gives 32 KV
/// heads when omitted, and without `layer_types` a layer slides where a `sliding_window`
/// (4,096 when omitted) is set and `i >= max_window_layers` (62 when omitted).
pub fn dots1(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    let omitted = Omitted {
        kv_heads: Some(32),
        window: Some(4096),
        ..Omitted::default()
    };
    if c.has("layer_types")? {
        return llama_defaults(c, count, omitted);
    }
    let (full, window) = with_defaults(c, omitted)?;
    let first = c.u64("max_window_layers")?.unwrap_or(62);
    Ok((0..count)
        .map(|i| match window {
            Some(w) if i >= first => Layer::Attention(full.sliding(Some(w))),
            _ => Layer::Attention(full),
        })
        .collect())
}

/// Step-3's language model (vLLM `step3_text.py`): one KV head on every layer, replicated over
/// TP, of `head_dim` (256 when omitted); any other `num_attention_groups` is refused by vLLM.
pub fn step3(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    if let Some(groups) = c.u64("num_attention_groups")? {
        if groups != 1 {
            bail!("config.json: num_attention_groups is {groups}; vLLM's step3_text.py serves one KV head (1)");
        }
    }
    let dim = match c.u64("head_dim")? {
        Some(dim) => dim,
        None if c.names_key("head_dim")? => heads_and_split(c, STANDARD, "an attention layer")?.1,
        None => 256,
    };
    Ok(uniform(
        count,
        Layer::Attention(AttentionShape::full(1, dim)),
    ))
}

/// Gemma 3 (vLLM `gemma3.py` and `gemma3_mm.py`, which read the `text_config`): a layer
/// slides unless `(i + 1) % sliding_window_pattern` is 0 (6 when omitted), or as `layer_types`
/// says; `Gemma3TextConfig` gives 8 heads, 4 KV heads, a head dim of 256 and a 4,096-token
/// window to a file that omits them (the published gemma-3-4b-it names none of its heads).
pub fn gemma3(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    let omitted = Omitted {
        heads: Some(8),
        kv_heads: Some(4),
        head_dim: Some(256),
        window: Some(4096),
    };
    let shape = with_defaults(c, omitted)?;
    let period = c.positive("sliding_window_pattern")?.unwrap_or(6);
    full_or_sliding(c, count, shape, |i| Ok(usize::from((i + 1) % period != 0)))
}

/// Step-3.5 (vLLM `step3p5.py` `Step3p5DecoderLayer`, `Step3p5Attention`; `Step3p5Config`'s
/// defaults: 40 heads, 8 KV groups): a layer whose `layer_types` entry is
/// `attention_other_setting["attention_type"]` takes that setting's heads, groups and head
/// dim; a layer slides where `layer_types` says `sliding_attention` (every even layer without
/// the list), by `sliding_window`; the head dim is `head_dim`, else `hidden_size / heads`. The
/// list may run past the layers (the checkpoint's MTP layers): the config class cuts it.
pub fn step3p5(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    if let Some(kind) = c.get("att_impl_type")?.filter(|v| !v.is_null()) {
        if kind.as_str() != Some("GQA") {
            bail!("config.json: att_impl_type is {kind}; vLLM's step3p5.py serves \"GQA\" only");
        }
    }
    let types: Vec<&str> = match c.list("layer_types")? {
        None => Vec::new(),
        Some(list) => {
            if !list.is_empty() && (list.len() as u64) < count {
                bail!(
                    "config.json: layer_types lists {} layers but the model has {count}",
                    list.len()
                );
            }
            list.iter()
                .take(usize::try_from(count).unwrap_or(usize::MAX))
                .map(|v| {
                    v.as_str().ok_or_else(|| {
                        PlanError::new(format!(
                            "config.json: layer_types entries must be strings, got {v}"
                        ))
                    })
                })
                .collect::<PlanResult<_>>()?
        }
    };
    let other = c.get("attention_other_setting")?;
    let other_type = match other {
        Some(setting) => match field(setting, "attention_type", "attention_other_setting")? {
            Some(Value::String(name)) => Some(name.as_str()),
            _ if types.is_empty() => None,
            _ => bail!("config.json: attention_other_setting names no attention_type (vLLM's step3p5.py needs it beside layer_types)"),
        },
        None => None,
    };
    let sized = |key: &str, default: Option<u64>, other_applies: bool| -> PlanResult<Option<u64>> {
        if other_applies {
            if let Some(setting) = other {
                let path = format!("attention_other_setting.{key}");
                if let Some(value) = field(setting, key, &path)? {
                    let value = as_u64(value, &path)?;
                    if value > 0 {
                        return Ok(Some(value));
                    }
                }
            }
        }
        Ok(c.u64(key)?.filter(|&v| v > 0).or(default))
    };
    let window = c.u64("sliding_window")?.filter(|&w| w > 0);
    let hidden = c.u64("hidden_size")?;
    (0..count)
        .map(|layer| {
            let kind = usize::try_from(layer).ok().and_then(|i| types.get(i)).copied();
            let applies = kind.is_some() && kind == other_type;
            let heads = sized("num_attention_heads", Some(40), applies)?.unwrap_or(40);
            let kv = sized("num_attention_groups", Some(8), applies)?.unwrap_or(8);
            let dim = match sized("head_dim", None, applies)? {
                Some(dim) => dim,
                None => match hidden {
                    Some(h) if heads > 0 && h % heads == 0 => h / heads,
                    _ => bail!("config.json: Step-3.5 layer {layer} has no head_dim and hidden_size is not a multiple of its {heads} heads"),
                },
            };
            let sliding = match kind {
                Some(name) => name == "sliding_attention",
                None => layer % 2 == 0,
            };
            let full = AttentionShape::full(kv, dim);
            Ok(Layer::Attention(if sliding { full.sliding(window) } else { full }))
        })
        .collect()
}

/// `MiniMax`-M3 (vLLM `models/minimax_m3/nvidia/model.py`; `MiniMaxM3TextConfig`'s defaults: 4
/// KV heads of 128, the first 3 of 60 layers dense): every layer keeps K and V of
/// `num_key_value_heads` x `head_dim`; a layer whose `sparse_attention_freq` entry is not 0
/// also keeps index keys of `sparse_index_dim` (`MiniMaxM3IndexerCache`, one head, bf16).
/// Layers past the list are dense.
pub fn minimax_m3(c: &Config, count: u64) -> PlanResult<Vec<Layer>> {
    let full = AttentionShape::full(
        c.u64("num_key_value_heads")?.unwrap_or(4),
        c.u64("head_dim")?.unwrap_or(128),
    );
    let path = "sparse_attention_config";
    // vLLM's _sparse_attention_layer_ids: no config, an empty one or no sparse_attention_freq
    // is no sparse layer; a config the file omits is MiniMaxM3TextConfig's default.
    let (setting, sparse): (Option<&Value>, Vec<bool>) = match c.get(path)? {
        None => (None, (0..count).map(|i| (3..60).contains(&i)).collect()),
        Some(setting) => {
            let freq = match field(setting, "sparse_attention_freq", path)? {
                None => Vec::new(),
                Some(Value::Array(list)) => list
                    .iter()
                    .map(|v| Ok(as_u64(v, "sparse_attention_config.sparse_attention_freq")? != 0))
                    .collect::<PlanResult<_>>()?,
                Some(other) => bail!("config.json: sparse_attention_config.sparse_attention_freq must be a list, got {}", shown(other)),
            };
            (Some(setting), freq)
        }
    };
    let any_sparse = sparse
        .iter()
        .take(usize::try_from(count).unwrap_or(usize::MAX))
        .any(|&s| s);
    let index_dim = match setting {
        _ if !any_sparse => 0,
        None => 128,
        Some(setting) => match field(setting, "sparse_index_dim", path)? {
            Some(v) => as_u64(v, "sparse_attention_config.sparse_index_dim")?,
            None => bail!(
                "config.json: sparse_attention_config names sparse layers but no sparse_index_dim"
            ),
        },
    };
    if any_sparse && index_dim == 0 {
        bail!("config.json: sparse_attention_config.sparse_index_dim must be positive");
    }
    Ok((0..count)
        .map(|layer| {
            let is_sparse = usize::try_from(layer).ok().and_then(|i| sparse.get(i)) == Some(&true);
            Layer::Attention(AttentionShape {
                index_head_dim: if is_sparse { index_dim } else { 0 },
                ..full
            })
        })
        .collect())
}
