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
    pub(crate) fn delivery(
        &self,
        builder: DeliveryBuilder,
        sink: impl FnOnce() -> Arc<dyn SettleSink>,
    ) -> (Delivery, Option<Settle>) {
        let settle = (self.spec.policy == AckPolicy::Manual).then(|| Settle::new(sink()));
        let delivery = builder.settle(settle.clone()).build();
        if let Some(s) = &settle {
            s.attach(delivery.clone());
        }
        (delivery, settle)
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
            let manual = self.spec.policy == AckPolicy::Manual;
            if retryable && !manual && immediate < self.spec.retry.immediate_retries {
                let seed =
                    delivery.message_id().map_or(0, |m| m.len() as u64) ^ u64::from(immediate);
                let pause = self.spec.retry.immediate_pause(immediate, seed);
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
            Ok(Err(e)) => Outcome::Error(e),
            Err(panic) => {
                Counters::inc(&self.counters.panics);
                let msg = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "non-string panic payload".into());
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
        settle: Option<&Settle>,
    ) -> Decision {
        let decision = match (outcome, settle) {
            (None, Some(s)) if !s.claim() => Decision::Nothing,
            // Shutdown deadline passed: requeue the straggler.
            (None, _) => Decision::Requeue,
            (Some(o), Some(s)) => {
                if s.claim() {
                    // Nothing settled through the handle, whatever the handler said:
                    // `Settled` without a settlement is unsettled too (the fallback
                    // applies, never a silent leak).
                    Counters::inc(&self.counters.unsettled);
                    let o = if matches!(o, Outcome::Settled) {
                        Outcome::Requeue
                    } else {
                        o
                    };
                    decide::decide(&self.spec, delivery, o)
                } else {
                    Decision::Nothing
                }
            }
            (Some(o), None) => decide::decide(&self.spec, delivery, o),
        };
        if let Some(s) = settle {
            s.detach();
        }
        decision
    }
}
