//! What the runtime would do with a delivery, with readable assertions.

use std::fmt;
use std::time::Duration;

use lapin::types::AMQPValue;

use crate::decide::{CopyKind, Decision, ParkReason};
use crate::envelope::Envelope;
use crate::headers;
use crate::outcome::Failure;
use crate::stats::SubscriberStats;

/// Who settled the delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SettledBy {
    /// The subscriber's ack policy, from what the handler returned.
    Policy,
    /// A manual-mode handler, through its [`Settle`](crate::Settle) handle.
    Handler,
    /// The manual fallback: the handler returned cleanly without settling (a manual
    /// handler that failed without settling is settled by the [`SettledBy::Policy`]).
    Fallback,
    /// `AckPolicy::AckFirst`: acked on receipt, before the handler ran.
    Receipt,
}

/// The settlement the runtime would carry out for one delivery: the [`Decision`] made by
/// the same code the worker runs, the copy it would publish, and how it got there.
///
/// A retry or parking copy is published with confirms and `mandatory`, and the original is
/// acked only once the copy is confirmed; the kit reports the decision, as if the broker
/// confirmed every copy.
#[derive(Debug)]
pub struct Settlement {
    pub(crate) decision: Decision,
    pub(crate) settled_by: SettledBy,
    pub(crate) runs: u32,
    pub(crate) stats: SubscriberStats,
}

impl Settlement {
    /// The decision, as the runtime's settler receives it.
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// The decision, by value.
    pub fn into_decision(self) -> Decision {
        self.decision
    }

    /// `ack`, `retry`, `park`, `requeue`, `reject` or `none` ([`Decision::label`]).
    pub fn label(&self) -> &'static str {
        self.decision.label()
    }

    /// Who settled it.
    pub fn settled_by(&self) -> SettledBy {
        self.settled_by
    }

    /// How many times the handler (the subscriber's service, layers included) ran,
    /// immediate retries included.
    pub fn runs(&self) -> u32 {
        self.runs
    }

    /// The counters this delivery moved that do not depend on the broker: `panics`,
    /// `timeouts`, `unsettled`.
    pub fn stats(&self) -> SubscriberStats {
        self.stats
    }

    /// The original is acked: on success, by a manual `ack`, by a fallback, or on receipt
    /// under `AckFirst`. Retries and parks also end in an ack, after their copy is
    /// confirmed; they answer `false` here (use [`is_retry`](Self::is_retry),
    /// [`is_parked`](Self::is_parked)).
    pub fn is_ack(&self) -> bool {
        matches!(self.decision, Decision::Ack)
            || (self.settled_by == SettledBy::Receipt && matches!(self.decision, Decision::Nothing))
    }

    /// A retry copy goes to a delay tier.
    pub fn is_retry(&self) -> bool {
        self.tier().is_some()
    }

    /// A retry copy goes to the delay tier of exactly `delay`.
    pub fn is_retry_after(&self, delay: Duration) -> bool {
        self.tier() == Some(delay)
    }

    /// A parking copy goes to the parking queue.
    pub fn is_parked(&self) -> bool {
        self.park_reason().is_some()
    }

    /// A parking copy goes to the parking queue for `reason`.
    pub fn is_parked_with(&self, reason: ParkReason) -> bool {
        self.park_reason() == Some(reason)
    }

    /// The original is nacked with requeue.
    pub fn is_requeue(&self) -> bool {
        matches!(self.decision, Decision::Requeue)
    }

    /// The original is nacked without requeue (the broker dead-letters it).
    pub fn is_reject(&self) -> bool {
        matches!(self.decision, Decision::Reject)
    }

    /// The delay tier of a retry.
    pub fn tier(&self) -> Option<Duration> {
        match self.kind()? {
            CopyKind::Retry { tier, .. } => Some(tier),
            CopyKind::Park { .. } => None,
        }
    }

    /// The attempt number the retry copy carries (the next delivery's attempt).
    pub fn next_attempt(&self) -> Option<u32> {
        match self.kind()? {
            CopyKind::Retry { next_attempt, .. } => Some(next_attempt),
            CopyKind::Park { .. } => None,
        }
    }

    /// Why a copy is parked.
    pub fn park_reason(&self) -> Option<ParkReason> {
        match self.kind()? {
            CopyKind::Park { reason } => Some(reason),
            CopyKind::Retry { .. } => None,
        }
    }

    /// The failure a retry or parking copy records.
    pub fn failure(&self) -> Option<&Failure> {
        match &self.decision {
            Decision::Republish { failure, .. } => Some(failure),
            _ => None,
        }
    }

    /// The copy that would be published: exchange, routing key, properties, body.
    pub fn copy(&self) -> Option<&Envelope> {
        match &self.decision {
            Decision::Republish { copy, .. } => Some(copy),
            _ => None,
        }
    }

    /// A header of the copy.
    pub fn header(&self, name: &str) -> Option<&AMQPValue> {
        self.copy()?.header_value(name)
    }

    /// A string header of the copy (long or short string).
    pub fn header_str(&self, name: &str) -> Option<String> {
        headers::string(self.header(name)?)
    }

    /// An integer header of the copy (any integer width).
    pub fn header_int(&self, name: &str) -> Option<i64> {
        headers::int(self.header(name)?)
    }

    fn kind(&self) -> Option<CopyKind> {
        match &self.decision {
            Decision::Republish { kind, .. } => Some(*kind),
            _ => None,
        }
    }
}

/// One line for assertion messages: `retry to orders.retry/orders.delay.5s (attempt 2):
/// error: db down`.
impl fmt::Display for Settlement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.decision {
            Decision::Republish {
                copy,
                kind,
                failure,
            } => {
                write!(
                    f,
                    "{} to {:?}/{}",
                    self.label(),
                    copy.exchange_name(),
                    copy.routing_key()
                )?;
                match kind {
                    CopyKind::Retry { next_attempt, .. } => write!(f, " (attempt {next_attempt})")?,
                    CopyKind::Park { reason } => write!(f, " ({})", reason.as_str())?,
                }
                write!(f, ": {failure}")
            }
            _ if self.is_ack() => f.write_str("ack"),
            _ => f.write_str(self.label()),
        }?;
        write!(
            f,
            " [settled by {:?}, {} run(s)]",
            self.settled_by, self.runs
        )
    }
}
