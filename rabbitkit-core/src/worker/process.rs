//! The per-delivery pipeline: build, run the handler (deadline, panics, immediate
//! retries), decide, settle.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use lapin::options::BasicAckOptions;
use tokio::sync::watch;
use tower::{Service, ServiceExt};
use tracing::Instrument;

use crate::decide::{self, Decision, SettleSpec};
use crate::delivery::{Delivery, Extensions};
use crate::manual::{Settle, SettleSink};
use crate::outcome::{ErrorClass, Failure, Outcome};
use crate::policy::AckPolicy;
use crate::settle::{SettleReport, Settler};
use crate::stats::Counters;
use crate::subscriber::BoxDeliveryService;

pub(super) struct Pipeline {
    pub(super) spec: Arc<SettleSpec>,
    // BoxCloneService is Send but not Sync; each run clones it out under the lock.
    pub(super) service: std::sync::Mutex<BoxDeliveryService>,
    pub(super) settler: Arc<Settler>,
    pub(super) counters: Arc<Counters>,
    pub(super) extensions: Arc<Extensions>,
    pub(super) deadline: Option<Duration>,
    pub(super) hard_stop: watch::Receiver<bool>,
}

struct RuntimeSink {
    spec: Arc<SettleSpec>,
    settler: Arc<Settler>,
    acker: lapin::Acker,
}

impl SettleSink for RuntimeSink {
    fn settle(
        &self,
        delivery: Delivery,
        outcome: Outcome,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = SettleReport> + Send + '_>> {
        Box::pin(async move {
            let decision = decide::auto(&self.spec, &delivery, outcome);
            self.settler.execute(decision, &self.acker).await
        })
    }
}

impl Pipeline {
    pub(super) async fn process(&self, raw: lapin::message::Delivery) {
        let c = &self.counters;
        Counters::inc(&c.consumed);
        let lapin::message::Delivery {
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
        if self.spec.policy == AckPolicy::AckFirst {
            match acker.ack(BasicAckOptions::default()).await {
                Ok(true) => Counters::inc(&c.acked),
                _ => {
                    Counters::inc(&c.ack_lost);
                    return;
                }
            }
        }
        let settle = (self.spec.policy == AckPolicy::Manual).then(|| {
            Settle::new(Arc::new(RuntimeSink {
                spec: self.spec.clone(),
                settler: self.settler.clone(),
                acker: acker.clone(),
            }))
        });
        let delivery = Delivery::builder(self.spec.queue.clone(), data)
            .route(exchange.as_str(), routing_key.as_str())
            .redelivered(redelivered)
            .properties(properties)
            .extensions(self.extensions.clone())
            .settle(settle.clone())
            .build();
        if let Some(s) = &settle {
            s.attach(delivery.clone());
        }
        if let Some(f) = &delivery.attempt().forged_header {
            tracing::warn!(message_id = ?delivery.message_id(), problem = %f, "ignoring an unusable attempt header");
        }
        let span = tracing::info_span!(
            "rabbitkit.process",
            otel.kind = "consumer",
            messaging.system = "rabbitmq",
            messaging.operation = "process",
            messaging.destination.name = %self.spec.queue,
            messaging.rabbitmq.destination.routing_key = %delivery.routing_key(),
            messaging.message.id = delivery.message_id().unwrap_or(""),
            rabbitkit.handler = %self.spec.handler,
            rabbitkit.attempt = delivery.attempt().number,
            rabbitkit.redelivered = redelivered,
            rabbitkit.outcome = tracing::field::Empty,
        );
        async {
            let outcome = self.run(&delivery).await;
            let decision = match (outcome, &settle) {
                (None, Some(s)) if !s.claim() => Decision::Nothing,
                // Shutdown deadline passed: requeue the straggler.
                (None, _) => Decision::Requeue,
                (Some(o), Some(s)) => {
                    if s.claim() {
                        // Nothing settled through the handle, whatever the handler said:
                        // `Settled` without a settlement is unsettled too (the fallback
                        // applies, never a silent leak).
                        Counters::inc(&c.unsettled);
                        let o = if matches!(o, Outcome::Settled) {
                            Outcome::Requeue
                        } else {
                            o
                        };
                        decide::decide(&self.spec, &delivery, o)
                    } else {
                        Decision::Nothing
                    }
                }
                (Some(o), None) => decide::decide(&self.spec, &delivery, o),
            };
            if let Some(s) = &settle {
                s.detach();
            }
            tracing::Span::current().record("rabbitkit.outcome", decision.label());
            let report = self.settler.execute(decision, &acker).await;
            tracing::debug!(?report, "settled");
        }
        .instrument(span)
        .await;
    }

    /// Runs the handler; `None` when the shutdown deadline cut it off.
    async fn run(&self, delivery: &Delivery) -> Option<Outcome> {
        let mut hard = self.hard_stop.clone();
        let mut immediate = 0u32;
        loop {
            let outcome = tokio::select! {
                o = self.run_once(delivery) => o,
                _ = hard.wait_for(|v| *v) => return None,
            };
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
            return Some(outcome);
        }
    }

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
}
