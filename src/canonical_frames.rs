//! The fast reader of payloads written exactly as `wire::encode` writes them: compact JSON, every
//! key a version carries in schema order, integers without sign or leading zero. It matches
//! bytes against the schema's keys instead of tokenising JSON. Anything else (whitespace, another
//! key order, escapes, a value out of range, a fragment that fails validation, too many
//! fragments) makes it give up, and the strict JSON reader reads the payload and says what is
//! wrong: this reader only ever accepts what that one accepts, with the same fragments.

use crate::fragment::{FieldKind, FieldValue, Fragment, FIELDS, SETTERS};
use crate::layout::BufferKind;
use crate::limits::MAX_VALUE;

/// The fragments of a canonical payload of `version`, at most `max_fragments` of them; `None`
/// when the payload is not canonical or not acceptable (read it with the JSON reader).
pub fn read(payload: &[u8], version: u32, max_fragments: u64) -> Option<Vec<Fragment>> {
    let mut cursor = Cursor {
        bytes: payload,
        at: 0,
    };
    cursor.expect(b"[")?;
    let mut fragments = Vec::with_capacity(capacity(payload.len(), max_fragments));
    if cursor.expect(b"]").is_none() {
        loop {
            if fragments.len() as u64 >= max_fragments {
                return None;
            }
            fragments.push(cursor.fragment(version)?);
            match cursor.byte()? {
                b',' => {}
                b']' => break,
                _ => return None,
            }
        }
    }
    (cursor.at == payload.len()).then_some(fragments)
}

/// Fragments to reserve room for: a version 1 fragment takes at least this many bytes, so a
/// payload cannot claim more room than its own length allows.
fn capacity(payload_len: usize, max_fragments: u64) -> usize {
    const SMALLEST_FRAGMENT: usize = 200;
    let bound = usize::try_from(max_fragments).unwrap_or(usize::MAX);
    (payload_len / SMALLEST_FRAGMENT).min(bound)
}

struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn byte(&mut self) -> Option<u8> {
        let byte = *self.bytes.get(self.at)?;
        self.at += 1;
        Some(byte)
    }

    /// Steps over `text` if the payload continues with it.
    fn expect(&mut self, text: &[u8]) -> Option<()> {
        let end = self.at.checked_add(text.len())?;
        (self.bytes.get(self.at..end)? == text).then(|| self.at = end)
    }

    /// One fragment object with exactly the keys of `version`, in schema order.
    fn fragment(&mut self, version: u32) -> Option<Fragment> {
        self.expect(b"{")?;
        let mut fragment = Fragment::default();
        let mut first = true;
        for (field, set) in FIELDS.iter().zip(SETTERS) {
            if field.since > version {
                continue;
            }
            if !first {
                self.expect(b",")?;
            }
            first = false;
            self.expect(b"\"")?;
            self.expect(field.name.as_bytes())?;
            self.expect(b"\":")?;
            let value = match field.kind {
                FieldKind::Int => FieldValue::Int(self.int()?),
                FieldKind::OptionalInt if self.expect(b"null").is_some() => {
                    FieldValue::OptionalInt(None)
                }
                FieldKind::OptionalInt => FieldValue::OptionalInt(Some(self.int()?)),
                FieldKind::Kind => FieldValue::Kind(self.kind()?),
            };
            if !set(&mut fragment, value) {
                return None;
            }
        }
        self.expect(b"}")?;
        fragment.validate().ok()?;
        Some(fragment)
    }

    /// An integer in [0, 2^63): digits, no leading zero.
    fn int(&mut self) -> Option<u64> {
        let start = self.at;
        let mut value: u64 = 0;
        while let Some(&byte) = self.bytes.get(self.at) {
            if !byte.is_ascii_digit() {
                break;
            }
            value = value.checked_mul(10)?.checked_add(u64::from(byte - b'0'))?;
            self.at += 1;
        }
        let digits = self.at - start;
        let leading_zero = digits > 1 && self.bytes.get(start) == Some(&b'0');
        (digits > 0 && !leading_zero && value <= MAX_VALUE).then_some(value)
    }

    /// A buffer kind's name in quotes, without escapes.
    fn kind(&mut self) -> Option<BufferKind> {
        self.expect(b"\"")?;
        let kind = BufferKind::ALL
            .into_iter()
            .find(|kind| self.expect(kind.as_str().as_bytes()).is_some())?;
        self.expect(b"\"")?;
        Some(kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire;

    fn fragments() -> Vec<Fragment> {
        let base = Fragment {
            src_rank: 10,
            ..wire::tests::fragment()
        };
        vec![
            base,
            Fragment {
                page_count: Some(7),
                buffer_kind: BufferKind::MambaState,
                ..base
            },
            Fragment {
                src_rank: MAX_VALUE,
                ..base
            },
        ]
    }

    #[test]
    fn reads_what_encode_writes() {
        let list = fragments();
        let (version, payload) = wire::encode(&list);
        assert_eq!(version, b"1");
        assert_eq!(read(&payload, 1, 100), Some(list));
        assert_eq!(read(b"[]", 1, 0), Some(vec![]));
    }

    #[test]
    fn gives_up_on_anything_else() {
        let (_, payload) = wire::encode(&fragments());
        let text = String::from_utf8(payload.clone()).unwrap();
        let cases = [
            text.replace(",\"src_rank\"", ", \"src_rank\""),
            text.replace("\"src_rank\":10", "\"src_rank\":010"),
            text.replace("\"src_rank\":10", "\"src_rank\":-10"),
            text.replace("\"src_rank\":10", "\"src_rank\":1e1"),
            text.replace("target_v", "target_\\u0076"),
            text.replace("target_v", "target_q"),
            text.replace("\"page_count\":7", "\"page_count\":nul"),
            text.replace("9223372036854775807", "9223372036854775808"),
            text.replace("9223372036854775807", "99999999999999999999"),
            text.replace("\"bytes_per_page\":4096", "\"bytes_per_page\":4096,\"x\":1"),
            format!("{text} "),
            text[..text.len() - 1].to_owned(),
            "[".to_owned(),
            "[,]".to_owned(),
        ];
        for case in cases {
            assert_eq!(read(case.as_bytes(), 1, 100), None, "read {case}");
        }
        // A frame of another version carries other keys; too many fragments is for the strict
        // reader to refuse.
        assert_eq!(read(&payload, 2, 100), None);
        assert_eq!(read(&payload, 1, 2), None);
    }

    #[test]
    fn a_fragment_that_fails_validation_is_left_to_the_strict_reader() {
        let (_, rows) = wire::encode(&[Fragment {
            rows_per_page: 4,
            src_row_stride_bytes: 1024,
            dst_row_stride_bytes: 1024,
            ..fragments()[0]
        }]);
        let text = String::from_utf8(rows).unwrap();
        assert!(read(text.as_bytes(), 2, 100).is_some());
        let bad = text.replace("\"rows_per_page\":4", "\"rows_per_page\":3");
        assert_eq!(read(bad.as_bytes(), 2, 100), None);
    }
}
