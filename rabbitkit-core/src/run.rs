//! Running the handler on one delivery and reaching its [`Decision`]: deadline, panics,
//! immediate retries, the manual-mode bookkeeping, then [`decide::decide`].
//!
//! The worker's pipeline and the broker-free test kit both call this code, so a handler test
//! that passes means production settles the same way.

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt;
use tower::{Service, ServiceExt};

use crate::decide::{self, Decision, SettleSpec};
use crate::delivery::{Delivery, DeliveryBuilder};
use crate::manual::{Settle, SettleSink};
use crate::outcome::{ErrorClass, Failure, Outcome};
use crate::policy::AckPolicy;
use crate::stats::Counters;
use crate::subscriber::BoxDeliveryService;

/// The delivery a manual-mode sink settles. Set once the delivery is built (the delivery
/// holds the handle, which holds the sink), cleared when the handler is done: that breaks
/// the delivery ↔ handle cycle, and a settle arriving later finds nothing to settle.
#[derive(Debug, Default)]
pub(crate) struct Link(Mutex<Option<Delivery>>);

impl Link {
    fn set(&self, d: Option<Delivery>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = d;
    }

    /// The linked delivery; `None` (with a warning) once the handler has returned.
    pub(crate) fn get(&self) -> Option<Delivery> {
        let d = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if d.is_none() {
            tracing::warn!("settle after the handler returned: the fallback already applied");
        }
        d
    }
}

/// A sink that settles the delivery it is linked to.
pub(crate) trait LinkedSink: SettleSink + Sized {
    fn link(&self) -> &Link;
}

/// A manual-mode delivery's settle handle and the sink behind it.
pub(crate) struct Manual<S> {
    pub(crate) settle: Settle,
    pub(crate) sink: Arc<S>,
}

/// One subscriber's handler with what running it depends on.
pub(crate) struct Runner {
    pub(crate) spec: Arc<SettleSpec>,
    // BoxCloneService is Send but not Sync; each run clones it out under the lock.
    pub(crate) service: Mutex<BoxDeliveryService>,
    pub(crate) deadline: Option<Duration>,
    pub(crate) counters: Arc<Counters>,
}

impl Runner {
    /// Builds the delivery the handler sees; in manual mode with a settle handle whose
    /// requests go to `sink`, linked to the delivery.
    pub(crate) fn delivery<S: LinkedSink>(
        &self,
        builder: DeliveryBuilder,
        sink: impl FnOnce() -> Arc<S>,
    ) -> (Delivery, Option<Manual<S>>) {
        let manual = (self.spec.policy == AckPolicy::Manual).then(|| {
            let sink = sink();
            Manual {
                settle: Settle::new(sink.clone() as Arc<dyn SettleSink>),
                sink,
            }
        });
        let delivery = builder
            .settle(manual.as_ref().map(|m| m.settle.clone()))
            .build();
        if let Some(m) = &manual {
            m.sink.link().set(Some(delivery.clone()));
        }
        (delivery, manual)
    }

    /// Runs the handler, re-running retryable failures in-process up to
    /// `immediate_retries` times (never in manual mode: the handler may have settled).
    pub(crate) async fn run(&self, delivery: &Delivery) -> Outcome {
        let mut immediate = 0u32;
        loop {
            let outcome = self.run_once(delivery).await;
            let retryable = match &outcome {
                Outcome::Retry { after: None, .. } => true,
                Outcome::Error(e) => self.spec.classifier.classify(e) == ErrorClass::Retryable,
                _ => false,
            };
            // Transactional mode: a failed run has spent (or aborted) its transaction, so
            // it is never re-run in place (crate::inbox).
            let manual = matches!(
                self.spec.policy,
                AckPolicy::Manual | AckPolicy::Transactional
            );
            if retryable && !manual && immediate < self.spec.retry.immediate_retries {
                let pause = self.spec.retry.immediate_pause(immediate);
                immediate += 1;
                tracing::debug!(immediate, ?pause, "immediate retry");
                tokio::time::sleep(pause).await;
                continue;
            }
            return outcome;
        }
    }

    /// One handler run: a panic and a deadline overrun become retryable outcomes.
    async fn run_once(&self, delivery: &Delivery) -> Outcome {
        let mut svc = self
            .service
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let d = delivery.clone();
        let call = async move {
            let ready = svc.ready().await?;
            ready.call(d).await
        };
        let guarded = AssertUnwindSafe(call).catch_unwind();
        let result = match self.deadline {
            Some(dl) => match tokio::time::timeout(dl, guarded).await {
                Ok(r) => r,
                Err(_) => {
                    Counters::inc(&self.counters.timeouts);
                    return Outcome::retry(Failure::timeout(format!(
                        "handler ran past its {} deadline",
                        humantime::format_duration(dl)
                    )));
                }
            },
            None => guarded.await,
        };
        match result {
            Ok(Ok(outcome)) => outcome,
            // A tower `timeout` layer ran out: a timeout like the subscriber's deadline.
            Ok(Err(e)) if crate::kind::is_elapsed(&e) => {
                Counters::inc(&self.counters.timeouts);
                Outcome::retry(Failure::from_error("timeout", e.as_ref()))
            }
            Ok(Err(e)) => Outcome::Error(e),
            Err(panic) => {
                Counters::inc(&self.counters.panics);
                let msg = panic_message(panic.as_ref());
                tracing::error!(panic = %msg, "handler panicked");
                Outcome::retry(Failure::panic(msg))
            }
        }
    }

    /// The decision once the handler is done; `outcome` is `None` when the shutdown
    /// deadline cut the handler off. In manual mode a delivery settled through the handle
    /// needs nothing more; an unsettled one gets the fallback.
    pub(crate) fn conclude(
        &self,
        delivery: &Delivery,
        outcome: Option<Outcome>,
        manual: Option<&Manual<impl LinkedSink>>,
    ) -> Decision {
        let decision = match (outcome, manual.map(|m| &m.settle)) {
            (None, Some(s)) if !s.claim() => Decision::Nothing,
            // Acked on receipt: nothing left to settle.
            (None, None) if self.spec.policy == AckPolicy::AckFirst => Decision::Nothing,
            // Shutdown deadline passed: requeue the straggler.
            (None, _) => Decision::Requeue,
            (Some(o), Some(s)) => {
                if s.claim() {
                    // Nothing settled through the handle, whatever the handler said:
                    // `Settled` without a settlement is a clean return too (the fallback
                    // applies, never a silent leak); failures take the auto decision.
                    let o = if matches!(o, Outcome::Settled) {
                        Outcome::Ack
                    } else {
                        o
                    };
                    // Only a clean return is "unsettled": a failure takes the auto decision.
                    if matches!(o, Outcome::Ack) {
                        Counters::inc(&self.counters.unsettled);
                    }
                    decide::decide(&self.spec, delivery, o)
                } else {
                    Decision::Nothing
                }
            }
            (Some(o), None) => decide::decide(&self.spec, delivery, o),
        };
        if let Some(m) = manual {
            m.sink.link().set(None);
        }
        decision
    }
}

/// The text of a panic payload (`&str` or `String`, as `panic!` makes them).
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into())
}
