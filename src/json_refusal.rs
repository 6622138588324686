//! `serde_json`'s refusals made fit to show: the caller's or peer's text a refusal quotes (an
//! unknown key, a string where a number belongs) cut as `error::quoted` cuts it, and a number
//! too large for its field reported as it was written, not as the float `serde_json` read it as
//! (`2^64` is not "floating point `1.8446744073709552e19`").

use std::fmt::Write as _;

use crate::error::QUOTED_CHARS;

/// The most characters of a number a refusal shows (a 512-bit integer's digits).
const NUMBER_CHARS: usize = 160;

/// The longest refusal shown: `serde_json`'s own words and the cut quotes fit well inside.
const MOST_BYTES: usize = 1024;

/// `error`, raised reading `text`, as a message of bounded length.
pub fn describe(error: &serde_json::Error, text: &[u8]) -> String {
    let message = error.to_string();
    let message = match number_at(text, error.line(), error.column()) {
        Some(written) if message.contains("floating point `") => {
            with_number_as_written(&message, written)
        }
        Some(written) if message.starts_with("number out of range") => {
            format!("{message}: `{written}`")
        }
        _ => message,
    };
    let cut = cut_quotes(&message);
    if cut.len() <= MOST_BYTES {
        return cut;
    }
    let end = (0..=MOST_BYTES)
        .rev()
        .find(|&i| cut.is_char_boundary(i))
        .unwrap_or(0);
    format!("{}... ({} bytes)", &cut[..end], cut.len())
}

/// The number literal ending at or around `serde_json`'s position (1-based line, the column of
/// its last byte read), as written.
fn number_at(text: &[u8], line: usize, column: usize) -> Option<&str> {
    let line_start = if line <= 1 {
        0
    } else {
        text.iter()
            .enumerate()
            .filter(|&(_, &b)| b == b'\n')
            .nth(line - 2)
            .map(|(i, _)| i + 1)?
    };
    let at = line_start.checked_add(column)?.min(text.len());
    let is_number = |b: u8| b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.' | b'e' | b'E');
    let mut end = at;
    while end < text.len() && is_number(text[end]) {
        end += 1;
    }
    let mut start = end;
    while start > 0 && is_number(text[start - 1]) {
        start -= 1;
    }
    let literal = std::str::from_utf8(&text[start..end]).ok()?;
    literal
        .bytes()
        .any(|b| b.is_ascii_digit())
        .then_some(literal)
}

/// `message` with its "floating point `...`" naming `written` instead.
fn with_number_as_written(message: &str, written: &str) -> String {
    let Some(start) = message.find("floating point `") else {
        return message.to_owned();
    };
    let quote = start + "floating point `".len();
    let Some(close) = message[quote..].find('`') else {
        return message.to_owned();
    };
    format!(
        "{}number `{}`{}",
        &message[..start],
        written,
        &message[quote + close + 1..]
    )
}

/// `message` with every span between backquotes, and every `"`-quoted string (escapes read),
/// cut to `QUOTED_CHARS` characters (a number to `NUMBER_CHARS`: 10^100 shows whole), saying
/// how long it was.
fn cut_quotes(message: &str) -> String {
    let mut out = String::with_capacity(message.len().min(MOST_BYTES + 64));
    let mut chars = message.chars();
    while let Some(c) = chars.next() {
        out.push(c);
        if c != '`' && c != '"' {
            continue;
        }
        let (mut kept, mut inner, mut bytes) = (String::new(), 0usize, 0usize);
        let (mut escaped, mut closed) = (false, false);
        for d in chars.by_ref() {
            if d == c && !escaped {
                closed = true;
                break;
            }
            escaped = c == '"' && d == '\\' && !escaped;
            if inner < NUMBER_CHARS {
                kept.push(d);
            }
            inner += 1;
            bytes += d.len_utf8();
        }
        let number = kept
            .bytes()
            .all(|b| b.is_ascii_digit() || b"-+.eE".contains(&b));
        let most = if number { NUMBER_CHARS } else { QUOTED_CHARS };
        if inner > most {
            out.extend(kept.chars().take(most));
            let _ = write!(out, "... ({bytes} bytes)");
        } else {
            out.push_str(&kept);
        }
        if closed {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::describe;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)] // read only for their refusals
    struct Frame {
        size: u64,
        name: String,
        parts: Option<Vec<u64>>,
    }

    fn refusal(text: &str) -> String {
        let error = serde_json::from_str::<Frame>(text).expect_err("refused");
        describe(&error, text.as_bytes())
    }

    #[test]
    fn long_keys_and_strings_are_cut() {
        let key = "k".repeat(900_000);
        let shown = refusal(&format!("{{\"{key}\": 1}}"));
        assert!(shown.len() < 400, "{shown}");
        assert!(shown.contains("unknown field `kkkk") && shown.contains("(900000 bytes)"));
        let long = "\\\"x".repeat(400_000);
        let shown = refusal(&format!("{{\"size\": \"{long}\"}}"));
        assert!(
            shown.len() < 400 && shown.contains("invalid type: string"),
            "{shown}"
        );
        // A key of quotes and backquotes cannot lengthen the message either.
        let odd = "`a\\\"".repeat(300_000);
        let shown = refusal(&format!("{{\"{odd}\": 1}}"));
        assert!(shown.len() <= 1100, "{}", shown.len());
    }

    #[test]
    fn numbers_are_reported_as_written() {
        for (text, written) in [
            ("{\"size\": 18446744073709551616}", "18446744073709551616"),
            ("{\"name\": \"a\",\n \"size\": 1e100}", "1e100"),
            (
                "{\"parts\": [1, 340282366920938463463374607431768211456]}",
                "340282366920938463463374607431768211456",
            ),
            ("{\"size\": -1}", "-1"),
            ("{\"size\": 2.5}", "2.5"),
        ] {
            let shown = refusal(text);
            assert!(shown.contains(&format!("`{written}`")), "{text}: {shown}");
            assert!(!shown.contains("e19"), "{shown}");
        }
        let digits = "9".repeat(100_000);
        let shown = refusal(&format!("{{\"size\": {digits}}}"));
        assert!(
            shown.len() < 400 && shown.contains("(100000 bytes)"),
            "{shown}"
        );
    }
}
