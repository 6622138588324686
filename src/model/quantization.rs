//! The KV cache dtype a quantized export implies: what vLLM makes of `kv_cache_dtype="auto"`
//! from the checkpoint's quantization config (vLLM 0.32):
//!
//! - the config is `config.json`'s `quantization_config` (`compression_config` for older
//!   compressed-tensors exports), else `text_config`'s, else, when `config.json` has none,
//!   `ModelOpt`'s `hf_quant_config.json` beside it (`transformers_utils/config.py`: older
//!   `ModelOpt` releases; `model_arch_config_convertor.py` `get_quantization_config`);
//! - a `ModelOpt` file without `quant_method` is named by its producer and `quant_algo`
//!   (`_normalize_quantization_config`: FP8 kinds `modelopt`, NVFP4 `modelopt_fp4`, others
//!   refused by vLLM);
//! - `ModelOpt`'s KV algorithm (`utils/torch_utils.py` `get_kv_cache_quant_algo_string`, read by
//!   `resolve_kv_cache_dtype_string` from the top-level config only): `kv_cache_scheme` then
//!   `kv_cache_quant_algo`, inside `quantization` or beside it; `{"type": "float", "num_bits":
//!   8, "dynamic": false}` or `"FP8"` is `fp8_e4m3`, 4-bit float or `"NVFP4"` is `nvfp4`,
//!   anything else falls back to `auto`;
//! - compressed-tensors with a `kv_cache_scheme` caches `fp8`
//!   (`model_executor/layers/attention/attention.py`, "llm-compressor models declare an FP8
//!   KV-cache scheme");
//! - anything else (`quant_method: "fp8"`, AWQ, GPTQ...) keeps `auto`: the model's dtype.

use serde_json::{Map, Value};

use super::config::{shown, Parts};
use super::dtype::Dtype;
use crate::error::{bail, PlanResult};

/// The file `ModelOpt` 0.29 and older keep the quantization config in, beside `config.json`.
pub const SIDE_FILE: &str = "hf_quant_config.json";

/// `ModelOpt`'s FP8 algorithms (`modelopt`) and its NVFP4 one (`modelopt_fp4`), as vLLM names
/// a file that says only its producer.
const MODELOPT_FP8: [&str; 3] = ["FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO"];
const MODELOPT_NVFP4: &str = "NVFP4";

/// The KV cache dtype the export implies, or `None` for the model's dtype. `side` is
/// `hf_quant_config.json` where the model's folder holds one.
pub fn kv_cache_dtype(parts: Parts<'_>, side: Option<&Value>) -> PlanResult<Option<Dtype>> {
    let top = quantization_of(parts.root)?.or(match side {
        None | Some(Value::Null) => None,
        Some(Value::Object(map)) => Some(map),
        Some(other) => bail!("{SIDE_FILE} must hold a JSON object, got {}", shown(other)),
    });
    let text = if std::ptr::eq(parts.text, parts.root) {
        None
    } else {
        quantization_of(parts.text)?
    };
    if let Some(config) = top {
        if method(config)?.starts_with("modelopt") {
            return Ok(modelopt(config));
        }
    }
    // vLLM builds its quantization method from the top-level config, else text_config's.
    if let Some(config) = top.or(text) {
        let scheme = config.get("kv_cache_scheme").filter(|v| !v.is_null());
        if method(config)? == "compressed-tensors" && scheme.is_some() {
            return Ok(Some(Dtype::Float8E4M3Fn));
        }
    }
    Ok(None)
}

/// A part's quantization config (`compression_config` where compressed-tensors wrote that).
fn quantization_of(part: &Map<String, Value>) -> PlanResult<Option<&Map<String, Value>>> {
    for key in ["quantization_config", "compression_config"] {
        match part.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::Object(map)) => return Ok(Some(map)),
            Some(other) => bail!("config.json: {key} must be an object, got {}", shown(other)),
        }
    }
    Ok(None)
}

/// The quantization method as vLLM normalizes it: lower case, `compressed-tensors` with a
/// dash; a `ModelOpt` file without one named from its producer and algorithm.
fn method(config: &Map<String, Value>) -> PlanResult<String> {
    let inner = config.get("quantization").and_then(Value::as_object);
    let producer = config
        .get("producer")
        .and_then(|p| p.get("name"))
        .and_then(Value::as_str);
    let legacy = inner.is_some_and(|q| q.contains_key("modelopt_quant_config"));
    let mut named = match config.get("quant_method") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(name)) => name.to_lowercase(),
        Some(other) => bail!(
            "quantization_config: quant_method must be a string, got {}",
            shown(other)
        ),
    };
    if producer == Some("modelopt") || legacy {
        if let Some(algo) = inner
            .and_then(|q| q.get("quant_algo"))
            .filter(|v| !v.is_null())
        {
            let algo = algo
                .as_str()
                .map_or_else(|| algo.to_string(), str::to_uppercase);
            named = if MODELOPT_FP8.contains(&algo.as_str()) {
                "modelopt".to_owned()
            } else if algo == MODELOPT_NVFP4 {
                "modelopt_fp4".to_owned()
            } else {
                bail!(
                    "quantization_config: ModelOpt's quant_algo {algo} is not one vLLM loads \
                     (FP8, FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO, NVFP4)"
                );
            };
        }
    }
    Ok(named.replace("compressed_tensors", "compressed-tensors"))
}

/// `ModelOpt`'s KV algorithm, where it is set.
fn modelopt(config: &Map<String, Value>) -> Option<Dtype> {
    let inner = config
        .get("quantization")
        .and_then(Value::as_object)
        .unwrap_or(config);
    let set = |map: &Map<String, Value>, key: &str| -> Option<Value> {
        map.get(key).filter(|v| truthy(v)).cloned()
    };
    let algo = set(inner, "kv_cache_scheme")
        .or_else(|| set(config, "kv_cache_scheme"))
        .or_else(|| set(inner, "kv_cache_quant_algo"))
        .or_else(|| set(config, "kv_cache_quant_algo"));
    match algo {
        Some(Value::Object(scheme)) => {
            let float = scheme.get("type").and_then(Value::as_str) == Some("float");
            let bits = scheme.get("num_bits").and_then(Value::as_u64);
            let dynamic = scheme.get("dynamic");
            if float && bits == Some(8) && dynamic == Some(&Value::Bool(false)) {
                Some(Dtype::Float8E4M3Fn)
            } else if float && bits == Some(4) {
                Some(Dtype::Nvfp4)
            } else {
                None // vLLM falls back to auto
            }
        }
        Some(Value::String(name)) => match name.to_lowercase().as_str() {
            "fp8" => Some(Dtype::Float8E4M3Fn),
            "nvfp4" => Some(Dtype::Nvfp4),
            _ => None, // vLLM falls back to auto
        },
        _ => None,
    }
}

/// Python's truth, which vLLM's `or` chain applies: null, false, 0, "" and empty
/// containers are unset.
fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dtype(config: &Value, side: Option<&Value>) -> Option<Dtype> {
        kv_cache_dtype(Parts::of(config).unwrap(), side).unwrap()
    }

    #[test]
    fn modelopt_compressed_tensors_and_others_resolve_as_vllm_does() {
        let fp8 = Some(Dtype::Float8E4M3Fn);
        let algo = json!({"quantization_config": {"quant_method": "modelopt",
            "kv_cache_quant_algo": "FP8"}});
        assert_eq!(dtype(&algo, None), fp8);
        let scheme = json!({"quantization_config": {"quant_method": "modelopt_fp4",
            "kv_cache_scheme": {"type": "float", "num_bits": 8, "dynamic": false}}});
        assert_eq!(dtype(&scheme, None), fp8);
        let dynamic = json!({"quantization_config": {"quant_method": "modelopt",
            "kv_cache_scheme": {"type": "float", "num_bits": 8}}});
        assert_eq!(dtype(&dynamic, None), None);
        let fp4 = json!({"quantization_config": {"quant_method": "modelopt",
            "kv_cache_quant_algo": "NVFP4"}});
        assert_eq!(dtype(&fp4, None), Some(Dtype::Nvfp4));
        let side = json!({"producer": {"name": "modelopt"},
            "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8"}});
        assert_eq!(dtype(&json!({}), Some(&side)), fp8);
        // config.json's own quantization_config wins over the side file.
        let awq = json!({"quantization_config": {"quant_method": "awq"}});
        assert_eq!(dtype(&awq, Some(&side)), None);
        let ct = json!({"quantization_config": {"quant_method": "compressed-tensors",
            "kv_cache_scheme": {"type": "float", "num_bits": 8, "strategy": "tensor"}}});
        assert_eq!(dtype(&ct, None), fp8);
        let ct_none = json!({"quantization_config": {"quant_method": "compressed-tensors",
            "kv_cache_scheme": null}});
        assert_eq!(dtype(&ct_none, None), None);
        let fp8_weights = json!({"quantization_config": {"quant_method": "fp8"}});
        assert_eq!(dtype(&fp8_weights, None), None);
        // ModelOpt read from text_config only is not resolved by vLLM: the model's dtype.
        let wrapped = json!({"text_config": {"quantization_config": {"quant_method": "modelopt",
            "kv_cache_quant_algo": "FP8"}}});
        assert_eq!(dtype(&wrapped, None), None);
        let unknown = json!({"producer": {"name": "modelopt"}, "quantization":
            {"quant_algo": "W4A8_AWQ"}});
        assert!(kv_cache_dtype(Parts::of(&json!({})).unwrap(), Some(&unknown)).is_err());
    }
}
