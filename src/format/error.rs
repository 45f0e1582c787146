//! The format layer's error.

/// Why a document cannot be shown or stored the way shardfs needs (the reason, for a log line or
/// an error message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unsupported(pub String);

impl From<String> for Unsupported {
    fn from(reason: String) -> Self {
        Unsupported(reason)
    }
}

impl From<&str> for Unsupported {
    fn from(reason: &str) -> Self {
        Unsupported(reason.to_string())
    }
}
