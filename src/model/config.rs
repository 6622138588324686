//! A `config.json` as a family's reader sees it: parsed leniently (published configs are not
//! strict JSON), bounded, and read through accessors that name the key in every error and hold
//! the reader to the cache keys its family declares.

use serde_json::{Map, Value};

use super::cache_keys::{is_cache_key, ALIASES, UNIVERSAL_KEYS};
use super::dtype::Dtype;
use crate::error::{bail, PlanError, PlanResult, QUOTED_CHARS};

use crate::json_refusal;
use crate::limits;

/// Python's `json` writes `NaN`, `Infinity` and `-Infinity` bare (Nemotron-H's
/// `time_step_limit`), which JSON does not allow: they become `null` outside strings.
pub fn lenient_json(text: &str) -> PlanResult<Value> {
    limits::CONFIG_BYTES.check("config.json's bytes", text.len() as u64)?;
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let (mut in_string, mut escaped, mut depth, mut i) = (false, false, 0u64, 0);
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
        } else if c == b'[' || c == b'{' {
            depth += 1;
            limits::CONFIG_DEPTH.check("config.json's nesting", depth)?;
        } else if c == b']' || c == b'}' {
            depth = depth.saturating_sub(1);
        } else if c.is_ascii_digit()
            || (c == b'-' && bytes.get(i + 1).is_some_and(u8::is_ascii_digit))
        {
            // A number; an integer past 64 bits is kept as written (a string), never read as
            // the float that would report 2^64 as 1.8446744073709552e19.
            let end = i + bytes[i..]
                .iter()
                .position(|b| !(b.is_ascii_digit() || b"-+.eE".contains(b)))
                .unwrap_or(bytes.len() - i);
            let literal = &bytes[i..end];
            if literal.len() > 1
                && literal.iter().skip(1).all(u8::is_ascii_digit)
                && past_64_bits(literal)
            {
                out.push(b'"');
                out.extend_from_slice(literal);
                out.push(b'"');
                i = end;
                continue 'scan;
            }
            out.extend_from_slice(literal);
            i = end;
            continue 'scan;
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
    serde_json::from_slice(&out).map_err(|e| {
        PlanError::new(format!(
            "config.json is not valid JSON: {}",
            json_refusal::describe(&e, &out)
        ))
    })
}

/// Whether an integer literal (an optional `-`, then digits) is past what 64 bits hold.
fn past_64_bits(literal: &[u8]) -> bool {
    let text = std::str::from_utf8(literal).unwrap_or("");
    text.parse::<u64>().is_err() && text.parse::<i64>().is_err()
}

/// The config's parts: the language model's (multimodal configs nest it in `text_config`) and
/// the whole, where the architecture, a dtype or the model type may live instead.
#[derive(Clone, Copy)]
pub struct Parts<'a> {
    pub text: &'a Map<String, Value>,
    pub root: &'a Map<String, Value>,
}

impl<'a> Parts<'a> {
    pub fn of(parsed: &'a Value) -> PlanResult<Self> {
        let Some(root) = parsed.as_object() else {
            bail!("config.json must hold a JSON object");
        };
        let text = match root.get("text_config") {
            None | Some(Value::Null) => root,
            Some(Value::Object(text)) => text,
            Some(other) => bail!(
                "config.json: text_config must be an object, got {}",
                shown(other)
            ),
        };
        Ok(Self { text, root })
    }

    /// The two parts, once each.
    pub fn each(self) -> impl Iterator<Item = &'a Map<String, Value>> {
        let root = (!std::ptr::eq(self.text, self.root)).then_some(self.root);
        std::iter::once(self.text).chain(root)
    }

    /// Strings of `key` in either part (the text part's first), as a list: `architectures`
    /// is a list, `model_type` one string.
    pub fn names(self, key: &str) -> PlanResult<Vec<&'a str>> {
        let mut out = Vec::new();
        for part in self.each() {
            match part.get(key) {
                None | Some(Value::Null) => {}
                Some(Value::String(name)) => out.push(name.as_str()),
                Some(Value::Array(list)) => {
                    for item in list {
                        let Some(name) = item.as_str() else {
                            bail!("config.json: {key} must list strings, got {}", shown(item));
                        };
                        out.push(name);
                    }
                }
                Some(other) => bail!(
                    "config.json: {key} must be a string or a list, got {}",
                    shown(other)
                ),
            }
        }
        Ok(out)
    }
}

/// A config read by one family's reader: every cache key it reads must be one it consumes.
#[derive(Clone, Copy)]
pub struct Config<'a> {
    pub parts: Parts<'a>,
    /// The reading family's name and the cache keys it declares it consumes.
    pub reader: &'static str,
    pub keys: &'static [&'static str],
}

impl<'a> Config<'a> {
    /// The text part's value of `key` (`None` when absent or null).
    pub fn get(&self, key: &str) -> PlanResult<Option<&'a Value>> {
        let declared = self.keys.contains(&key) || UNIVERSAL_KEYS.contains(&key);
        if is_cache_key(key) && !declared {
            // A reader that reads an undeclared key would let the unconsumed-key check pass it.
            bail!(
                "pdplan's {} reader reads {key} without declaring it (a bug in pdplan)",
                self.reader
            );
        }
        let text = self.parts.text;
        let value = text.get(key).filter(|v| !v.is_null()).or_else(|| {
            // A twin's other name (cache_keys.rs ALIASES), which check_keys held to agree.
            ALIASES
                .iter()
                .filter(|(alias, twin)| *twin == key && !self.keys.contains(alias))
                .find_map(|(alias, _)| text.get(*alias).filter(|v| !v.is_null()))
        });
        Ok(value)
    }

    /// Whether the text part names `key` at all, `null` included: config classes that default
    /// an absent key to one value and a `null` one to another need to tell them apart.
    pub fn names_key(&self, key: &str) -> PlanResult<bool> {
        let _ = self.get(key)?;
        Ok(self.parts.text.contains_key(key))
    }

    pub fn has(&self, key: &str) -> PlanResult<bool> {
        Ok(self.get(key)?.is_some())
    }

    pub fn u64(&self, key: &str) -> PlanResult<Option<u64>> {
        self.get(key)?.map(|v| as_u64(v, key)).transpose()
    }

    /// The first of `keys` the config holds, as an integer.
    pub fn first_u64(&self, keys: &[&str]) -> PlanResult<Option<u64>> {
        for key in keys {
            if let Some(value) = self.u64(key)? {
                return Ok(Some(value));
            }
        }
        Ok(None)
    }

    pub fn require(&self, keys: &[&str], what: &str) -> PlanResult<u64> {
        self.first_u64(keys)?.ok_or_else(|| {
            PlanError::new(format!(
                "config.json has no {}, which {what} needs",
                keys.join(" or ")
            ))
        })
    }

    /// A positive integer, when present.
    pub fn positive(&self, key: &str) -> PlanResult<Option<u64>> {
        match self.u64(key)? {
            Some(0) => bail!("config.json: {key} must be positive"),
            other => Ok(other),
        }
    }

    pub fn bool(&self, key: &str) -> PlanResult<Option<bool>> {
        match self.get(key)? {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => bail!(
                "config.json: {key} must be true or false, got {}",
                shown(other)
            ),
        }
    }

    pub fn str(&self, key: &str) -> PlanResult<Option<&'a str>> {
        match self.get(key)? {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => bail!("config.json: {key} must be a string, got {}", shown(other)),
        }
    }

    pub fn list(&self, key: &str) -> PlanResult<Option<&'a [Value]>> {
        match self.get(key)? {
            None => Ok(None),
            Some(Value::Array(list)) => Ok(Some(list)),
            Some(other) => bail!("config.json: {key} must be a list, got {}", shown(other)),
        }
    }

    /// A list of exactly `count` entries (one a layer).
    /// The first of `keys` that lists a value a layer (a list under another name: transformers'
    /// `attribute_map`).
    pub fn first_layer_list(&self, keys: &[&str], count: u64) -> PlanResult<Option<&'a [Value]>> {
        for key in keys {
            if let Some(list) = self.layer_list(key, count)? {
                return Ok(Some(list));
            }
        }
        Ok(None)
    }

    pub fn layer_list(&self, key: &str, count: u64) -> PlanResult<Option<&'a [Value]>> {
        let Some(list) = self.list(key)? else {
            return Ok(None);
        };
        if list.len() as u64 != count {
            bail!(
                "config.json: {key} lists {} layers but the model has {count}",
                list.len()
            );
        }
        Ok(Some(list))
    }

    /// A list of layer indices, each below `count`; `one_based` for lists that count from 1.
    pub fn indices(&self, key: &str, count: u64, one_based: bool) -> PlanResult<Option<Vec<u64>>> {
        let Some(list) = self.list(key)? else {
            return Ok(None);
        };
        list.iter()
            .map(|v| {
                let at = as_u64(v, key)?;
                let index = if one_based {
                    at.checked_sub(1)
                } else {
                    Some(at)
                };
                match index {
                    Some(i) if i < count => Ok(i),
                    _ => bail!(
                        "config.json: {key} names layer {at}, outside the model's {count} layers \
                         (counted from {})",
                        u8::from(one_based)
                    ),
                }
            })
            .collect::<PlanResult<Vec<_>>>()
            .map(Some)
    }

    /// A dtype named by `key` (in either part).
    pub fn dtype_key(&self, key: &str) -> PlanResult<Option<Dtype>> {
        let _ = self.get(key)?;
        let named = self
            .parts
            .each()
            .find_map(|part| part.get(key).filter(|v| !v.is_null()));
        match named {
            None => Ok(None),
            Some(Value::String(name)) if name == "auto" => Ok(None),
            Some(Value::String(name)) => Dtype::parse(name)
                .map(Some)
                .map_err(|e| PlanError::new(format!("config.json: {key}: {e}"))),
            Some(other) => {
                bail!(
                    "config.json: {key} must be a string such as \"float32\", got {}",
                    shown(other)
                )
            }
        }
    }

    /// The model's dtype as vLLM serves it with `dtype="auto"`: newer configs say `dtype`, older
    /// ones `torch_dtype`; multimodal ones may keep it outside `text_config`. A config that
    /// names none, or float32, is served in bfloat16: vLLM's `config/model.py`
    /// `_resolve_auto_dtype` downcasts float32 to the platform's first supported dtype
    /// (bfloat16 on GPUs that have it; `dtype=` or `--dtype` names another).
    pub fn dtype(&self) -> PlanResult<Dtype> {
        Ok(match self.named_dtype()? {
            Dtype::Float32 => Dtype::BFloat16,
            other => other,
        })
    }

    fn named_dtype(&self) -> PlanResult<Dtype> {
        let named = self.parts.each().find_map(|part| {
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
                bail!(
                    "config.json: dtype must be a string such as \"bfloat16\", got {}",
                    shown(other)
                )
            }
        }
    }
}

/// A non-negative integer (`2.0` as published by some converters included), else an error
/// naming `key`.
pub fn as_u64(value: &Value, key: &str) -> PlanResult<u64> {
    if let Some(int) = value.as_u64() {
        return Ok(int);
    }
    if let Some(float) = value.as_f64() {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // checked whole
        if float >= 0.0 && float.fract() == 0.0 && float < 9.0e15 {
            return Ok(float as u64);
        }
    }
    bail!(
        "config.json: {key} must be a non-negative integer, got {}",
        shown(value)
    )
}

/// A config value for a message: its JSON, cut to `QUOTED_CHARS` characters (saying how long
/// it was) when longer, so a 1 MiB string where a number belongs makes a short message.
pub fn shown(value: &Value) -> String {
    let text = value.to_string();
    // An integer past 64 bits is read as a string of its digits: shown whole up to 512 bits.
    let digits = value
        .as_str()
        .is_some_and(|s| s.bytes().skip(1).all(|b| b.is_ascii_digit()));
    let most = if digits { 160 } else { QUOTED_CHARS };
    match text.char_indices().nth(most) {
        None => text,
        Some((end, _)) => format!("{}... ({} bytes)", &text[..end], text.len()),
    }
}

/// A field of a nested object (`block_configs[i].attention`), named in errors by `path`.
pub fn field<'a>(object: &'a Value, name: &str, path: &str) -> PlanResult<Option<&'a Value>> {
    let Some(map) = object.as_object() else {
        bail!(
            "config.json: {path} must be an object, got {}",
            shown(object)
        );
    };
    Ok(map.get(name).filter(|v| !v.is_null()))
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
        let deep = "[".repeat(100) + &"]".repeat(100);
        assert!(lenient_json(&deep)
            .unwrap_err()
            .message()
            .contains("MAX_CONFIG_DEPTH"));
    }

    #[test]
    fn integers_written_as_whole_floats_read() {
        assert_eq!(as_u64(&serde_json::json!(2.0), "k").unwrap(), 2);
        assert!(as_u64(&serde_json::json!(2.5), "k").is_err());
        assert!(as_u64(&serde_json::json!(-1), "k").is_err());
        assert!(as_u64(&serde_json::json!("2"), "k").is_err());
    }
}
