//! What became of a publish.

use std::fmt;
use std::time::Duration;

use crate::error::Error;

/// The broker's verdict on one publish. Only [`PublishOutcome::Confirmed`] proves the message
/// was accepted **and** routed; everything else means "do not act as if it was published"
/// (and for `TimedOut`/`Failed`, "it may or may not have been").
#[derive(Debug)]
#[non_exhaustive]
pub enum PublishOutcome {
    /// Routed and confirmed by the broker.
    Confirmed {
        /// Time from the first write to the confirm.
        latency: Duration,
    },
    /// Unroutable and mandatory: the broker returned it (`312 NO_ROUTE`).
    Returned {
        /// The reply code (312 for no route).
        reply_code: u16,
        /// The broker's reply text.
        reply_text: String,
    },
    /// The broker refused it (for example `x-overflow = reject-publish` on a full queue).
    Nacked,
    /// No confirm within the confirm timeout. Outcome unknown; `blocked` says whether a
    /// resource alarm blocked the connection while we waited (not loss: a stall).
    TimedOut {
        /// The connection was blocked by the broker at some point during the wait.
        blocked: bool,
    },
    /// The channel or connection failed before the confirm. Outcome unknown.
    ///
    /// A channel error fails every publish still unconfirmed on that channel, not only the
    /// one that caused it: a publish to an exchange that does not exist makes the broker
    /// close the channel (404), and the publishes sharing it that were not confirmed yet
    /// (up to the window, [`PublisherConfig::max_in_flight`](super::PublisherConfig)) get
    /// `Failed` too. Settlement copies treat it like any unconfirmed copy (the original is
    /// requeued); a producer that cannot afford the collateral retries keeps publishes to
    /// untrusted exchange names on a publisher of their own.
    Failed(Error),
}

impl PublishOutcome {
    /// True only for [`PublishOutcome::Confirmed`].
    pub fn is_confirmed(&self) -> bool {
        matches!(self, PublishOutcome::Confirmed { .. })
    }

    /// A short label: `confirmed`, `returned`, `nacked`, `timed-out`, `failed`.
    pub fn label(&self) -> &'static str {
        match self {
            PublishOutcome::Confirmed { .. } => "confirmed",
            PublishOutcome::Returned { .. } => "returned",
            PublishOutcome::Nacked => "nacked",
            PublishOutcome::TimedOut { .. } => "timed-out",
            PublishOutcome::Failed(_) => "failed",
        }
    }
}

impl fmt::Display for PublishOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PublishOutcome::Confirmed { latency } => write!(f, "confirmed in {latency:?}"),
            PublishOutcome::Returned {
                reply_code,
                reply_text,
            } => write!(f, "returned ({reply_code} {reply_text})"),
            PublishOutcome::Nacked => f.write_str("nacked by the broker"),
            PublishOutcome::TimedOut { blocked: true } => {
                f.write_str("no confirm in time (connection blocked by a resource alarm)")
            }
            PublishOutcome::TimedOut { blocked: false } => f.write_str("no confirm in time"),
            PublishOutcome::Failed(e) => write!(f, "failed, outcome unknown: {e}"),
        }
    }
}
