//! The wire format: a version frame and a compact JSON list of fragment objects, keys in schema
//! order (`fragment::FIELDS`). Version 1 (`b"1"`) is the reference's, byte for byte; a list is
//! written in the oldest version that carries all of it: a fragment holding a non-default value
//! of a field that version `n` adds needs version `n` (version 2 adds the row fields of
//! token-major pages: `rows_per_page`, `src_row_stride_bytes`, `dst_row_stride_bytes`). A frame of
//! version `n` carries exactly the fields of versions up to `n`. Decoding is strict: fragments
//! come from another process and are not trusted.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

use crate::canonical_frames;
use crate::error::{bail, PlanError, PlanResult};
use crate::fragment::{
    FieldKind, FieldValue, Fragment, FIELDS, FIELD_COUNT, LATEST_VERSION, SETTERS,
};
use crate::json_refusal;
use crate::layout::BufferKind;
use crate::limits::MAX_VALUE;

/// The version the reference speaks, and what a list of reference-shaped fragments is encoded as.
pub const PROTOCOL_VERSION: u32 = 1;
/// Every version this build decodes: 1 up to the newest a schema field needs.
pub const READABLE_VERSIONS: [u32; LATEST_VERSION as usize] = {
    let mut versions = [0; LATEST_VERSION as usize];
    let mut version = 1;
    while version <= LATEST_VERSION {
        versions[version as usize - 1] = version;
        version += 1;
    }
    versions
};

/// How much a peer's frames may hold before anything is parsed: a frame is refused on its
/// length alone, and a payload stops parsing at the first fragment past the count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameLimits {
    pub max_payload_bytes: u64,
    pub max_fragments: u64,
}

impl FrameLimits {
    /// 16 MiB and 65,536 fragments: a plan of 160 buffers from 400 sources, far above one
    /// (prefill rank, decode rank) pair's.
    pub const DEFAULT: Self = Self {
        max_payload_bytes: crate::limits::DEFAULT_MAX_PAYLOAD_BYTES,
        max_fragments: crate::limits::DEFAULT_MAX_FRAGMENTS,
    };
}

impl Default for FrameLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// The version frame of `version`: its decimal digits.
pub fn version_frame(version: u32) -> Vec<u8> {
    version.to_string().into_bytes()
}

/// Encodes fragments into (version frame, payload frame), in the oldest version that carries
/// them all.
pub fn encode(fragments: &[Fragment]) -> (Vec<u8>, Vec<u8>) {
    let version = fragments
        .iter()
        .map(Fragment::wire_version)
        .fold(PROTOCOL_VERSION, u32::max);
    // Every fragment serialises to roughly 250 bytes (v2: 320).
    let mut json = String::with_capacity(2 + fragments.len() * (190 + 64 * version as usize));
    json.push('[');
    let mut digits = itoa::Buffer::new();
    for (position, fragment) in fragments.iter().enumerate() {
        if position > 0 {
            json.push(',');
        }
        fragment.write_json(&mut json, version, &mut digits);
    }
    json.push(']');
    (version_frame(version), json.into_bytes())
}

/// Decodes a frame pair under the default limits. Both empty (or absent) means no fragments.
pub fn decode(
    version_frame: Option<&[u8]>,
    payload_frame: Option<&[u8]>,
) -> PlanResult<Vec<Fragment>> {
    decode_with(version_frame, payload_frame, FrameLimits::DEFAULT)
}

/// Refuses a payload longer than the limit, on its length alone.
pub fn check_payload_len(payload_len: usize, limits: FrameLimits) -> PlanResult<()> {
    let len = payload_len as u64;
    if len > limits.max_payload_bytes {
        bail!(
            "transfer plan payload of {len} bytes is over the limit of {} bytes; a peer sent \
             more than one plan can hold, or raise max_payload_bytes if the plan really is \
             this large",
            limits.max_payload_bytes
        );
    }
    Ok(())
}

/// The version a version frame names, if this build reads it (exactly its digits: no sign,
/// no leading zero, no space).
fn parse_version(frame: &[u8]) -> PlanResult<u32> {
    let readable = READABLE_VERSIONS
        .iter()
        .copied()
        .find(|&v| version_frame(v) == frame);
    let Some(version) = readable else {
        let shown = String::from_utf8_lossy(&frame[..frame.len().min(32)]).into_owned();
        bail!(
            "unsupported transfer plan protocol version frame {shown:?}: this build reads \
             versions {READABLE_VERSIONS:?}; upgrade the peer or pdplan so both match"
        );
    };
    Ok(version)
}

/// Decodes a frame pair, refusing frames past `limits` before materialising their fragments.
pub fn decode_with(
    version_frame: Option<&[u8]>,
    payload_frame: Option<&[u8]>,
    limits: FrameLimits,
) -> PlanResult<Vec<Fragment>> {
    decode_by(version_frame, payload_frame, limits, true)
}

/// `decode_with` reading every payload with the JSON reader, never the canonical one: what the
/// canonical reader must agree with (the differential fuzz target holds them to it).
pub fn decode_json(
    version_frame: Option<&[u8]>,
    payload_frame: Option<&[u8]>,
    limits: FrameLimits,
) -> PlanResult<Vec<Fragment>> {
    decode_by(version_frame, payload_frame, limits, false)
}

fn decode_by(
    version_frame: Option<&[u8]>,
    payload_frame: Option<&[u8]>,
    limits: FrameLimits,
    canonical_first: bool,
) -> PlanResult<Vec<Fragment>> {
    let version = version_frame.filter(|f| !f.is_empty());
    let payload = payload_frame.filter(|f| !f.is_empty());
    let (version, payload) = match (version, payload) {
        (None, None) => return Ok(Vec::new()),
        (Some(v), Some(p)) => (v, p),
        (Some(_), None) => bail!("incomplete transfer plan frames: the payload frame is missing"),
        (None, Some(_)) => bail!("incomplete transfer plan frames: the version frame is missing"),
    };
    let version = parse_version(version)?;
    check_payload_len(payload.len(), limits)?;
    // Payloads as `encode` writes them are read byte by byte; any other the JSON reader reads
    // (and refuses, saying why).
    let canonical = canonical_first
        .then(|| canonical_frames::read(payload, version, limits.max_fragments))
        .flatten();
    if let Some(fragments) = canonical {
        return Ok(fragments);
    }
    let text = std::str::from_utf8(payload)
        .map_err(|e| PlanError::new(format!("transfer plan payload is not valid UTF-8: {e}")))?;
    let mut parser = serde_json::Deserializer::from_str(text);
    let fragments = parser
        .deserialize_seq(BoundedFragments {
            max: limits.max_fragments,
            version,
        })
        .and_then(|fragments| parser.end().map(|()| fragments))
        .map_err(|e| {
            PlanError::new(format!(
                "invalid transfer plan payload: {}",
                json_refusal::describe(&e, payload)
            ))
        })?;
    Ok(fragments)
}

/// A JSON list of fragments of one version, refused at the first element past `max`.
struct BoundedFragments {
    max: u64,
    version: u32,
}

impl<'de> Visitor<'de> for BoundedFragments {
    type Value = Vec<Fragment>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of transfer fragment objects")
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        let version = self.version;
        while let Some(fragment) = seq.next_element_seed(FragmentSeed {
            version,
            position: out.len(),
        })? {
            if out.len() as u64 >= self.max {
                return Err(de::Error::custom(format_args!(
                    "more than {} fragments in one payload; a peer sent more than one plan \
                     can hold, or raise max_fragments if the plan really is this large",
                    self.max
                )));
            }
            out.push(fragment);
        }
        Ok(out)
    }
}

/// One fragment object of a frame of `version`: exactly the schema's fields up to that
/// version, each once, in any order; later fields take their defaults.
#[derive(Clone, Copy)]
struct FragmentSeed {
    version: u32,
    position: usize,
}

impl<'de> DeserializeSeed<'de> for FragmentSeed {
    type Value = Fragment;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Fragment, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for FragmentSeed {
    type Value = Fragment;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a transfer fragment object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Fragment, A::Error> {
        // Fields not given keep their defaults; `given` has a bit per field seen.
        let mut fragment = Fragment::default();
        let mut given: u64 = 0;
        let mut expected = 0;
        while let Some(index) = map.next_key_seed(FieldKey { expected })? {
            expected = index + 1;
            let (Some(field), Some(set)) = (FIELDS.get(index), SETTERS.get(index)) else {
                return Err(de::Error::custom("no such field"));
            };
            if field.since > self.version {
                return Err(de::Error::custom(format_args!(
                    "a version {} frame carries `{}`, a field of version {}; only frames of \
                     version {} or later may",
                    self.version, field.name, field.since, field.since
                )));
            }
            if given & (1 << index) != 0 {
                return Err(de::Error::duplicate_field(field.name));
            }
            given |= 1 << index;
            let value = map.next_value_seed(FieldSeed(field.kind))?;
            if !set(&mut fragment, value) {
                return Err(de::Error::custom(format_args!(
                    "{}: a value of the wrong kind",
                    field.name
                )));
            }
        }
        for (index, field) in FIELDS.iter().enumerate() {
            if field.since <= self.version && given & (1 << index) == 0 {
                return Err(de::Error::missing_field(field.name));
            }
        }
        let position = self.position;
        fragment
            .validate()
            .map_err(|e| de::Error::custom(format_args!("fragment {position}: {e}")))?;
        Ok(fragment)
    }
}

/// A key, as its index in the schema; `expected` is tried first (keys come in schema order).
struct FieldKey {
    expected: usize,
}

impl<'de> DeserializeSeed<'de> for FieldKey {
    type Value = usize;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<usize, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for FieldKey {
    type Value = usize;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a transfer fragment field name")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<usize, E> {
        if FIELDS.get(self.expected).is_some_and(|f| f.name == key) {
            return Ok(self.expected);
        }
        FIELDS
            .iter()
            .position(|f| f.name == key)
            .ok_or_else(|| E::unknown_field(key, &FIELD_NAMES))
    }
}

/// The field names, for error messages.
const FIELD_NAMES: [&str; FIELD_COUNT] = {
    let mut names = [""; FIELD_COUNT];
    let mut i = 0;
    while i < FIELD_COUNT {
        names[i] = FIELDS[i].name;
        i += 1;
    }
    names
};

/// A field's value, parsed as its kind says.
struct FieldSeed(FieldKind);

impl<'de> DeserializeSeed<'de> for FieldSeed {
    type Value = FieldValue;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<FieldValue, D::Error> {
        match self.0 {
            FieldKind::Int => wire_int(deserializer).map(FieldValue::Int),
            FieldKind::OptionalInt => wire_optional_int(deserializer).map(FieldValue::OptionalInt),
            FieldKind::Kind => wire_kind(deserializer).map(FieldValue::Kind),
        }
    }
}

const INT_EXPECTED: &str = "a JSON integer in [0, 2^63)";

/// Accepts JSON integers in [0, 2^63) only: no floats, strings, booleans or nulls.
struct WireInt;

impl Visitor<'_> for WireInt {
    type Value = u64;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(INT_EXPECTED)
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<u64, E> {
        if value > MAX_VALUE {
            return Err(E::invalid_value(
                de::Unexpected::Unsigned(value),
                &INT_EXPECTED,
            ));
        }
        Ok(value)
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<u64, E> {
        u64::try_from(value)
            .map_err(|_| E::invalid_value(de::Unexpected::Signed(value), &INT_EXPECTED))
    }
}

fn wire_int<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    deserializer.deserialize_any(WireInt)
}

struct WireOptionalInt;

impl Visitor<'_> for WireOptionalInt {
    type Value = Option<u64>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("null or a JSON integer in [0, 2^63)")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Self::Value, E> {
        WireInt.visit_u64(value).map(Some)
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Self::Value, E> {
        WireInt.visit_i64(value).map(Some)
    }
}

fn wire_optional_int<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
    deserializer.deserialize_any(WireOptionalInt)
}

fn wire_kind<'de, D: Deserializer<'de>>(deserializer: D) -> Result<BufferKind, D::Error> {
    // Borrowing fails for strings with escapes; an owned String takes both.
    let text = String::deserialize(deserializer)?;
    BufferKind::parse(&text).map_err(|e| de::Error::custom(e.message()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A plain version 1 fragment (other modules' tests build on it).
    pub(crate) fn fragment() -> Fragment {
        Fragment {
            buffer_index: 3,
            buffer_kind: BufferKind::TargetV,
            src_rank: 1,
            dst_rank: 0,
            src_page_stride_bytes: 4096,
            dst_page_stride_bytes: 16384,
            src_byte_offset: 0,
            dst_byte_offset: 4096,
            bytes_per_page: 4096,
            ..Fragment::default()
        }
    }

    fn row_fragment() -> Fragment {
        Fragment {
            bytes_per_page: 4096,
            rows_per_page: 16,
            src_row_stride_bytes: 256,
            dst_row_stride_bytes: 1024,
            ..fragment()
        }
    }

    fn payload(text: &str) -> PlanResult<Vec<Fragment>> {
        decode(Some(b"1"), Some(text.as_bytes()))
    }

    #[test]
    fn encodes_compact_json_in_field_order() {
        let (version, json) = encode(&[fragment()]);
        assert_eq!(version, b"1");
        assert_eq!(
            String::from_utf8(json).unwrap(),
            "[{\"buffer_index\":3,\"buffer_kind\":\"target_v\",\"src_rank\":1,\"dst_rank\":0,\
             \"src_page_stride_bytes\":4096,\"dst_page_stride_bytes\":16384,\
             \"src_byte_offset\":0,\"dst_byte_offset\":4096,\"bytes_per_page\":4096,\
             \"page_count\":null}]"
        );
        assert_eq!(encode(&[]).1, b"[]");
    }

    #[test]
    fn round_trips() {
        let fragments = vec![
            fragment(),
            Fragment {
                page_count: Some(7),
                ..fragment()
            },
        ];
        let (version, json) = encode(&fragments);
        assert_eq!(decode(Some(&version), Some(&json)).unwrap(), fragments);
    }

    #[test]
    fn empty_frames_mean_no_fragments() {
        assert_eq!(decode(None, None).unwrap(), vec![]);
        assert_eq!(decode(Some(b""), Some(b"")).unwrap(), vec![]);
        assert!(decode(Some(b"1"), None).is_err());
        assert!(decode(None, Some(b"[]")).is_err());
    }

    #[test]
    fn refuses_malformed_payloads() {
        let good = String::from_utf8(encode(&[fragment()]).1).unwrap();
        let cases = [
            good.replace("\"page_count\":null", "\"page_count\":1.5"),
            good.replace(":4096,", ":4096.0,"),
            good.replace("\"src_rank\":1", "\"src_rank\":-1"),
            good.replace("\"src_rank\":1", "\"src_rank\":\"1\""),
            good.replace("\"src_rank\":1", "\"src_rank\":true"),
            good.replace("\"src_rank\":1", "\"src_rank\":null"),
            good.replace("\"src_rank\":1", "\"src_rank\":9223372036854775808"),
            good.replace("\"src_rank\":1", "\"src_rank\":99999999999999999999999"),
            good.replace("\"src_rank\":1,", ""),
            good.replace("\"src_rank\":1", "\"src_rank\":1,\"extra\":0"),
            good.replace("\"src_rank\":1", "\"src_rank\":1,\"src_rank\":1"),
            good.replace("target_v", "target_q"),
            good.replace(",\"page_count\":null", ""),
            "{}".to_owned(),
            "[1]".to_owned(),
            "[".to_owned(),
            format!("{good} x"),
        ];
        for case in cases {
            assert!(payload(&case).is_err(), "accepted {case}");
        }
        assert!(decode(Some(b"1"), Some(&[0xff, 0xfe])).is_err());
        let unknown = (LATEST_VERSION + 1).to_string();
        assert!(decode(Some(unknown.as_bytes()), Some(b"[]")).is_err());
        assert!(decode(Some(b"01"), Some(b"[]")).is_err());
        assert!(
            payload(&good.replace("\"src_rank\":1", "\"src_rank\":9223372036854775807")).is_ok()
        );
    }

    #[test]
    fn row_fragments_travel_as_version_2() {
        let mixed = vec![fragment(), row_fragment()];
        let (version, json) = encode(&mixed);
        assert_eq!(version, b"2");
        let text = String::from_utf8(json.clone()).unwrap();
        assert!(text.ends_with(
            "\"page_count\":null,\"rows_per_page\":16,\"src_row_stride_bytes\":256,\
             \"dst_row_stride_bytes\":1024}]"
        ));
        assert_eq!(decode(Some(&version), Some(&json)).unwrap(), mixed);
        // v2 needs every row key; v1 may carry none.
        let partial = text.replace(",\"dst_row_stride_bytes\":1024", "");
        assert!(decode(Some(b"2"), Some(partial.as_bytes())).is_err());
        assert!(decode(Some(b"1"), Some(&json)).is_err());
        let (_, v1) = encode(&[fragment()]);
        assert!(decode(Some(b"2"), Some(&v1)).is_err());
        // Field rules hold in v2 too: rows must divide the bytes.
        let odd = text.replace("\"rows_per_page\":16", "\"rows_per_page\":3");
        assert!(decode(Some(b"2"), Some(odd.as_bytes())).is_err());
    }

    #[test]
    fn frames_past_the_limits_are_refused() {
        let (_, json) = encode(&[fragment(), fragment(), fragment()]);
        let tight = |max_payload_bytes, max_fragments| FrameLimits {
            max_payload_bytes,
            max_fragments,
        };
        assert!(decode_with(Some(b"1"), Some(&json), tight(json.len() as u64, 3)).is_ok());
        let err =
            decode_with(Some(b"1"), Some(&json), tight(json.len() as u64 - 1, 3)).unwrap_err();
        assert!(err.message().contains("over the limit"), "{err}");
        let err = decode_with(Some(b"1"), Some(&json), tight(1 << 20, 2)).unwrap_err();
        assert!(err.message().contains("more than 2 fragments"), "{err}");
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        let deep = "[".repeat(100_000);
        assert!(payload(&deep).is_err());
    }
}
