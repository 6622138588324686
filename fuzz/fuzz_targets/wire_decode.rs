//! Bytes from a peer: the wire decoder must refuse or decode, never panic, and what it decodes
//! must encode back to frames that decode to the same fragments. The canonical reader (the fast
//! path) must agree with the JSON reader alone on every input: the same fragments or the same
//! refusal.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pdplan::wire;

fuzz_target!(|data: &[u8]| {
    // The first byte picks the version frame: `v` takes the next byte as the version (so every
    // version's payloads, and wrong versions, are reached), anything else is version 1.
    let (version, payload): (&[u8], &[u8]) = match data.split_first() {
        Some((b'v', rest)) => rest.split_at(rest.len().min(1)),
        Some((_, rest)) => (b"1", rest),
        None => (b"", b""),
    };
    let limits = wire::FrameLimits::DEFAULT;
    let decoded = wire::decode(Some(version), Some(payload));
    let by_json = wire::decode_json(Some(version), Some(payload), limits);
    assert_eq!(
        decoded.as_ref().map_err(|e| e.message()),
        by_json.as_ref().map_err(|e| e.message())
    );
    if let Ok(fragments) = decoded {
        let (version, payload) = wire::encode(&fragments);
        let again = wire::decode(Some(&version), Some(&payload)).expect("re-encoded frames decode");
        assert_eq!(again, fragments);
    }
});
