//! Holding a config to its family: every key that shapes a cache is read by the family, means
//! off, is an alias agreeing with its twin, or is declared ignored; anything else is refused,
//! naming the key and the families that read it.

use super::cache_keys::{ALIASES, CACHE_KEYS};
use super::config::Parts;
use super::families::{Family, FAMILIES};
use crate::error::{bail, PlanResult};

/// The twin `key` is another name for, where `family` reads the twin and not `key`.
fn twin_read(key: &str, family: &Family) -> Option<&'static str> {
    ALIASES
        .iter()
        .find(|(alias, twin)| *alias == key && family.consumes(twin))
        .map(|(_, twin)| *twin)
}

/// Keys that are a window or chunk of tokens: one as long as the context is no window.
const WINDOW_KEYS: [&str; 4] = [
    "sliding_window",
    "sliding_window_size",
    "attention_chunk_size",
    "attention_window",
];

/// Whether `value` says the feature `key` names is off: false, an empty list, or a window as
/// long as the model's context (`max_position_embeddings`) or longer.
fn means_off(
    key: &str,
    value: &serde_json::Value,
    part: &serde_json::Map<String, serde_json::Value>,
) -> bool {
    use serde_json::Value;
    match value {
        Value::Bool(false) => true,
        Value::Array(list) => list.is_empty(),
        Value::Number(window) if WINDOW_KEYS.contains(&key) => {
            let context = part.get("max_position_embeddings").and_then(Value::as_u64);
            matches!((window.as_u64(), context), (Some(w), Some(c)) if w >= c)
        }
        _ => false,
    }
}

/// Keys a switch of the same part turns off: the key says nothing where its switch is false.
const SWITCHES: [(&str, &str); 1] = [("sliding_window", "use_sliding_window")];

/// Whether `value` of `key` says nothing in its part: null, a value meaning off, or a key
/// whose switch the part sets false (Qwen2.5-VL exports keep `sliding_window` 32768 at the
/// top level beside `use_sliding_window: false`).
fn switched_off(
    key: &str,
    value: &serde_json::Value,
    part: &serde_json::Map<String, serde_json::Value>,
) -> bool {
    let switch = SWITCHES.iter().find(|(k, _)| *k == key).map(|(_, s)| *s);
    value.is_null()
        || means_off(key, value, part)
        || switch.is_some_and(|s| part.get(s) == Some(&serde_json::Value::Bool(false)))
}

/// Refuses a config holding a cache key its family does not consume, naming the key and the
/// families that do read it; and one whose top level says other than its `text_config` about
/// a key the reader consumes (readers read the language model's part).
pub fn check_keys(parts: Parts<'_>, family: &Family) -> PlanResult<()> {
    if !std::ptr::eq(parts.text, parts.root) {
        for key in CACHE_KEYS.iter().filter(|k| family.consumes(k)) {
            let (text, root) = (parts.text.get(*key), parts.root.get(*key));
            if root.is_some_and(|v| !switched_off(key, v, parts.root)) && text != root {
                bail!(
                    "config.json has {key} at its top level, but its language model (read from \
                     text_config) says {}; make the two agree or drop the top-level key",
                    text.map_or_else(|| "nothing".to_owned(), ToString::to_string)
                );
            }
        }
    }
    for part in parts.each() {
        for key in CACHE_KEYS {
            let Some(value) = part.get(*key).filter(|v| !v.is_null()) else {
                continue;
            };
            if family.consumes(key) || family.ignores(key) || means_off(key, value, part) {
                continue;
            }
            if let Some(twin) = twin_read(key, family) {
                match part.get(twin).filter(|v| !v.is_null()) {
                    Some(read) if read != value => bail!(
                        "config.json has {key} {value} and {twin} {read}: {key} is another name \
                         for {twin}, so the two must agree; drop one or make them equal"
                    ),
                    _ => continue,
                }
            }
            let readers: Vec<&str> = FAMILIES
                .iter()
                .filter(|f| f.consumes(key))
                .map(|f| f.name)
                .collect();
            let who = if readers.is_empty() {
                "no family reads it".to_owned()
            } else {
                format!("families that read it: {}", readers.join(", "))
            };
            bail!(
                "config.json has {key}, which shapes what a layer caches, but the {} family's \
                 reader does not read it, so pdplan would have to guess ({who}); choose the \
                 family that describes this model with family=, or describe its layers with \
                 ModelShape(layer_kinds=...)",
                family.name
            );
        }
    }
    Ok(())
}
