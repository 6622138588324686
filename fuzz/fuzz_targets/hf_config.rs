//! A `config.json` as a user hands it over: the reader (bare `NaN`/`Infinity` scanner included)
//! must refuse or read, never panic, and what it reads must lay out, or refuse, at any TP.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pdplan::model::{model_buffers, shape_from_hf_config, summarize, KvLayout};

fuzz_target!(|data: &[u8]| {
    // The first byte picks the TP size and page layout, so sharding refusals are reached too.
    let Some((&pick, text)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(text) else {
        return;
    };
    if let Ok(shape) = shape_from_hf_config(text, 16) {
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
