//! The spans of a delivery, named and attributed per the OpenTelemetry messaging semantic
//! conventions for RabbitMQ (`process {queue}`, kind CONSUMER).
//!
//! The fields are plain `tracing` fields; `tracing-opentelemetry` maps `otel.name` and
//! `otel.kind` to the span's name and kind and every other field to an attribute. With the
//! `otel` feature the span is also linked to (or parented by) the producer's context.

use std::sync::Arc;

use super::context::{TraceContext, int};
use crate::decide::{Decision, SettleSpec};
use crate::delivery::Delivery;

/// What every span of one subscriber shares, computed once when it starts.
#[derive(Debug, Clone)]
pub(crate) struct SpanInfo {
    /// `process {queue}`.
    process_name: Arc<str>,
    server_address: Arc<str>,
    server_port: u16,
    /// How the producer's context is attached to the process span.
    #[cfg_attr(not(feature = "otel"), allow(dead_code))]
    pub(crate) trace_context: TraceContext,
}

impl SpanInfo {
    pub(crate) fn new(queue: &str, uri: Option<&lapin::uri::AMQPUri>, tc: TraceContext) -> Self {
        Self {
            process_name: format!("process {queue}").into(),
            server_address: uri
                .map_or_else(String::new, |u| u.authority.host.clone())
                .into(),
            server_port: uri.map_or(0, |u| u.authority.port),
            trace_context: tc,
        }
    }
}

/// The facts of a raw delivery the span records that a [`Delivery`] does not keep.
pub(crate) struct Raw {
    pub(crate) delivery_tag: u64,
    pub(crate) redelivered: bool,
}

/// The `process {queue}` span of one delivery.
pub(crate) fn process(
    info: &SpanInfo,
    spec: &SettleSpec,
    delivery: &Delivery,
    raw: Raw,
) -> tracing::Span {
    let props = delivery.properties();
    let span = tracing::info_span!(
        "rabbitkit.process",
        otel.name = &*info.process_name,
        otel.kind = "consumer",
        otel.status_code = tracing::field::Empty,
        messaging.system = "rabbitmq",
        messaging.operation = "process",
        messaging.operation.name = "process",
        messaging.operation.type = "process",
        messaging.destination.name = %spec.queue,
        messaging.rabbitmq.destination.routing_key = %delivery.routing_key(),
        messaging.rabbitmq.message.delivery_tag = int(raw.delivery_tag),
        messaging.message.id = delivery.message_id().unwrap_or(""),
        messaging.message.conversation_id = props.correlation_id().as_ref().map_or("", |c| c.as_str()),
        messaging.message.body.size = int(delivery.body().len()),
        server.address = &*info.server_address,
        server.port = i64::from(info.server_port),
        error.type = tracing::field::Empty,
        rabbitkit.handler = %spec.handler,
        rabbitkit.attempt = i64::from(delivery.attempt().number),
        rabbitkit.redelivered = raw.redelivered,
        rabbitkit.outcome = tracing::field::Empty,
        // W3C trace context of the producer; retry and parking copies carry the context
        // of the attempt that failed (with the `otel` feature) or the original's header.
        traceparent = tracing::field::Empty,
    );
    if let Some(tp) = delivery
        .header(super::TRACEPARENT)
        .and_then(crate::headers::string)
    {
        span.record("traceparent", tp.as_str());
    }
    #[cfg(feature = "otel")]
    super::otel::attach_producer(&span, delivery, info.trace_context);
    span
}

/// Records the decision on the current process span; a failure sets `error.type` and
/// the error status.
pub(crate) fn decided(decision: &Decision) {
    let span = tracing::Span::current();
    span.record("rabbitkit.outcome", decision.label());
    if let Decision::Republish { failure, .. } = decision {
        span.record("error.type", &*failure.kind);
        span.record("otel.status_code", "error");
    }
}
