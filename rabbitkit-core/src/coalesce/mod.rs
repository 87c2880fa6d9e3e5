//! Ack coalescing: a run of successes on one channel settled with one
//! `basic.ack multiple=true`.
//!
//! Off by default. When on ([`Subscriber::ack_coalescing`](crate::Subscriber::ack_coalescing)),
//! an ack that is due (a success, or a failure whose retry or parking copy is confirmed) is
//! held instead of sent. The held acks of a channel are flushed when `max_acks` of them have
//! accumulated or `max_delay` has passed since the first of them, whichever comes first, and
//! before the channel is closed at shutdown or after a broker cancel.
//!
//! A flush sends one `basic.ack multiple=true` on the highest tag `T` such that every
//! delivery of that channel with a tag up to `T` that is not settled yet is a held ack: never
//! across a delivery whose handler is still running, whose copy is being published, or whose
//! nack or reject has not been written yet, since a multiple ack would ack those too. Held
//! acks above such a delivery wait for the next flush; a flush forced by the delay, by a full
//! batch that cannot be coalesced, or by shutdown sends them one by one. Each ack goes on the
//! channel its delivery came from, never on a replacement.
//!
//! The price is a wider duplicate window: acks held when the connection or the process dies
//! are never sent, and the broker redelivers those messages (at most `max_acks` per channel,
//! counted as `ack_lost` when the channel is found gone). Nothing is lost: a held ack is a
//! settlement in progress, and until it is written the broker still holds the message.

mod ledger;
pub(crate) mod writes;

use std::time::Duration;

use serde::Deserialize;

pub(crate) use ledger::{ChannelAcks, OnChannel, Original};
pub(crate) use writes::ChannelWrites;

/// The longest [`AckCoalescing::max_delay`] accepted: a held ack holds a prefetch slot and
/// widens the duplicate window; longer delays buy nothing once a batch fills.
pub const MAX_COALESCING_DELAY: Duration = Duration::from_secs(1);

/// How a subscriber coalesces its acks (see the [module docs](self)). In a worker config
/// file: `ack-coalescing = { max-acks = 32, max-delay = "5ms" }` in a `[[subscribers]]`
/// table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct AckCoalescing {
    /// Held acks that trigger a flush (1..=prefetch; 1 sends every ack at once). Held acks
    /// keep their prefetch slots: at most half the prefetch keeps deliveries flowing while
    /// a batch fills.
    pub max_acks: u16,
    /// The longest an ack is held (at most [`MAX_COALESCING_DELAY`]; `0` flushes as soon as
    /// the channel's flusher runs, coalescing only what arrived meanwhile).
    #[serde(with = "humantime_serde")]
    pub max_delay: Duration,
}

impl AckCoalescing {
    /// Flush at `max_acks` held acks or `max_delay` after the first one.
    pub fn new(max_acks: u16, max_delay: Duration) -> Self {
        Self {
            max_acks,
            max_delay,
        }
    }

    /// Checks the bounds, against the subscriber's `prefetch` when known: the offending
    /// key (`max-acks` or `max-delay`) and what is wrong.
    pub(crate) fn check(&self, prefetch: Option<u16>) -> Result<(), (&'static str, String)> {
        if self.max_acks == 0 {
            return Err(("max-acks", "must be at least 1".into()));
        }
        if let Some(p) = prefetch.filter(|p| self.max_acks > *p) {
            return Err((
                "max-acks",
                format!(
                    "must be at most the prefetch ({p}), got {}: held acks keep their \
                     prefetch slots, so a larger batch never fills",
                    self.max_acks
                ),
            ));
        }
        if self.max_delay > MAX_COALESCING_DELAY {
            return Err((
                "max-delay",
                format!(
                    "must be at most {}, got {}",
                    humantime::format_duration(MAX_COALESCING_DELAY),
                    humantime::format_duration(self.max_delay)
                ),
            ));
        }
        Ok(())
    }
}

/// Awaits a channel's ack task (the coalescing flusher, the write collector) as its channel
/// closes. Its acks resolve once written or fail with the channel: bounded in practice; the
/// bound only guards a shutdown against a stuck connection.
async fn join_bounded(task: tokio::task::JoinHandle<()>, what: &str) {
    if tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .is_err()
    {
        tracing::warn!(
            "{what} were not written in time; they stay queued ahead of the channel's close, and should the connection fail first the broker redelivers their messages"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_checked_against_the_prefetch() {
        let ms = Duration::from_millis;
        assert!(AckCoalescing::new(32, ms(5)).check(Some(64)).is_ok());
        assert!(AckCoalescing::new(1, ms(0)).check(Some(1)).is_ok());
        assert!(
            AckCoalescing::new(64, MAX_COALESCING_DELAY)
                .check(Some(64))
                .is_ok()
        );
        assert!(AckCoalescing::new(500, ms(5)).check(None).is_ok());
        let key = |c: AckCoalescing, p| c.check(p).err();
        let (k, _) = key(AckCoalescing::new(0, ms(5)), None).unwrap_or_default();
        assert_eq!(k, "max-acks");
        let (k, m) = key(AckCoalescing::new(65, ms(5)), Some(64)).unwrap_or_default();
        assert_eq!(k, "max-acks");
        assert!(m.contains("prefetch (64)"), "{m}");
        let (k, _) = key(AckCoalescing::new(8, ms(1001)), Some(64)).unwrap_or_default();
        assert_eq!(k, "max-delay");
    }
}
