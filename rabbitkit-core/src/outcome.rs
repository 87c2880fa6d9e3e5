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

/// Decides whether a handler error is retryable or permanent.
///
/// The default ([`DefaultClassifier`]) treats every error as retryable except
/// [`Permanent`]-wrapped ones: an unknown error must not skip the retries. Closures
/// `Fn(&BoxError) -> ErrorClass` implement it too.
pub trait Classify: Send + Sync + 'static {
    /// Classifies `error`.
    fn classify(&self, error: &BoxError) -> ErrorClass;

    /// The kind recorded for `error` (evidence header, logs, replay filters) and used to
    /// pick a [`RetryPolicy::on_kind`](crate::RetryPolicy::on_kind) policy. The default:
    /// a [`Kinded`](crate::kind::Kinded) in its chain, `timeout` for tower's `Elapsed`,
    /// else `error`.
    fn kind(&self, error: &BoxError) -> Cow<'static, str> {
        crate::kind::default_kind(error)
    }
}

impl<F> Classify for F
where
    F: Fn(&BoxError) -> ErrorClass + Send + Sync + 'static,
{
    fn classify(&self, error: &BoxError) -> ErrorClass {
        self(error)
    }
}

/// Retryable unless the error (or one of its sources) is [`Permanent`].
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultClassifier;

impl Classify for DefaultClassifier {
    fn classify(&self, error: &BoxError) -> ErrorClass {
        if crate::kind::chain(error.as_ref()).any(|e| e.is::<Permanent>()) {
            ErrorClass::Permanent
        } else {
            ErrorClass::Retryable
        }
    }
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
    fn unknown_errors_are_retryable_permanent_ones_park() {
        let c = DefaultClassifier;
        let e: BoxError = "db down".into();
        assert_eq!(c.classify(&e), ErrorClass::Retryable);
        let p: BoxError = Box::new(Permanent::new("bad order"));
        assert_eq!(c.classify(&p), ErrorClass::Permanent);
        let nested: BoxError = Box::new(Outer(Permanent::new("deep")));
        assert_eq!(c.classify(&nested), ErrorClass::Permanent);
    }

    #[test]
    fn closures_classify() {
        let c = |e: &BoxError| {
            if e.to_string().contains("400") {
                ErrorClass::Permanent
            } else {
                ErrorClass::Retryable
            }
        };
        assert_eq!(c.classify(&"http 400".into()), ErrorClass::Permanent);
    }

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
