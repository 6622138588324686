//! The wire format: a version frame and a compact JSON list of fragment objects, keys in field
//! order. Version 1 (`b"1"`) is the reference's, byte for byte; a list with a row fragment
//! (token-major pages) is version 2 (`b"2"`): the v1 keys, then `rows_per_page`,
//! `src_row_stride_bytes`, `dst_row_stride_bytes`. Decoding is strict: fragments come from
//! another process and are not trusted.

use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

use crate::error::{bail, PlanError, PlanResult};
use crate::fragment::Fragment;
use crate::layout::{BufferKind, MAX_VALUE};

/// The version the reference speaks, and what a list without row fragments is encoded as.
pub const PROTOCOL_VERSION: u32 = 1;
pub const VERSION_FRAME: &[u8] = b"1";
/// The version that carries row fragments.
pub const ROWS_PROTOCOL_VERSION: u32 = 2;
pub const ROWS_VERSION_FRAME: &[u8] = b"2";
/// Every version this build decodes.
pub const READABLE_VERSIONS: [u32; 2] = [PROTOCOL_VERSION, ROWS_PROTOCOL_VERSION];

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
        max_payload_bytes: 16 << 20,
        max_fragments: 1 << 16,
    };
}

impl Default for FrameLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Encodes fragments into (version frame, payload frame): version 1 unless a fragment has rows.
pub fn encode(fragments: &[Fragment]) -> (Vec<u8>, Vec<u8>) {
    let rows = fragments.iter().any(Fragment::is_row_fragment);
    // Every fragment serialises to roughly 250 bytes (v2: 320).
    let mut json = String::with_capacity(2 + fragments.len() * if rows { 320 } else { 256 });
    json.push('[');
    for (position, fragment) in fragments.iter().enumerate() {
        if position > 0 {
            json.push(',');
        }
        write_fragment(&mut json, fragment, rows);
    }
    json.push(']');
    let version = if rows {
        ROWS_VERSION_FRAME
    } else {
        VERSION_FRAME
    };
    (version.to_vec(), json.into_bytes())
}

fn write_fragment(out: &mut String, f: &Fragment, with_rows: bool) {
    // Hand-rolled rather than `write!`: formatting machinery is most of the cost otherwise.
    let mut digits = itoa::Buffer::new();
    let mut field = |key: &str, value: u64| {
        out.push_str(key);
        out.push_str(digits.format(value));
    };
    field("{\"buffer_index\":", f.buffer_index);
    out.push_str(",\"buffer_kind\":\"");
    out.push_str(f.buffer_kind.as_str());
    out.push('"');
    let mut field = |key: &str, value: u64| {
        out.push_str(key);
        out.push_str(digits.format(value));
    };
    field(",\"src_rank\":", f.src_rank);
    field(",\"dst_rank\":", f.dst_rank);
    field(",\"src_page_stride_bytes\":", f.src_page_stride_bytes);
    field(",\"dst_page_stride_bytes\":", f.dst_page_stride_bytes);
    field(",\"src_byte_offset\":", f.src_byte_offset);
    field(",\"dst_byte_offset\":", f.dst_byte_offset);
    field(",\"bytes_per_page\":", f.bytes_per_page);
    match f.page_count {
        Some(pages) => field(",\"page_count\":", pages),
        None => out.push_str(",\"page_count\":null"),
    }
    if with_rows {
        let mut field = |key: &str, value: u64| {
            out.push_str(key);
            out.push_str(digits.format(value));
        };
        field(",\"rows_per_page\":", f.rows_per_page);
        field(",\"src_row_stride_bytes\":", f.src_row_stride_bytes);
        field(",\"dst_row_stride_bytes\":", f.dst_row_stride_bytes);
    }
    out.push('}');
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

/// Decodes a frame pair, refusing frames past `limits` before materialising their fragments.
pub fn decode_with(
    version_frame: Option<&[u8]>,
    payload_frame: Option<&[u8]>,
    limits: FrameLimits,
) -> PlanResult<Vec<Fragment>> {
    let version = version_frame.filter(|f| !f.is_empty());
    let payload = payload_frame.filter(|f| !f.is_empty());
    let (version, payload) = match (version, payload) {
        (None, None) => return Ok(Vec::new()),
        (Some(v), Some(p)) => (v, p),
        (Some(_), None) => bail!("incomplete transfer plan frames: the payload frame is missing"),
        (None, Some(_)) => bail!("incomplete transfer plan frames: the version frame is missing"),
    };
    let rows = match version {
        VERSION_FRAME => false,
        ROWS_VERSION_FRAME => true,
        _ => {
            let shown = String::from_utf8_lossy(&version[..version.len().min(32)]).into_owned();
            bail!(
                "unsupported transfer plan protocol version frame {shown:?}: this build reads \
                 versions {READABLE_VERSIONS:?}; upgrade the peer or pdplan so both match"
            );
        }
    };
    check_payload_len(payload.len(), limits)?;
    let text = std::str::from_utf8(payload)
        .map_err(|e| PlanError::new(format!("transfer plan payload is not valid UTF-8: {e}")))?;
    let mut parser = serde_json::Deserializer::from_str(text);
    let fragments = parser
        .deserialize_seq(BoundedFragments {
            max: limits.max_fragments,
            rows,
        })
        .and_then(|fragments| parser.end().map(|()| fragments))
        .map_err(|e| PlanError::new(format!("invalid transfer plan payload: {e}")))?;
    Ok(fragments)
}

/// A JSON list of fragments, refused at the first element past `max`; `rows` says the
/// version carries the row keys (required in v2, refused in v1).
struct BoundedFragments {
    max: u64,
    rows: bool,
}

impl<'de> Visitor<'de> for BoundedFragments {
    type Value = Vec<Fragment>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of transfer fragment objects")
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some(raw) = seq.next_element::<WireFragment>()? {
            if out.len() as u64 >= self.max {
                return Err(de::Error::custom(format_args!(
                    "more than {} fragments in one payload; a peer sent more than one plan \
                     can hold, or raise max_fragments if the plan really is this large",
                    self.max
                )));
            }
            let position = out.len();
            let fragment = raw
                .into_fragment(self.rows)
                .map_err(|e| de::Error::custom(format_args!("fragment {position}: {e}")))?;
            out.push(fragment);
        }
        Ok(out)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a transfer fragment object")]
struct WireFragment {
    #[serde(deserialize_with = "wire_int")]
    buffer_index: u64,
    #[serde(deserialize_with = "wire_kind")]
    buffer_kind: BufferKind,
    #[serde(deserialize_with = "wire_int")]
    src_rank: u64,
    #[serde(deserialize_with = "wire_int")]
    dst_rank: u64,
    #[serde(deserialize_with = "wire_int")]
    src_page_stride_bytes: u64,
    #[serde(deserialize_with = "wire_int")]
    dst_page_stride_bytes: u64,
    #[serde(deserialize_with = "wire_int")]
    src_byte_offset: u64,
    #[serde(deserialize_with = "wire_int")]
    dst_byte_offset: u64,
    #[serde(deserialize_with = "wire_int")]
    bytes_per_page: u64,
    // `deserialize_with` makes the key required: `null` is allowed, a missing key is not.
    #[serde(deserialize_with = "wire_optional_int")]
    page_count: Option<u64>,
    // Version 2 only; presence is checked against the version in `into_fragment`.
    #[serde(default, deserialize_with = "wire_present_int")]
    rows_per_page: Option<u64>,
    #[serde(default, deserialize_with = "wire_present_int")]
    src_row_stride_bytes: Option<u64>,
    #[serde(default, deserialize_with = "wire_present_int")]
    dst_row_stride_bytes: Option<u64>,
}

impl WireFragment {
    fn into_fragment(self, rows: bool) -> PlanResult<Fragment> {
        let row_keys = [
            self.rows_per_page,
            self.src_row_stride_bytes,
            self.dst_row_stride_bytes,
        ];
        let (rows_per_page, src_row_stride_bytes, dst_row_stride_bytes) = match (rows, row_keys) {
            (false, [None, None, None]) => (1, 0, 0),
            (true, [Some(r), Some(s), Some(d)]) => (r, s, d),
            (false, _) => bail!(
                "a version 1 frame carries row keys (rows_per_page, src_row_stride_bytes, \
                 dst_row_stride_bytes); only version 2 frames may"
            ),
            (true, _) => bail!(
                "a version 2 fragment must carry rows_per_page, src_row_stride_bytes and \
                 dst_row_stride_bytes"
            ),
        };
        let fragment = Fragment {
            buffer_index: self.buffer_index,
            buffer_kind: self.buffer_kind,
            src_rank: self.src_rank,
            dst_rank: self.dst_rank,
            src_page_stride_bytes: self.src_page_stride_bytes,
            dst_page_stride_bytes: self.dst_page_stride_bytes,
            src_byte_offset: self.src_byte_offset,
            dst_byte_offset: self.dst_byte_offset,
            bytes_per_page: self.bytes_per_page,
            page_count: self.page_count,
            rows_per_page,
            src_row_stride_bytes,
            dst_row_stride_bytes,
        };
        fragment.validate()?;
        Ok(fragment)
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

/// A key that, when present, holds an integer in [0, 2^63) (never `null`).
fn wire_present_int<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
    deserializer.deserialize_any(WireInt).map(Some)
}

fn wire_kind<'de, D: Deserializer<'de>>(deserializer: D) -> Result<BufferKind, D::Error> {
    // Borrowing fails for strings with escapes; an owned String takes both.
    let text = String::deserialize(deserializer)?;
    BufferKind::parse(&text).map_err(|e| de::Error::custom(e.message()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fragment() -> Fragment {
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
            page_count: None,
            rows_per_page: 1,
            src_row_stride_bytes: 0,
            dst_row_stride_bytes: 0,
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
        assert!(decode(Some(b"3"), Some(b"[]")).is_err());
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
