//! Carrying out a [`Decision`] against the broker.
//!
//! The one rule: the original is acked only after its retry or parking copy is
//! `Confirmed`. Returned, nacked, timed out or failed copies leave the original unacked: it is
//! nacked with requeue after a backoff that grows with consecutive failures (so a broken
//! tier does not become a hot loop), and a warning and a counter say so. Requeues asked for by
//! the handler (`Outcome::Requeue`, the manual fallback) back off per message: a message's
//! second requeue waits 100 ms, doubling with each further one, capped at 5 s. Other
//! messages' acks do not reset it, so a message requeued again and again is paced however
//! busy the subscriber is, until the requeue limit parks it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::coalesce::Original;
use crate::connection::backoff;
use crate::decide::{CopyKind, Decision, ParkReason};
use crate::publisher::{PublishOutcome, Publisher};
use crate::stats::Counters;
use crate::{Envelope, Failure};

pub use crate::manual::SettleReport;

/// Settles originals of one subscriber.
#[derive(Debug)]
pub(crate) struct Settler {
    pub(crate) publisher: Publisher,
    pub(crate) counters: Arc<Counters>,
    consecutive_failures: AtomicU32,
    max_backoff: Duration,
    /// Requeues per message, so a message requeued again and again is parked at the limit.
    pub(crate) requeues: crate::requeues::Requeues,
    /// Flips at the shutdown deadline: from then on nothing waits (stragglers are requeued
    /// at once).
    hard_stop: tokio::sync::watch::Receiver<bool>,
    /// Declares the subscriber's topology again when a copy comes back `Returned` (a tier or
    /// the parking queue was deleted under the running worker).
    redeclare: Option<Redeclare>,
}

/// Re-declares a topology after a `Returned` copy, at most once per [`REDECLARE_EVERY`]:
/// the original is requeued as for any unconfirmed copy, and its redelivery finds the queue
/// back instead of being returned until the consumer's channel happens to reopen.
pub(crate) struct Redeclare {
    pub(crate) connector: Arc<crate::connection::Connector>,
    pub(crate) topology: crate::topology::Topology,
    last: tokio::sync::Mutex<Option<std::time::Instant>>,
}

/// The bound on re-declarations after returned copies.
const REDECLARE_EVERY: Duration = Duration::from_secs(2);

impl Redeclare {
    pub(crate) fn new(
        connector: Arc<crate::connection::Connector>,
        topology: crate::topology::Topology,
    ) -> Self {
        Self {
            connector,
            topology,
            last: tokio::sync::Mutex::new(None),
        }
    }

    /// Declares the topology again unless that was done less than [`REDECLARE_EVERY`] ago.
    /// Concurrent callers wait for the one declaring and then skip.
    async fn run(&self) {
        let mut last = self.last.lock().await;
        if last.is_some_and(|t| t.elapsed() < REDECLARE_EVERY) {
            return;
        }
        *last = Some(std::time::Instant::now());
        let declared = async {
            let conn = self.connector.get(Duration::from_secs(5)).await?;
            let ch = conn
                .conn
                .create_channel()
                .await
                .map_err(crate::Error::amqp)?;
            let r = self
                .topology
                .apply(&ch, crate::topology::TopologyMode::Declare)
                .await;
            let _ = ch.close(200, "topology declared again".into()).await;
            r
        };
        match declared.await {
            Ok(()) => {
                tracing::warn!(queue = %self.topology.queue, "a settlement copy was returned (a tier or the parking queue was missing); topology declared again")
            }
            Err(e) => {
                tracing::warn!(queue = %self.topology.queue, error = %e, "a settlement copy was returned; declaring the topology again failed")
            }
        }
    }
}

impl std::fmt::Debug for Redeclare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redeclare")
            .field("queue", &self.topology.queue)
            .finish_non_exhaustive()
    }
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
            requeues: crate::requeues::Requeues::default(),
            max_backoff: Duration::from_secs(5),
            hard_stop,
            redeclare: None,
        }
    }

    /// Declares `redeclare`'s topology again when a copy is returned.
    pub(crate) fn with_redeclare(mut self, redeclare: Redeclare) -> Self {
        self.redeclare = Some(redeclare);
        self
    }

    /// Waits `pause`, or less when the shutdown deadline passes meanwhile.
    async fn pause(&self, pause: Duration) {
        let mut hard = self.hard_stop.clone();
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = hard.wait_for(|stop| *stop) => {}
        }
    }

    pub(crate) async fn execute(&self, decision: Decision, original: &Original) -> SettleReport {
        match decision {
            Decision::Nothing => SettleReport::Nothing,
            Decision::Ack => self.ack(original, SettleReport::Acked).await,
            Decision::Requeue => self.nack(original, true).await,
            Decision::Reject => self.nack(original, false).await,
            // Boxed: publishing a copy is the largest state of a settlement (about 3 KiB),
            // and every delivery's pipeline would otherwise carry it, successes included.
            Decision::Republish {
                copy,
                kind,
                failure,
            } => Box::pin(self.republish(copy, kind, failure, original)).await,
        }
    }

    /// Publishes a retry or parking copy and acks the original once it is confirmed;
    /// requeues it otherwise.
    async fn republish(
        &self,
        copy: Envelope,
        kind: CopyKind,
        failure: Failure,
        original: &Original,
    ) -> SettleReport {
        let c = &self.counters;
        // The original's channel is gone: the broker redelivers it and the
        // redelivery makes its own copy. Publishing one now would leave a copy and a
        // redelivery, a sure duplicate.
        if !original.usable() {
            tracing::debug!(copy = ?kind, "the original's channel is gone; no copy (it is redelivered)");
            return self.lost(None);
        }
        let (copy, kind) = match self.publisher.check(&copy) {
            Ok(()) => (copy, kind),
            // The body itself is over the publisher's `max_body` (the broker accepted
            // it: 3.10 takes up to 128 MiB). A trimmed copy would drop the payload and
            // the original would then be acked: the message lost. Reject it instead:
            // the broker dead-letters the whole message, body included, to the
            // parking queue (x-death reason `rejected`), and nothing loops.
            Err(e @ crate::Error::BodyTooLarge { .. }) => {
                tracing::error!(
                    copy = ?kind,
                    error = %e,
                    "settlement copy's body is over the publisher's max-body; rejecting the original to the parking queue, body kept"
                );
                return self.nack(original, false).await;
            }
            // Refused before sending: it would be refused every time, and requeueing
            // would re-run the handler for ever. Park a trimmed copy instead, or, when
            // nothing fits, reject to the work queue's dead-letter path (parking).
            Err(e) => {
                let max_body = self.publisher.config().max_body;
                let publisher = &self.publisher;
                match crate::trim::parking_copy(&copy, &e, max_body, |t| publisher.check(t).is_ok())
                {
                    Some(trimmed) => {
                        tracing::error!(
                            copy = ?kind,
                            error = %e,
                            "settlement copy can never be published as it is; parking a trimmed copy"
                        );
                        (
                            trimmed,
                            CopyKind::Park {
                                reason: ParkReason::Unpublishable,
                            },
                        )
                    }
                    None => {
                        tracing::error!(
                            copy = ?kind,
                            error = %e,
                            "settlement copy can never be published; rejecting the original to the dead-letter path"
                        );
                        return self.nack(original, false).await;
                    }
                }
            }
        };
        // Past the shutdown deadline a copy not yet handed to the publisher is not
        // sent: the original is requeued on its still-open channel. A copy already
        // handed over gets its verdict (bounded by the confirm timeout, which the
        // worker's drain waits for) before the channel closes, so a late confirm
        // never meets a closed channel and a redelivered original.
        let mut hard = self.hard_stop.clone();
        let sent = tokio::select! {
            biased;
            _ = hard.wait_for(|stop| *stop) => None,
            r = self.publisher.send(copy) => Some(r),
        };
        let outcome = match sent {
            None => {
                tracing::warn!(copy = ?kind, failure = %failure, "shutdown deadline passed before the copy was sent; requeueing the original");
                return self.nack(original, true).await;
            }
            Some(Ok(pending)) => pending.await,
            // Checked above; anything refused here is kept, visibly.
            Some(Err(e)) => PublishOutcome::Failed(e),
        };
        if outcome.is_confirmed() {
            self.consecutive_failures.store(0, Ordering::Relaxed);
            let report = match kind {
                CopyKind::Retry { .. } => {
                    Counters::inc(&c.retried);
                    SettleReport::Retried
                }
                CopyKind::Park { reason } => {
                    c.parked(reason);
                    SettleReport::Parked
                }
            };
            return self.ack(original, report).await;
        }
        Counters::inc(&c.settlement_failures);
        if let (PublishOutcome::Returned { .. }, Some(r)) = (&outcome, &self.redeclare) {
            r.run().await;
        }
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
        match self.nack(original, true).await {
            SettleReport::ChannelGone => SettleReport::ChannelGone,
            _ => SettleReport::CopyNotConfirmed(outcome.label().to_owned()),
        }
    }

    /// Carries out `decision` for the delivery known as `key` (see [`crate::requeues`]),
    /// which arrived having been requeued `seen` times, and keeps its requeue count.
    pub(crate) async fn execute_counted(
        &self,
        decision: Decision,
        original: &Original,
        key: crate::requeues::Key,
        seen: u32,
    ) -> SettleReport {
        // A requeue on a channel that is gone is no requeue: the broker gives the message
        // back by itself, and a pause would only hold the delivery's slot.
        if matches!(decision, Decision::Requeue) && original.usable() {
            // This message's own requeues pace it: the second waits, and each further one
            // longer, whatever happens to the subscriber's other messages.
            let before = self.requeues.get(key).max(seen);
            if before > 0 {
                self.pause(backoff(before, self.max_backoff)).await;
            }
            // Counted before the nack: the broker may redeliver before `execute` returns.
            // A nack that finds its channel gone still brings the message back: it counts.
            self.requeues.bump(key, seen);
        }
        // Every failed attempt settles through here with its copy, manual settlements
        // (`Settle::park`, `Settle::retry`) included.
        if let Decision::Republish { failure, .. } = &decision {
            self.counters.failed(&failure.kind);
        }
        let report = self.execute(decision, original).await;
        match report {
            SettleReport::Acked
            | SettleReport::Retried
            | SettleReport::Parked
            | SettleReport::Rejected => self.requeues.forget(key),
            _ => {}
        }
        report
    }

    /// Acks the original, or holds its ack when acks are coalesced: the channel's ledger
    /// then sends it (and counts it) within the coalescing bounds.
    async fn ack(&self, original: &Original, report: SettleReport) -> SettleReport {
        // Taken before holding: a held ack is a settlement in progress, and nothing else
        // may settle the delivery meanwhile.
        if !original.take() {
            return self.lost(None);
        }
        if original.hold() {
            return report;
        }
        // The ack's frame is queued on the first poll (in channel order: the settlement is
        // made); its write is awaited and counted by the channel's collector, so this
        // pipeline is not woken from lapin's I/O thread once more per delivery.
        let write = original.ack_write();
        #[cfg(feature = "otel")]
        let write: crate::coalesce::writes::Write = Box::pin(tracing::Instrument::instrument(
            write,
            crate::observe::otel::settle_span(&self.counters.queue, "ack"),
        ));
        let mut write = write;
        let sent = match futures_util::FutureExt::now_or_never(&mut write) {
            Some(sent) => sent,
            None => match original.hand_over(write) {
                Ok(()) => return report,
                Err(write) => write.await,
            },
        };
        if crate::coalesce::writes::count(&self.counters, sent) {
            report
        } else {
            SettleReport::ChannelGone
        }
    }

    /// Gives a delivery back (requeue) or dead-letters it. Sent as `basic.reject`, which
    /// means the same as a single `basic.nack` except on RabbitMQ 4.3+ quorum queues:
    /// there a requeue by `basic.nack` no longer counts toward the delivery limit, and one
    /// by `basic.reject` still does. With reject, the broker's delivery limit bounds a
    /// requeue loop on every version alike.
    async fn nack(&self, original: &Original, requeue: bool) -> SettleReport {
        let reject = original.reject(requeue);
        #[cfg(feature = "otel")]
        let reject = tracing::Instrument::instrument(
            reject,
            crate::observe::otel::settle_span(&self.counters.queue, "reject"),
        );
        let sent = reject.await;
        // Written (or its channel gone): a coalesced multiple ack may now pass this tag.
        original.done();
        match sent {
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
        crate::coalesce::writes::lost(&self.counters, err);
        SettleReport::ChannelGone
    }
}
