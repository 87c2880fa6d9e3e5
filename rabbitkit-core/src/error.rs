//! The one error type of the crate boundary.

use std::time::Duration;

/// A boxed error, used wherever a source error is carried.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// `Result` with rabbitkit's [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong outside a handler.
///
/// Failures *inside* a handler are not errors: they become an
/// [`Outcome`](crate::Outcome) and are settled.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A name (queue, exchange, routing key, header) is not valid AMQP.
    #[error("invalid {what} {value:?}: {reason}")]
    InvalidName {
        /// What kind of name it is.
        what: &'static str,
        /// The offending value (truncated when long).
        value: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// A message body is larger than the configured maximum.
    #[error("message body of {size} bytes exceeds the maximum of {max} bytes")]
    BodyTooLarge {
        /// The body size.
        size: usize,
        /// The configured limit.
        max: usize,
    },
    /// A header value cannot be sent (for example a float NaN or a nested value too deep).
    #[error("invalid header {name:?}: {reason}")]
    InvalidHeader {
        /// The header name.
        name: String,
        /// Why it was refused.
        reason: String,
    },
    /// The broker URL could not be parsed.
    #[error("invalid broker URL ({reason})")]
    InvalidUrl {
        /// Why it was refused (the URL itself is not printed: it may hold a password).
        reason: String,
    },
    /// A topology is refused before it is declared (it would lose messages).
    #[error("topology refused: {0}")]
    Topology(String),
    /// The broker refused a declaration (for example 406 PRECONDITION_FAILED on inequivalent arguments).
    #[error("broker refused to declare {what}: {source}")]
    Declare {
        /// What was being declared.
        what: String,
        /// The broker's answer.
        #[source]
        source: BoxError,
    },
    /// A configuration value is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A worker config file is invalid: which key, where, and why. The message never holds
    /// a password from the file.
    #[error("invalid config key `{key}` at line {line}, column {column}: {message}")]
    ConfigFile {
        /// The key's path, e.g. `subscribers[1].prefetch`.
        key: String,
        /// 1-based line of the offending key or value.
        line: usize,
        /// 1-based column of the offending key or value.
        column: usize,
        /// What is wrong.
        message: String,
    },
    /// A worker config names a handler that was not registered.
    #[error("no handler named {name:?} is registered (registered: {})", registered.join(", "))]
    UnknownHandler {
        /// The name the config asked for.
        name: String,
        /// The names that are registered, sorted.
        registered: Vec<String>,
    },
    /// The connection to the broker could not be opened or was lost.
    #[error("broker connection failed: {0}")]
    Connection(#[source] BoxError),
    /// No connection was available within the given time.
    #[error("not connected to the broker after {0:?}")]
    NotConnected(Duration),
    /// An AMQP operation failed.
    #[error("amqp operation failed: {0}")]
    Amqp(#[source] BoxError),
    /// JSON encoding failed.
    #[error("json encoding failed: {0}")]
    Json(#[from] serde_json::Error),
}

impl Error {
    pub(crate) fn amqp(e: lapin::Error) -> Self {
        Error::Amqp(Box::new(e))
    }
}
