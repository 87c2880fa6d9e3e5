//! The per-delivery pipeline: build, run the handler (deadline, panics, immediate
//! retries), decide, settle. Running and deciding are shared with the test kit
//! (`crate::run`); this file adds the broker: the settle handle, the shutdown cut-off, the
//! settler.

use std::sync::Arc;

use futures_util::FutureExt;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::coalesce::{OnChannel, Original};
use crate::decide::{self, SettleSpec};
use crate::delivery::{Delivery, Extensions};
use crate::manual::{SettleReport, SettleSink};
use crate::observe::{log, span};
use crate::outcome::Outcome;
use crate::policy::AckPolicy;
use crate::run::{Link, LinkedSink, Runner};
use crate::settle::Settler;
use crate::stats::Counters;

pub(super) struct Pipeline {
    pub(super) runner: Runner,
    pub(super) settler: Arc<Settler>,
    pub(super) extensions: Arc<Extensions>,
    pub(super) hard_stop: watch::Receiver<bool>,
    pub(super) spans: span::SpanInfo,
}

/// The right to settle one delivery, held by its pipeline from the moment the delivery is
/// taken until the pipeline ends, however it ends. Settling goes through [`Original`],
/// which is single-use, or hands the ack to the channel's ledger when acks are coalesced (a held
/// ack is a settlement in progress: the ledger sends it, or the channel dies and the broker
/// redelivers). When this guard drops and the delivery is neither (a panic in the
/// classifier, an error's `Display`, header parsing; a cancelled future; any path that
/// forgot to settle), it is nack-requeued instead of holding a prefetch slot until the
/// channel dies.
struct Unsettled {
    original: Original,
    counters: Arc<Counters>,
}

impl Drop for Unsettled {
    fn drop(&mut self) {
        // Settled already, held, or the channel is gone (the broker redelivers).
        if !self.original.usable() {
            return;
        }
        // `Channel::basic_nack` queues the frame on its first poll (lapin 4.12
        // `send_method_frame`): one poll sends it, no runtime needed. Only a coalescing
        // ledger waits for the write (its multiple acks must not overtake it).
        let original = self.original.clone();
        let mut nack = Box::pin(async move { original.nack_requeue().await });
        match (&mut nack).now_or_never() {
            Some(sent) => {
                self.original.done();
                match sent {
                    Ok(true) => Counters::inc(&self.counters.requeued),
                    _ => Counters::inc(&self.counters.ack_lost),
                }
            }
            None => {
                Counters::inc(&self.counters.requeued);
                self.original.done_after(nack);
            }
        }
        tracing::error!(
            "a delivery was left unsettled (a panic outside the handler, or its pipeline was cancelled); requeued"
        );
    }
}

/// Where a manual handler's settle requests go. A settlement, once asked for, runs on its
/// own task: the handler's future may be dropped (its deadline, a tower `Timeout`, a
/// `select!`) without cutting a copy from its ack. The pipeline awaits the task before it
/// ends, so shutdown's drain covers it.
struct RuntimeSink {
    spec: Arc<SettleSpec>,
    settler: Arc<Settler>,
    original: Original,
    key: crate::requeues::Key,
    link: Link,
    started: std::sync::Mutex<Option<JoinHandle<()>>>,
}

impl LinkedSink for RuntimeSink {
    fn link(&self) -> &Link {
        &self.link
    }
}

impl RuntimeSink {
    /// Waits for the settlement the handler started, if any.
    async fn finish(&self) {
        let started = self
            .started
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(task) = started
            && let Err(e) = task.await
        {
            // The delivery's guard requeues it.
            tracing::error!(error = %e, "a manual settlement panicked");
        }
    }
}

impl SettleSink for RuntimeSink {
    fn settle(
        &self,
        outcome: Outcome,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = SettleReport> + Send + '_>> {
        let Some(delivery) = self.link.get() else {
            return Box::pin(std::future::ready(SettleReport::Nothing));
        };
        let (tx, rx) = oneshot::channel();
        let (spec, settler, original) = (
            self.spec.clone(),
            self.settler.clone(),
            self.original.clone(),
        );
        let key = self.key;
        let task = tokio::spawn(async move {
            let decision = decide::auto(&spec, &delivery, outcome);
            let report = settler
                .execute_counted(decision, &original, key, delivery.requeues())
                .await;
            let _ = tx.send(report);
        });
        *self.started.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
        Box::pin(async move {
            // A settlement that panicked left the delivery to its guard, which requeues it.
            rx.await.unwrap_or(SettleReport::Requeued)
        })
    }
}

impl Pipeline {
    /// Runs one delivery to its settlement on `on`, the channel it came from (the consume
    /// loop registered its tag with the channel's ledger, if acks are coalesced).
    /// `slot` is the delivery's concurrency slot. `lost` flips when the channel is lost:
    /// the slot is then given back at once (the broker redelivers the message, and this
    /// settlement can no longer reach it); a handler with a deadline runs on until it
    /// returns or the deadline cuts it, one without a deadline is cut off at once.
    pub(super) async fn process(
        &self,
        raw: lapin::message::Delivery,
        on: Arc<OnChannel>,
        mut lost: watch::Receiver<bool>,
        slot: tokio::sync::OwnedSemaphorePermit,
    ) {
        let mut slot = Some(slot);
        let spec = &self.runner.spec;
        let c = &self.runner.counters;
        Counters::inc(&c.consumed);
        let _in_flight = c.enter();
        let lapin::message::Delivery {
            delivery_tag,
            exchange,
            routing_key,
            redelivered,
            properties,
            data,
            acker,
            ..
        } = raw;
        if !acker.usable() {
            // Buffered before its channel died: it will be redelivered.
            Counters::inc(&c.ack_lost);
            return;
        }
        let original = Original::new(on, acker, delivery_tag);
        let _guard = Unsettled {
            original: original.clone(),
            counters: c.clone(),
        };
        if spec.policy == AckPolicy::AckFirst {
            // Never held: at-most-once means the ack is written before the handler runs.
            let sent = original.ack().await;
            original.done();
            match sent {
                Ok(true) => {
                    Counters::inc(&c.acked);
                    Counters::inc(&c.ack_frames);
                }
                _ => {
                    Counters::inc(&c.ack_lost);
                    return;
                }
            }
        }
        let key = self.settler.requeues.key(
            &properties,
            &data,
            (exchange.as_str(), routing_key.as_str()),
        );
        let requeues = self
            .settler
            .requeues
            .get(key)
            .max(crate::requeues::broker_count(&properties));
        let verdict = spec
            .trust
            .judge(properties.headers().as_ref(), &data, &spec.queue);
        let mut builder = Delivery::builder(spec.queue.clone(), data)
            .requeues(requeues)
            .route(exchange.as_str(), routing_key.as_str())
            .redelivered(redelivered)
            .extensions(self.extensions.clone());
        if verdict == crate::trust::Verdict::Signed {
            builder = builder.signed_headers();
        } else if !verdict.trusted() {
            // Logged below with the attempt header's other problems.
            Counters::inc(&c.untrusted_headers);
            builder = builder.ignore_own_headers(verdict.as_str());
        }
        // A signature that does not verify is a forgery, or workers that do not share a
        // key: parked without running the handler (retrying it would restart its attempts
        // at 1 on every copy, for ever).
        let forged = verdict == crate::trust::Verdict::BadSignature;
        let builder = builder.properties(properties);
        // Transactional mode (feature `postgres`): the inbox's part, `crate::inbox::Txn`, gives
        // the handler its transaction slot here, claims and runs below, commits or rolls back
        // before settling. `None` in every other mode.
        #[cfg(feature = "postgres")]
        let (txn, builder) = match crate::inbox::Txn::for_delivery(spec.policy, &self.extensions) {
            Some((txn, ext)) => (Some(txn), builder.extensions(ext)),
            None => (None, builder),
        };
        let (delivery, manual) = self.runner.delivery(builder, || {
            Arc::new(RuntimeSink {
                spec: spec.clone(),
                settler: self.settler.clone(),
                original: original.clone(),
                key,
                link: Link::default(),
                started: std::sync::Mutex::new(None),
            })
        });
        if let Some(f) = &delivery.attempt().forged_header {
            tracing::warn!(
                queue = %spec.queue,
                message_id = ?delivery.message_id(),
                routing_key = %delivery.routing_key(),
                problem = %f,
                "ignoring rabbitkit headers on this delivery (unusable, or not written by rabbitkit)"
            );
        }
        let span = span::process(
            &self.spans,
            spec,
            &delivery,
            span::Raw {
                delivery_tag,
                redelivered,
            },
        );
        async {
            let mut hard = self.hard_stop.clone();
            let started = std::time::Instant::now();
            let mut channel_lost = false;
            let run = async {
                if forged {
                    return Outcome::Park(crate::outcome::Failure::new(
                        crate::decide::ParkReason::BadSignature.as_str(),
                        "rabbitkit's headers carry a signature that does not verify with this worker's keys, or was made for another queue",
                    ));
                }
                #[cfg(feature = "postgres")]
                if let Some(txn) = &txn {
                    return txn.run(&self.runner, &delivery).await;
                }
                self.runner.run(&delivery).await
            };
            tokio::pin!(run);
            let outcome = loop {
                tokio::select! {
                    o = &mut run => break Some(o),
                    _ = hard.wait_for(|v| *v) => break None,
                    // `Err` (the channel's loop ended without a loss) is no loss.
                    Ok(_) = lost.wait_for(|v| *v), if slot.is_some() => {
                        drop(slot.take());
                        if self.runner.deadline.is_none() {
                            channel_lost = true;
                            break None;
                        }
                    }
                }
            };
            c.handler_ran(started.elapsed());
            if channel_lost {
                tracing::info!(
                    handler = %spec.handler,
                    queue = %spec.queue,
                    message_id = delivery.message_id().unwrap_or(""),
                    "handler cut off: its channel is gone and the broker redelivers the message"
                );
            } else if outcome.is_none() {
                c.stragglers
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::warn!(
                    handler = %spec.handler,
                    queue = %spec.queue,
                    message_id = delivery.message_id().unwrap_or(""),
                    "handler cut off at the shutdown deadline; requeueing the message"
                );
            }
            let concluded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.runner.conclude(&delivery, outcome, manual.as_ref())
            }));
            let decision = concluded.unwrap_or_else(|panic| {
                let msg = crate::run::panic_message(panic.as_ref());
                tracing::error!(handler = %spec.handler, queue = %spec.queue, panic = %msg, "deciding the settlement panicked; parking the message");
                decide::park_after_panic(spec, &delivery, msg)
            });
            span::decided(&decision);
            log::attempt_failed(spec, &delivery, &decision);
            let parked = log::parking_reason(&decision);
            if let Some(m) = &manual {
                m.sink.finish().await;
            }
            // Transactional mode: COMMIT before an ack (a failed commit requeues), ROLLBACK
            // before anything else.
            #[cfg(feature = "postgres")]
            let decision = match &txn {
                Some(txn) => txn.finish(decision, &delivery).await,
                None => decision,
            };
            let report = self
                .settler
                .execute_counted(decision, &original, key, delivery.requeues())
                .await;
            log::settled(spec, &delivery, parked, &report);
            tracing::debug!(?report, "settled");
        }
        .instrument(span)
        .await;
    }
}
