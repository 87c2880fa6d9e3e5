//! What a handler decided: outcomes, failures and error classification.

use std::{borrow::Cow, fmt, time::Duration};

use crate::error::BoxError;

/// The result of handling one delivery. The [`AckPolicy`](crate::AckPolicy) turns it into a
/// settlement; failures at the handler boundary (errors, timeouts, panics, decode
/// rejections) are outcomes too, never lost errors.
#[derive(Debug)]
#[non_exhaustive]
pub enum Outcome {
    /// Done: ack the original.
    Ack,
    /// Retry later through a delay tier (the policy's tier for this attempt, or the smallest
    /// tier at least `after` long).
    Retry {
        /// A delay the handler asks for.
        after: Option<Duration>,
        /// Why.
        failure: Failure,
    },
    /// Park now with this failure as evidence.
    Park(Failure),
    /// Give the message back to the queue at once (`basic.reject` with requeue). Not counted as an attempt.
    Requeue,
    /// Reject without requeue: the broker dead-letters it to the parking queue (as `rejected`).
    Reject,
    /// The handler failed; the subscriber's classifier decides retry or park.
    Error(BoxError),
    /// A manual-mode handler settled the delivery itself.
    Settled,
}

impl Outcome {
    /// Retry through the policy's tier for this attempt.
    pub fn retry(failure: impl Into<Failure>) -> Self {
        Outcome::Retry {
            after: None,
            failure: failure.into(),
        }
    }

    /// Retry through the smallest tier at least `after` long.
    pub fn retry_after(after: Duration, failure: impl Into<Failure>) -> Self {
        Outcome::Retry {
            after: Some(after),
            failure: failure.into(),
        }
    }

    /// Park with a reason.
    pub fn park(failure: impl Into<Failure>) -> Self {
        Outcome::Park(failure.into())
    }

    /// A failure to be classified.
    pub fn error(e: impl Into<BoxError>) -> Self {
        Outcome::Error(e.into())
    }
}

/// Evidence of a failure: a short kind and a message. Carried in the copy's headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// A short machine-readable kind: `error`, `timeout`, `panic`, `decode`, ...
    pub kind: Cow<'static, str>,
    /// A human-readable message (truncated when written to headers).
    pub message: String,
}

impl Failure {
    /// A failure of the given kind.
    pub fn new(kind: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        Self {
            kind: kind.into(),
            message: message.into(),
        }
    }

    /// A handler error.
    pub fn error(message: impl Into<String>) -> Self {
        Self::new("error", message)
    }

    /// The payload could not be decoded.
    pub fn decode(message: impl Into<String>) -> Self {
        Self::new("decode", message)
    }

    /// The handler ran past its deadline.
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new("timeout", message)
    }

    /// The handler panicked.
    pub fn panic(message: impl Into<String>) -> Self {
        Self::new("panic", message)
    }

    /// Describes a boxed error, with its chain of sources.
    pub fn from_error(
        kind: impl Into<Cow<'static, str>>,
        e: &(dyn std::error::Error + 'static),
    ) -> Self {
        let mut message = e.to_string();
        let mut src = e.source();
        while let Some(s) = src {
            let text = s.to_string();
            // Wrappers often display their source already: do not say it twice.
            if !message.ends_with(&text) {
                message.push_str(": ");
                message.push_str(&text);
            }
            src = s.source();
        }
        Self::new(kind, message)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.message)
    }
}

impl From<&str> for Failure {
    fn from(s: &str) -> Self {
        Failure::error(s)
    }
}

impl From<String> for Failure {
    fn from(s: String) -> Self {
        Failure::error(s)
    }
}

/// Marks an error as permanent: the default classifier parks it without retrying.
#[derive(Debug)]
pub struct Permanent(pub BoxError);

impl Permanent {
    /// Wraps an error as permanent.
    pub fn new(e: impl Into<BoxError>) -> Self {
        Permanent(e.into())
    }
}

impl fmt::Display for Permanent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for Permanent {
    // Transparent: `Permanent` displays as the error it wraps, so its source is the wrapped
    // error's source (else the evidence header would repeat the message).
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// How a handler error is treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Retry through the tiers (the default for unknown errors).
    Retryable,
    /// Park at once.
    Permanent,
}

/// Anything a handler may return.
pub trait IntoOutcome {
    /// Converts into an outcome.
    fn into_outcome(self) -> Outcome;
}

impl IntoOutcome for Outcome {
    fn into_outcome(self) -> Outcome {
        self
    }
}

impl IntoOutcome for () {
    fn into_outcome(self) -> Outcome {
        Outcome::Ack
    }
}

impl<T, E> IntoOutcome for Result<T, E>
where
    T: IntoOutcome,
    E: Into<BoxError>,
{
    fn into_outcome(self) -> Outcome {
        match self {
            Ok(t) => t.into_outcome(),
            Err(e) => Outcome::Error(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Permanent);

    #[test]
    fn results_become_outcomes() {
        assert!(matches!(Ok::<(), String>(()).into_outcome(), Outcome::Ack));
        assert!(matches!(
            Err::<(), _>("x").into_outcome(),
            Outcome::Error(_)
        ));
        assert!(matches!(
            Ok::<_, String>(Outcome::Requeue).into_outcome(),
            Outcome::Requeue
        ));
    }

    #[test]
    fn failure_from_error_keeps_the_chain() {
        let e = Outer(Permanent::new("deep"));
        let f = Failure::from_error("error", &e);
        // Outer -> Permanent (transparent) -> "deep": each text once.
        assert_eq!(f.message, "outer: deep");
    }
}
