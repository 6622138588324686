//! The one error type of the core. Every message says what was wrong and what to change; the
//! Python binding turns each of them into `UnsupportedPDLayoutError` in one place.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanError {
    message: String,
}

impl PlanError {
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    pub fn into_message(self) -> String {
        self.message
    }
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for PlanError {}

pub type PlanResult<T> = Result<T, PlanError>;

/// Early-return a `PlanError` built with `format!` arguments.
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err($crate::error::PlanError::new(format!($($arg)*)))
    };
}
pub(crate) use bail;

/// The most characters of a caller's or peer's text a message quotes: a 1 MiB string in a
/// frame must not make a 1 MiB message.
pub const QUOTED_CHARS: usize = 64;

/// The most entries of a caller's list a message shows.
pub const QUOTED_ENTRIES: usize = 16;

/// `text` quoted for a message, as `{:?}` quotes it, cut to its first `QUOTED_CHARS`
/// characters (saying how long it was) when longer.
pub fn quoted(text: &str) -> String {
    match text.char_indices().nth(QUOTED_CHARS) {
        None => format!("{text:?}"),
        Some((end, _)) => format!("{:?}... ({} bytes)", &text[..end], text.len()),
    }
}

/// `values` for a message, `[a, b, ...]`, cut to their first `QUOTED_ENTRIES` (saying how
/// many there were) when more.
pub fn listed<T: fmt::Debug>(values: &[T]) -> String {
    if values.len() <= QUOTED_ENTRIES {
        return format!("{values:?}");
    }
    let shown: Vec<String> = values[..QUOTED_ENTRIES]
        .iter()
        .map(|v| format!("{v:?}"))
        .collect();
    format!("[{}, ...] ({} entries)", shown.join(", "), values.len())
}

#[cfg(test)]
mod tests {
    use super::{listed, quoted, QUOTED_CHARS, QUOTED_ENTRIES};

    #[test]
    fn long_text_and_lists_are_cut_with_their_length() {
        assert_eq!(quoted("kv_head"), "\"kv_head\"");
        let long = "é".repeat(1 << 20);
        let shown = quoted(&long);
        assert!(shown.len() < 4 * QUOTED_CHARS + 40, "{}", shown.len());
        assert!(shown.ends_with(&format!("... ({} bytes)", long.len())));
        assert_eq!(listed(&[1, 2, 3]), "[1, 2, 3]");
        let many: Vec<u64> = (0..1_000_000).collect();
        let shown = listed(&many);
        assert!(shown.starts_with("[0, 1, 2") && shown.ends_with("(1000000 entries)"));
        assert!(shown.len() < 8 * QUOTED_ENTRIES + 40);
    }
}
