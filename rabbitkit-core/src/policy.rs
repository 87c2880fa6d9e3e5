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
    /// commit to a database first). A clean return without settling applies the fallback;
    /// a failure without a settlement (a decode rejection, a panic, a deadline overrun, an
    /// error) is decided as in `Auto`: poison parks at once, the rest is retried or parked.
    Manual,
    /// Errors are nacked without requeue: the broker dead-letters them to the parking queue
    /// (no evidence headers, `x-death` reason `rejected`). Explicit outcomes are honoured.
    NackOnError,
    /// At-most-once: ack on receipt, before the handler runs. A crash or failure loses the
    /// message. Only for data that may be lost.
    AckFirst,
    /// Exactly-once effects in Postgres (feature `postgres`; `docs/EXACTLY-ONCE.md`): each
    /// delivery is claimed in the worker's inbox ([`Worker::postgres`](crate::Worker)) inside
    /// a transaction the handler writes through (the `Tx` extractor); `Ok` commits, then
    /// acks; a committed duplicate is acked without running; failures roll back and are
    /// decided as in `Auto` (no immediate in-process retries: the transaction is spent).
    /// Refused at start without the feature or without an inbox.
    Transactional,
}

/// What happens when a manual-mode handler returns cleanly (`Ok`) without settling.
///
/// Only a clean return reaches the fallback: a handler that failed without settling (its
/// payload did not decode, it panicked, overran its deadline or returned an error) gets the
/// auto decision (park at once, or retry then park), whatever the fallback says, so no
/// fallback acks a message its handler did not process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ManualFallback {
    /// Nack with requeue and log a warning (the default): never a leaked unacked message.
    #[default]
    NackRequeue,
    /// What `Auto` does with a clean return: ack. Kept for configurations that name it;
    /// the same as `Ack` since failures always take the auto decision.
    Auto,
    /// Ack: the handler ran to its end and chose to leave the message settled.
    Ack,
    /// Nack without requeue (dead-lettered to parking).
    Reject,
}
