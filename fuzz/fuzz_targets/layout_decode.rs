//! A peer's layout frame: the decoder must refuse or decode, never panic, and what it decodes
//! must encode back to a frame that decodes to the same side.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pdplan::layout_frame::{self, DEFAULT_MAX_LAYOUT_BYTES, LAYOUT_VERSION_FRAME};

fuzz_target!(|data: &[u8]| {
    if let Ok(frame) = layout_frame::decode(LAYOUT_VERSION_FRAME, data, DEFAULT_MAX_LAYOUT_BYTES) {
        let (version, payload) = layout_frame::encode(
            &frame.layout,
            &frame.buffers,
            frame.base_ptrs.as_deref(),
            frame.limits.as_deref(),
        )
        .expect("a decoded side encodes");
        let again = layout_frame::decode(&version, &payload, DEFAULT_MAX_LAYOUT_BYTES)
            .expect("a re-encoded side decodes");
        assert_eq!(again, frame);
    }
});
