//! A model's layers from a Hugging Face `config.json`, read locally (nothing is fetched).
//!
//! The layer pattern comes from the first of these a config holds (README: "Reading configs"):
//! `hybrid_override_pattern` (Nemotron-H), `layer_types` (gpt-oss, Qwen3-Next, newer Gemma),
//! `full_attention_interval` (Qwen3-Next), `attn_layer_period`/`attn_layer_offset` (Jamba),
//! Falcon-H1's parallel layers, Gemma's default patterns, then a uniform stack (every layer
//! sliding when the config names a window that is in use). Pure Mamba2 and Mamba configs have
//! no attention at all. A pattern key or layer kind pdplan does not read is refused by name.

use serde_json::Value;

use super::dtype::Dtype;
use super::layers::{
    AttentionShape, GatedDeltaNetShape, Layer, Mamba1Shape, Mamba2Shape, MlaShape,
};
use super::shape::{check_layer_count, check_page_size, ModelShape};
use crate::error::{bail, PlanError, PlanResult};

/// Largest `config.json` read (published ones are a few kB).
const MAX_CONFIG_BYTES: usize = 16 << 20;

/// Keys other hybrid families use for their layer patterns, which pdplan does not read yet: a
/// config with one is refused rather than read as a uniform stack.
const UNREAD_PATTERN_KEYS: [&str; 10] = [
    "layers_block_type",
    // Llama 4's chunked local attention, Kimi Linear's KDA layers.
    "attention_chunk_size",
    "linear_attn_config",
    "layer_block_types",
    "block_types",
    "attn_layer_indices",
    "attention_layer_indices",
    "attn_type_list",
    "layer_pattern",
    "hybrid_layer_ids",
];

/// Keys only state-space layers have: a config holding one must say where those layers are.
const STATE_KEYS: [&str; 7] = [
    "mamba_d_state",
    "mamba_num_heads",
    "mamba_n_heads",
    "ssm_state_size",
    "linear_num_value_heads",
    "state_size",
    "mamba_d_ssm",
];

/// Python's `json` writes `NaN`, `Infinity` and `-Infinity` bare (Nemotron-H's
/// `time_step_limit`), which JSON does not allow: they become `null` outside strings.
fn lenient_json(text: &str) -> PlanResult<Value> {
    if text.len() > MAX_CONFIG_BYTES {
        bail!(
            "config.json is {} bytes; at most {MAX_CONFIG_BYTES} are read",
            text.len()
        );
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let (mut in_string, mut escaped, mut i) = (false, false, 0);
    'scan: while let Some(&c) = bytes.get(i) {
        if in_string {
            if escaped {
                escaped = false;
            } else if c == b'\\' {
                escaped = true;
            } else if c == b'"' {
                in_string = false;
            }
        } else if c == b'"' {
            in_string = true;
        } else {
            for word in ["-Infinity", "Infinity", "NaN"] {
                if bytes[i..].starts_with(word.as_bytes()) {
                    out.extend_from_slice(b"null");
                    i += word.len();
                    continue 'scan;
                }
            }
        }
        out.push(c);
        i += 1;
    }
    serde_json::from_slice(&out)
        .map_err(|e| PlanError::new(format!("config.json is not valid JSON: {e}")))
}

/// The config's language-model part (multimodal configs nest it in `text_config`), and the
/// whole, where a dtype or model type may live instead.
struct Config<'a> {
    text: &'a Value,
    root: &'a Value,
}

impl Config<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.text.get(key).filter(|v| !v.is_null())
    }

    fn u64(&self, keys: &[&str]) -> PlanResult<Option<u64>> {
        for key in keys {
            if let Some(value) = self.get(key) {
                let int = value.as_u64();
                return int.map(Some).ok_or_else(|| {
                    PlanError::new(format!(
                        "config.json: {key} must be a non-negative integer, got {value}"
                    ))
                });
            }
        }
        Ok(None)
    }

    fn require(&self, keys: &[&str], what: &str) -> PlanResult<u64> {
        self.u64(keys)?.ok_or_else(|| {
            PlanError::new(format!(
                "config.json has no {}, which {what} needs",
                keys.join(" or ")
            ))
        })
    }

    fn model_type(&self) -> &str {
        self.get("model_type")
            .or_else(|| self.root.get("model_type"))
            .and_then(Value::as_str)
            .unwrap_or("")
    }

    /// Newer configs say `dtype`, older ones `torch_dtype`; multimodal ones may keep it outside
    /// `text_config`. A config that names none is taken as bfloat16, the common cache type.
    fn dtype(&self) -> PlanResult<Dtype> {
        let named = [self.text, self.root].into_iter().find_map(|part| {
            ["dtype", "torch_dtype"]
                .iter()
                .find_map(|k| part.get(*k).filter(|v| !v.is_null()))
        });
        match named {
            None => Ok(Dtype::BFloat16),
            Some(Value::String(name)) => {
                Dtype::parse(name).map_err(|e| PlanError::new(format!("config.json: {e}")))
            }
            Some(other) => {
                bail!("config.json: dtype must be a string such as \"bfloat16\", got {other}")
            }
        }
    }

    /// The window, when the config names one that is in use (Qwen2 names one and turns it off
    /// with `use_sliding_window: false`).
    fn sliding_window(&self) -> PlanResult<Option<u64>> {
        if self.get("use_sliding_window") == Some(&Value::Bool(false)) {
            return Ok(None);
        }
        self.u64(&["sliding_window"])
    }

    fn required_window(&self, why: &str) -> PlanResult<u64> {
        match self.sliding_window()? {
            Some(w) if w > 0 => Ok(w),
            _ => bail!("config.json: {why} names sliding-window layers but no sliding_window"),
        }
    }

    /// A full-attention layer: MLA when the config has a latent rank.
    fn attention(&self) -> PlanResult<Layer> {
        if let Some(rank) = self.u64(&["kv_lora_rank"])?.filter(|&r| r > 0) {
            return Ok(Layer::Mla(MlaShape {
                kv_lora_rank: rank,
                rope_head_dim: self.u64(&["qk_rope_head_dim"])?.unwrap_or(0),
                index_head_dim: self.u64(&["index_head_dim"])?.unwrap_or(0),
            }));
        }
        Ok(Layer::Attention(self.attention_shape(None)?))
    }

    fn attention_shape(&self, sliding_window: Option<u64>) -> PlanResult<AttentionShape> {
        let what = "an attention layer";
        let heads = self.require(&["num_attention_heads", "n_head"], what)?;
        let kv_heads = self
            .u64(&["num_key_value_heads", "multi_query_group_num"])?
            .unwrap_or(heads);
        let head_dim = if let Some(dim) = self.u64(&["head_dim", "attention_head_dim"])? {
            dim
        } else {
            let hidden = self.require(&["hidden_size", "n_embd"], what)?;
            if heads == 0 || hidden % heads != 0 {
                bail!(
                    "config.json: hidden_size={hidden} is not a multiple of \
                     num_attention_heads={heads}, and there is no head_dim"
                );
            }
            hidden / heads
        };
        Ok(AttentionShape {
            kv_heads,
            head_dim,
            sliding_window,
        })
    }

    fn sliding(&self, why: &str) -> PlanResult<Layer> {
        let window = self.required_window(why)?;
        Ok(Layer::Attention(self.attention_shape(Some(window))?))
    }

    /// Nemotron-H's (`mamba_*`, `ssm_state_size`), HF `mamba2`'s and Falcon-H1's Mamba2 keys.
    fn mamba2(&self) -> PlanResult<Mamba2Shape> {
        let what = "a Mamba2 layer";
        let heads = self.require(&["mamba_num_heads", "mamba_n_heads", "num_heads"], what)?;
        let head_dim = match self.u64(&["mamba_head_dim", "mamba_d_head"]) {
            Ok(Some(dim)) => dim,
            // Falcon-H1 may say `"mamba_d_head": "auto"`: the SSM size over the heads.
            Ok(None) | Err(_) if self.model_type() == "falcon_h1" => {
                let ssm = self.require(&["mamba_d_ssm"], what)?;
                if heads == 0 || ssm % heads != 0 {
                    bail!(
                        "config.json: mamba_d_ssm={ssm} is not a multiple of mamba_n_heads={heads}"
                    );
                }
                ssm / heads
            }
            Ok(None) => self.require(&["head_dim"], what)?,
            Err(e) => return Err(e),
        };
        // The inner size a config also states must be heads x head dim, else it is misread.
        let inner = heads.checked_mul(head_dim);
        let stated = if self.model_type() == "falcon_h1" {
            self.u64(&["mamba_d_ssm"])?
                .map(|ssm| (ssm, "mamba_d_ssm".to_owned()))
        } else {
            match (self.u64(&["expand"])?, self.u64(&["hidden_size"])?) {
                (Some(expand), Some(hidden)) => expand
                    .checked_mul(hidden)
                    .map(|size| (size, format!("expand {expand} x hidden_size {hidden}"))),
                _ => None,
            }
        };
        if let Some((size, what)) = stated.filter(|(size, _)| Some(*size) != inner) {
            bail!(
                "config.json: the Mamba2 inner size is {size} ({what}), but {heads} heads x head \
                 dim {head_dim} make {}; check the config's Mamba2 keys",
                heads.saturating_mul(head_dim)
            );
        }
        Ok(Mamba2Shape {
            heads,
            head_dim,
            state_size: self.require(&["ssm_state_size", "mamba_d_state", "state_size"], what)?,
            groups: self.u64(&["n_groups", "mamba_n_groups"])?.unwrap_or(1),
            conv_kernel: self.require(&["conv_kernel", "mamba_d_conv"], what)?,
        })
    }

    /// Jamba's Mamba1 keys (`mamba_d_state`, `mamba_d_conv`, `mamba_expand`), or HF `mamba`'s.
    fn mamba1(&self) -> PlanResult<Mamba1Shape> {
        let what = "a Mamba layer";
        let inner = if let Some(inner) = self
            .u64(&["intermediate_size"])?
            .filter(|_| self.model_type() == "mamba")
        {
            inner
        } else {
            let expand = self.require(&["mamba_expand", "expand"], what)?;
            let hidden = self.require(&["hidden_size"], what)?;
            expand
                .checked_mul(hidden)
                .ok_or_else(|| PlanError::new("config.json: the Mamba inner size overflows"))?
        };
        Ok(Mamba1Shape {
            inner_size: inner,
            state_size: self.require(&["mamba_d_state", "state_size"], what)?,
            conv_kernel: self.require(&["mamba_d_conv", "conv_kernel"], what)?,
        })
    }

    fn gated_deltanet(&self) -> PlanResult<Layer> {
        let what = "a linear-attention (Gated DeltaNet) layer";
        Ok(Layer::GatedDeltaNet(GatedDeltaNetShape {
            key_heads: self.require(&["linear_num_key_heads"], what)?,
            value_heads: self.require(&["linear_num_value_heads"], what)?,
            key_head_dim: self.require(&["linear_key_head_dim"], what)?,
            value_head_dim: self.require(&["linear_value_head_dim"], what)?,
            conv_kernel: self.require(&["linear_conv_kernel_dim"], what)?,
        }))
    }

    fn pattern_u64(&self, key: &str) -> PlanResult<Option<u64>> {
        match self.u64(&[key])? {
            Some(0) => bail!("config.json: {key} must be positive"),
            other => Ok(other),
        }
    }

    /// Every layer, in order.
    fn layers(&self, count: u64) -> PlanResult<Vec<Layer>> {
        for key in UNREAD_PATTERN_KEYS {
            if self.get(key).is_some() {
                bail!(
                    "config.json has {key}, a layer pattern pdplan does not read yet; describe \
                     the model's layers with ModelShape(layer_kinds=...)"
                );
            }
        }
        let model_type = self.model_type();
        let each = |f: &dyn Fn(u64) -> PlanResult<Layer>| (0..count).map(f).collect();
        if model_type == "mamba2" {
            let layer = Layer::Mamba2(self.mamba2()?);
            return each(&|_| Ok(layer));
        }
        if model_type == "mamba" {
            let layer = Layer::Mamba1(self.mamba1()?);
            return each(&|_| Ok(layer));
        }
        if let Some(pattern) = self.get("hybrid_override_pattern") {
            return self.override_pattern(pattern, count);
        }
        if let Some(types) = self.get("layer_types") {
            return self.layer_types(types, count);
        }
        if let Some(interval) = self.pattern_u64("full_attention_interval")? {
            let (full, linear) = (self.attention()?, self.gated_deltanet()?);
            return each(&|i| {
                Ok(if (i + 1) % interval == 0 {
                    full
                } else {
                    linear
                })
            });
        }
        if let Some(period) = self.pattern_u64("attn_layer_period")? {
            let offset = self.u64(&["attn_layer_offset"])?.unwrap_or(0);
            if offset >= period {
                bail!("config.json: attn_layer_offset={offset} must be below attn_layer_period={period}");
            }
            let (attention, mamba) = (self.attention()?, Layer::Mamba1(self.mamba1()?));
            return each(&|i| {
                Ok(if i % period == offset {
                    attention
                } else {
                    mamba
                })
            });
        }
        if model_type == "falcon_h1" {
            let layer = Layer::AttentionMamba2(self.attention_shape(None)?, self.mamba2()?);
            return each(&|_| Ok(layer));
        }
        let periodic = self.get("sliding_window_pattern").is_some();
        if periodic || model_type.starts_with("gemma3") || model_type == "gemma2" {
            // Every `period`-th layer global, the rest sliding (Gemma 3, Cohere 2); Gemma 2
            // alternates, Gemma 3 keeps every sixth layer global unless it says.
            let default = if model_type == "gemma2" { 2 } else { 6 };
            let period = self
                .pattern_u64("sliding_window_pattern")?
                .unwrap_or(default);
            let (sliding, full) = (self.sliding(model_type)?, self.attention()?);
            return each(&|i| Ok(if (i + 1) % period == 0 { full } else { sliding }));
        }
        if let Some(key) = STATE_KEYS.iter().find(|k| self.get(k).is_some()) {
            bail!(
                "config.json has {key}, a state-space layer's key, but no layer pattern pdplan \
                 reads (hybrid_override_pattern, layer_types, full_attention_interval, \
                 attn_layer_period, or model_type mamba2/mamba/falcon_h1); describe the layers \
                 with ModelShape(layer_kinds=...)"
            );
        }
        let layer = match self.sliding_window()? {
            Some(window) if window > 0 => Layer::Attention(self.attention_shape(Some(window))?),
            _ => self.attention()?,
        };
        each(&|_| Ok(layer))
    }

    fn override_pattern(&self, pattern: &Value, count: u64) -> PlanResult<Vec<Layer>> {
        let key = "hybrid_override_pattern";
        let Some(text) = pattern.as_str() else {
            bail!("config.json: {key} must be a string such as \"M-M*-\", got {pattern}");
        };
        if text.len() as u64 != count {
            bail!(
                "config.json: {key} has {} layers but num_hidden_layers is {count}",
                text.chars().count()
            );
        }
        let (mut attention, mut mamba) = (None, None);
        text.chars()
            .enumerate()
            .map(|(i, c)| match c {
                '*' => Ok(*cached(&mut attention, || self.attention())?),
                'M' => Ok(*cached(&mut mamba, || self.mamba2().map(Layer::Mamba2))?),
                '-' | 'E' => Ok(Layer::Mlp),
                other => bail!(
                    "config.json: {key}[{i}] is {other:?}; pdplan reads M (Mamba2), * \
                     (attention), - (MLP) and E (MoE)"
                ),
            })
            .collect()
    }

    fn layer_types(&self, types: &Value, count: u64) -> PlanResult<Vec<Layer>> {
        let key = "layer_types";
        let Some(list) = types.as_array() else {
            bail!("config.json: {key} must be a list of layer kinds, got {types}");
        };
        if list.len() as u64 != count {
            bail!(
                "config.json: {key} lists {} layers but num_hidden_layers is {count}",
                list.len()
            );
        }
        let (mut full, mut sliding, mut linear) = (None, None, None);
        list.iter()
            .enumerate()
            .map(|(i, kind)| match kind.as_str() {
                Some("full_attention") => Ok(*cached(&mut full, || self.attention())?),
                Some("sliding_attention") => {
                    Ok(*cached(&mut sliding, || self.sliding("layer_types"))?)
                }
                Some("linear_attention") => Ok(*cached(&mut linear, || self.gated_deltanet())?),
                _ => bail!(
                    "config.json: {key}[{i}] is {kind}; pdplan reads full_attention, \
                     sliding_attention and linear_attention"
                ),
            })
            .collect()
    }
}

/// A layer read once from the config and reused for every layer of its kind.
fn cached(
    slot: &mut Option<Layer>,
    read: impl FnOnce() -> PlanResult<Layer>,
) -> PlanResult<&Layer> {
    if slot.is_none() {
        *slot = Some(read()?);
    }
    slot.as_ref()
        .ok_or_else(|| PlanError::new("a layer read from config.json went missing"))
}

/// A model shape from a Hugging Face `config.json` text.
pub fn shape_from_hf_config(text: &str, page_size: u64) -> PlanResult<ModelShape> {
    check_page_size(page_size)?;
    let parsed = lenient_json(text)?;
    let text = parsed
        .get("text_config")
        .filter(|v| v.is_object())
        .unwrap_or(&parsed);
    if !text.is_object() {
        bail!("config.json must hold a JSON object");
    }
    let config = Config {
        text,
        root: &parsed,
    };
    let count = config.require(
        &["num_hidden_layers", "n_layer", "num_layers"],
        "a decoder model",
    )?;
    check_layer_count(count)?;
    Ok(ModelShape {
        layers: config.layers(count)?,
        dtype: config.dtype()?,
        kv_cache_dtype: None,
        state_dtype: None,
        page_size,
        draft: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_infinity_and_nan_outside_strings_read_as_null() {
        let value =
            lenient_json(r#"{"a": [0.0, Infinity, -Infinity, NaN], "b": "NaN Infinity"}"#).unwrap();
        assert_eq!(value["a"], serde_json::json!([0.0, null, null, null]));
        assert_eq!(value["b"], "NaN Infinity");
        assert!(lenient_json("[").is_err());
        assert!(lenient_json(r#"{"a": "\"Infinity"}"#).unwrap()["a"] == "\"Infinity");
    }

    #[test]
    fn llama_and_deepseek_configs() {
        let llama = r#"{"num_hidden_layers": 80, "num_attention_heads": 64,
            "num_key_value_heads": 8, "hidden_size": 8192, "torch_dtype": "bfloat16"}"#;
        let shape = shape_from_hf_config(llama, 16).unwrap();
        assert_eq!(shape.layers.len(), 80);
        assert_eq!(
            shape.layers[79],
            Layer::Attention(AttentionShape {
                kv_heads: 8,
                head_dim: 128,
                sliding_window: None
            })
        );
        let ds = r#"{"num_hidden_layers": 61, "num_attention_heads": 128, "hidden_size": 7168,
            "kv_lora_rank": 512, "qk_rope_head_dim": 64, "torch_dtype": "bfloat16"}"#;
        assert!(matches!(
            shape_from_hf_config(ds, 64).unwrap().layers[0],
            Layer::Mla(MlaShape {
                kv_lora_rank: 512,
                ..
            })
        ));
        assert!(shape_from_hf_config("{}", 16)
            .unwrap_err()
            .message()
            .contains("num_hidden_layers"));
        assert!(shape_from_hf_config(r#"{"num_hidden_layers": "80"}"#, 16).is_err());
    }
}
