//! Carrying out a [`Decision`] against the broker.
//!
//! The one rule: the original is acked only after its retry or parking copy is
//! `Confirmed`. Returned, nacked, timed out or failed copies leave the original unacked: it is
//! nacked with requeue after a backoff that grows with consecutive failures (so a broken
//! tier does not become a hot loop), and a warning and a counter say so. Requeues asked for by
//! the handler (`Outcome::Requeue`, the manual fallback) back off the same way from the
//! second one in a row (100 ms, doubling, capped at 5 s; reset by any ack).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use lapin::Acker;
use lapin::options::{BasicAckOptions, BasicNackOptions};

use crate::connection::backoff;
use crate::decide::{CopyKind, Decision};
use crate::publisher::{PublishOutcome, Publisher};
use crate::stats::Counters;

/// What became of a settlement.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SettleReport {
    /// The original was acked.
    Acked,
    /// A retry copy was confirmed, then the original acked.
    Retried,
    /// A parking copy was confirmed, then the original acked.
    Parked,
    /// The original was nacked with requeue.
    Requeued,
    /// The original was nacked without requeue.
    Rejected,
    /// The copy was not confirmed (the label says why); the original was requeued.
    CopyNotConfirmed(String),
    /// The channel of the original is gone; the broker will redeliver it.
    ChannelGone,
    /// Nothing to do (already settled).
    Nothing,
}

/// Settles originals of one subscriber.
#[derive(Debug)]
pub(crate) struct Settler {
    pub(crate) publisher: Publisher,
    pub(crate) counters: Arc<Counters>,
    consecutive_failures: AtomicU32,
    /// Requeues since the last ack: a handler (or a manual fallback) that requeues every
    /// delivery would otherwise spin the broker and the worker in a hot loop.
    requeue_streak: AtomicU32,
    max_backoff: Duration,
    /// Flips at the shutdown deadline: from then on nothing waits (stragglers are requeued
    /// at once).
    hard_stop: tokio::sync::watch::Receiver<bool>,
}

impl Settler {
    pub(crate) fn new(
        publisher: Publisher,
        counters: Arc<Counters>,
        hard_stop: tokio::sync::watch::Receiver<bool>,
    ) -> Self {
        Self {
            publisher,
            counters,
            consecutive_failures: AtomicU32::new(0),
            requeue_streak: AtomicU32::new(0),
            max_backoff: Duration::from_secs(5),
            hard_stop,
        }
    }

    /// Waits `pause`, or less when the shutdown deadline passes meanwhile.
    async fn pause(&self, pause: Duration) {
        let mut hard = self.hard_stop.clone();
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = hard.wait_for(|stop| *stop) => {}
        }
    }

    pub(crate) async fn execute(&self, decision: Decision, acker: &Acker) -> SettleReport {
        let c = &self.counters;
        match decision {
            Decision::Nothing => SettleReport::Nothing,
            Decision::Ack => self.ack(acker, SettleReport::Acked).await,
            Decision::Requeue => {
                let streak = self.requeue_streak.fetch_add(1, Ordering::Relaxed);
                if streak > 0 {
                    self.pause(backoff(streak, self.max_backoff)).await;
                }
                self.nack(acker, true).await
            }
            Decision::Reject => self.nack(acker, false).await,
            Decision::Republish {
                copy,
                kind,
                failure,
            } => {
                let outcome = match self.publisher.publish(copy).await {
                    Ok(o) => o,
                    // An invalid copy (e.g. a header over the frame budget) is not publishable:
                    // keep the original, visibly.
                    Err(e) => PublishOutcome::Failed(e),
                };
                if outcome.is_confirmed() {
                    self.consecutive_failures.store(0, Ordering::Relaxed);
                    let (counter, report) = match kind {
                        CopyKind::Retry { .. } => (&c.retried, SettleReport::Retried),
                        CopyKind::Park { .. } => (&c.parked, SettleReport::Parked),
                    };
                    Counters::inc(counter);
                    return self.ack(acker, report).await;
                }
                Counters::inc(&c.settlement_failures);
                let n = self.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
                let pause = backoff(n, self.max_backoff);
                tracing::warn!(
                    copy = ?kind,
                    outcome = %outcome,
                    failure = %failure,
                    requeue_in = ?pause,
                    "settlement copy not confirmed; the original is NOT acked and will be requeued"
                );
                self.pause(pause).await;
                match self.nack(acker, true).await {
                    SettleReport::ChannelGone => SettleReport::ChannelGone,
                    _ => SettleReport::CopyNotConfirmed(outcome.label().to_owned()),
                }
            }
        }
    }

    async fn ack(&self, acker: &Acker, report: SettleReport) -> SettleReport {
        match acker.ack(BasicAckOptions::default()).await {
            Ok(true) => {
                Counters::inc(&self.counters.acked);
                self.requeue_streak.store(0, Ordering::Relaxed);
                report
            }
            other => self.lost(other.err()),
        }
    }

    async fn nack(&self, acker: &Acker, requeue: bool) -> SettleReport {
        let opts = BasicNackOptions {
            multiple: false,
            requeue,
        };
        match acker.nack(opts).await {
            Ok(true) if requeue => {
                Counters::inc(&self.counters.requeued);
                SettleReport::Requeued
            }
            Ok(true) => {
                Counters::inc(&self.counters.rejected);
                SettleReport::Rejected
            }
            other => self.lost(other.err()),
        }
    }

    fn lost(&self, err: Option<lapin::Error>) -> SettleReport {
        Counters::inc(&self.counters.ack_lost);
        match err {
            Some(e) => {
                tracing::warn!(error = %e, "settle failed: channel gone, the broker will redeliver")
            }
            None => tracing::warn!("settle found its channel gone; the broker will redeliver"),
        }
        SettleReport::ChannelGone
    }
}
