//! A `config.json` as a user hands it over: the registry and every family's reader (bare
//! `NaN`/`Infinity` scanner included) must refuse or read, never panic, and what they read
//! must lay out, or refuse, at any TP.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pdplan::model::{model_buffers, shape_from_hf_config, summarize, KvLayout, FAMILIES};

fuzz_target!(|data: &[u8]| {
    // The first byte picks the TP size and page layout, so sharding refusals are reached too;
    // the second the family (past the registry: the one the config's architecture names), so
    // every reader meets every config.
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let Some((&family, text)) = rest.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(text) else {
        return;
    };
    let chosen = FAMILIES.get(usize::from(family)).map(|f| f.name);
    if let Ok(shape) = shape_from_hf_config(text, 16, chosen) {
        let tp = u64::from(pick % 16) + 1;
        let layout = if pick & 0x80 == 0 {
            KvLayout::Hnd
        } else {
            KvLayout::Nhd
        };
        if let Ok(buffers) = model_buffers(&shape, tp, layout) {
            for buffer in &buffers {
                buffer.validate().expect("model buffers are valid layouts");
            }
        }
        let _ = summarize(&shape);
    }
});
