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
