//! How outcomes become settlements: the ack policy.

use serde::Deserialize;

/// How a subscriber settles its deliveries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AckPolicy {
    /// Ok → ack; error → classified (retryable by default, permanent parks); explicit
    /// outcomes are honoured. Retry and parking copies are confirmed before the ack.
    #[default]
    Auto,
    /// The handler settles through a [`Settle`](crate::Settle) handle (for handlers that
    /// commit to a database first). Returning without settling applies the fallback.
    Manual,
    /// Errors are nacked without requeue: the broker dead-letters them to the parking queue
    /// (no evidence headers, `x-death` reason `rejected`). Explicit outcomes are honoured.
    NackOnError,
    /// At-most-once: ack on receipt, before the handler runs. A crash or failure loses the
    /// message. Only for data that may be lost.
    AckFirst,
}

/// What happens when a manual-mode handler returns without settling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ManualFallback {
    /// Nack with requeue and log a warning (the default): never a leaked unacked message.
    #[default]
    NackRequeue,
    /// Apply the `Auto` policy to what the handler returned.
    Auto,
    /// Ack anyway.
    Ack,
    /// Nack without requeue (dead-lettered to parking).
    Reject,
}
