//! The per-delivery pipeline: build, run the handler (deadline, panics, immediate
//! retries), decide, settle. Running and deciding are shared with the test kit
//! (`crate::run`); this file adds the broker: the acker, the shutdown cut-off, the settler.

use std::sync::Arc;

use lapin::options::BasicAckOptions;
use tokio::sync::watch;
use tracing::Instrument;

use crate::decide::{self, SettleSpec};
use crate::delivery::{Delivery, Extensions};
use crate::manual::SettleSink;
use crate::outcome::Outcome;
use crate::policy::AckPolicy;
use crate::run::Runner;
use crate::settle::{SettleReport, Settler};
use crate::stats::Counters;

/// The W3C trace-context header.
const TRACEPARENT: &str = "traceparent";

pub(super) struct Pipeline {
    pub(super) runner: Runner,
    pub(super) settler: Arc<Settler>,
    pub(super) extensions: Arc<Extensions>,
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
        let spec = &self.runner.spec;
        let c = &self.runner.counters;
        Counters::inc(&c.consumed);
        let _in_flight = c.enter();
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
        if spec.policy == AckPolicy::AckFirst {
            match acker.ack(BasicAckOptions::default()).await {
                Ok(true) => Counters::inc(&c.acked),
                _ => {
                    Counters::inc(&c.ack_lost);
                    return;
                }
            }
        }
        let builder = Delivery::builder(spec.queue.clone(), data)
            .route(exchange.as_str(), routing_key.as_str())
            .redelivered(redelivered)
            .properties(properties)
            .extensions(self.extensions.clone());
        let (delivery, settle) = self.runner.delivery(builder, || {
            Arc::new(RuntimeSink {
                spec: spec.clone(),
                settler: self.settler.clone(),
                acker: acker.clone(),
            })
        });
        if let Some(f) = &delivery.attempt().forged_header {
            tracing::warn!(message_id = ?delivery.message_id(), problem = %f, "ignoring an unusable attempt header");
        }
        let span = tracing::info_span!(
            "rabbitkit.process",
            otel.kind = "consumer",
            messaging.system = "rabbitmq",
            messaging.operation = "process",
            messaging.operation.type = "process",
            messaging.destination.name = %spec.queue,
            messaging.rabbitmq.destination.routing_key = %delivery.routing_key(),
            messaging.message.id = delivery.message_id().unwrap_or(""),
            rabbitkit.handler = %spec.handler,
            rabbitkit.attempt = delivery.attempt().number,
            rabbitkit.redelivered = redelivered,
            rabbitkit.outcome = tracing::field::Empty,
            // W3C trace context of the producer; retry and parking copies keep the header,
            // so every attempt of a message shares it.
            traceparent = tracing::field::Empty,
        );
        if let Some(tp) = delivery
            .header(TRACEPARENT)
            .and_then(crate::headers::string)
        {
            span.record("traceparent", tp.as_str());
        }
        async {
            let mut hard = self.hard_stop.clone();
            let started = std::time::Instant::now();
            let outcome = tokio::select! {
                o = self.runner.run(&delivery) => Some(o),
                _ = hard.wait_for(|v| *v) => None,
            };
            c.handler_ran(started.elapsed());
            let decision = self.runner.conclude(&delivery, outcome, settle.as_ref());
            tracing::Span::current().record("rabbitkit.outcome", decision.label());
            let report = self.settler.execute(decision, &acker).await;
            tracing::debug!(?report, "settled");
        }
        .instrument(span)
        .await;
    }
}
