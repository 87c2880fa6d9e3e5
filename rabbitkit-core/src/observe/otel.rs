//! OpenTelemetry (feature `otel`): W3C trace-context propagation through message headers,
//! and the `send` and `settle` spans, per the messaging semantic conventions for RabbitMQ.
//!
//! rabbitkit depends on the `opentelemetry` API and `tracing-opentelemetry` only: the
//! application installs its SDK, exporter and a `tracing_opentelemetry::layer()`. The
//! `traceparent` / `tracestate` headers are read and written by rabbitkit itself (W3C Trace
//! Context, version 00), so no global propagator needs to be configured.
//!
//! - `process {queue}` (CONSUMER) links to the producer's context (or, with
//!   [`TraceContext::Parent`](super::TraceContext::Parent), is its child);
//! - `send {exchange}` (PRODUCER) is made by every [`Publisher`](crate::Publisher) publish,
//!   retry and parking copies included, and its context replaces the envelope's
//!   `traceparent` / `tracestate`: a copy carries the context of the attempt that failed, so
//!   publish → fail → retry → success is one connected trace;
//! - `settle {queue}` (CLIENT) covers each ack and reject (requeue or dead-letter) of an original.

use std::str::FromStr;

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::context::TraceContext;
use super::{TRACEPARENT, TRACESTATE};
use crate::delivery::Delivery;
use crate::envelope::Envelope;

/// Parses a W3C `traceparent` (and `tracestate`) into a remote span context; `None` when
/// it is malformed or all-zero.
pub(crate) fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<SpanContext> {
    let mut parts = traceparent.trim().split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    // Version 00 has exactly four parts; a later version may append more.
    if version.len() != 2 || version == "ff" || (version == "00" && parts.next().is_some()) {
        return None;
    }
    let hex = |s: &str, n: usize| {
        s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    if !(hex(version, 2) && hex(trace, 32) && hex(span, 16) && hex(flags, 2)) {
        return None;
    }
    let trace_id = TraceId::from_hex(trace).ok()?;
    let span_id = SpanId::from_hex(span).ok()?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    let state = tracestate
        .and_then(|s| TraceState::from_str(s).ok())
        .unwrap_or_default();
    let cx = SpanContext::new(trace_id, span_id, TraceFlags::new(flags & 1), true, state);
    cx.is_valid().then_some(cx)
}

/// The `traceparent` of a span context (version 00).
pub(crate) fn format(cx: &SpanContext) -> String {
    format!(
        "00-{}-{}-{:02x}",
        cx.trace_id(),
        cx.span_id(),
        cx.trace_flags().to_u8()
    )
}

/// The producer's context carried by `delivery`, if any.
fn producer(delivery: &Delivery) -> Option<SpanContext> {
    let tp = delivery
        .header(TRACEPARENT)
        .and_then(crate::headers::string)?;
    let ts = delivery.header(TRACESTATE).and_then(crate::headers::string);
    parse(&tp, ts.as_deref())
}

/// Links the process span to the producer's context, and with `Parent` takes it as parent.
pub(crate) fn attach_producer(span: &tracing::Span, delivery: &Delivery, mode: TraceContext) {
    let Some(cx) = producer(delivery) else {
        return;
    };
    if mode == TraceContext::Parent {
        let parent = opentelemetry::Context::new().with_remote_span_context(cx.clone());
        if let Err(e) = span.set_parent(parent) {
            tracing::debug!(error = %e, "no OpenTelemetry layer: the producer's context is not the parent");
        }
    }
    span.add_link(cx);
}

/// The `send {exchange}` span of one publish.
pub(crate) fn send_span(envelope: &Envelope) -> tracing::Span {
    let exchange = match envelope.exchange_name() {
        "" => "amq.default",
        e => e,
    };
    let props = envelope.basic_properties();
    tracing::info_span!(
        "rabbitkit.send",
        otel.name = %format_args!("send {exchange}"),
        otel.kind = "producer",
        otel.status_code = tracing::field::Empty,
        messaging.system = "rabbitmq",
        messaging.operation.name = "send",
        messaging.operation.type = "send",
        messaging.destination.name = exchange,
        messaging.rabbitmq.destination.routing_key = envelope.routing_key(),
        messaging.message.id = props.message_id().as_ref().map_or("", |m| m.as_str()),
        messaging.message.conversation_id = props.correlation_id().as_ref().map_or("", |c| c.as_str()),
        messaging.message.body.size = super::context::int(envelope.body().len()),
        error.type = tracing::field::Empty,
        rabbitkit.publish.outcome = tracing::field::Empty,
    )
}

/// Writes the context of `span` into `envelope`'s `traceparent` / `tracestate`, replacing
/// what it carried. Without an OpenTelemetry layer the envelope is left as it is.
pub(crate) fn inject(span: &tracing::Span, envelope: Envelope) -> Envelope {
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    if !sc.is_valid() {
        return envelope;
    }
    let state = sc.trace_state().header();
    let envelope = envelope.header(TRACEPARENT, lapin::types::LongString::from(format(&sc)));
    if state.is_empty() {
        envelope
    } else {
        envelope.header(TRACESTATE, lapin::types::LongString::from(state))
    }
}

/// The length of a version-00 `traceparent`: `00-{32 hex}-{16 hex}-{2 hex}`.
const TRACEPARENT_LEN: usize = 55;

/// The bytes [`inject`] may add to `envelope`'s properties when it is sent: a
/// `traceparent`, and the current trace's `tracestate` when it has one (the send span is a
/// child of the current span and carries its trace state). Kept out of the frame budget by
/// [`Publisher::check`](crate::Publisher::check), so a copy that passes the check still fits
/// once the trace headers are written. Without an OpenTelemetry layer nothing is injected,
/// and the `traceparent`'s room is kept all the same (at most 72 bytes too cautious).
pub(crate) fn room(envelope: &Envelope) -> usize {
    let current = tracing::Span::current().context();
    let state = current.span().span_context().trace_state().header();
    let traceparent = lapin::types::AMQPValue::LongString("0".repeat(TRACEPARENT_LEN).into());
    if state.is_empty() {
        envelope.growth(&[(TRACEPARENT, traceparent)])
    } else {
        let tracestate = lapin::types::AMQPValue::LongString(state.into());
        envelope.growth(&[(TRACEPARENT, traceparent), (TRACESTATE, tracestate)])
    }
}

/// Records a publish's verdict on its send span.
pub(crate) fn sent(span: &tracing::Span, outcome: &crate::PublishOutcome) {
    span.record("rabbitkit.publish.outcome", outcome.label());
    if !outcome.is_confirmed() {
        span.record("error.type", outcome.label());
        span.record("otel.status_code", "error");
    }
}

/// The `settle {queue}` span of an ack or nack (`operation`: `ack`, `reject`).
pub(crate) fn settle_span(queue: &str, operation: &'static str) -> tracing::Span {
    tracing::info_span!(
        "rabbitkit.settle",
        otel.name = %format_args!("settle {queue}"),
        otel.kind = "client",
        messaging.system = "rabbitmq",
        messaging.operation.name = operation,
        messaging.operation.type = "settle",
        messaging.destination.name = queue,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn traceparent_round_trips() {
        let Some(cx) = parse(TP, Some("congo=t61rcWkgMzE")) else {
            panic!("a valid traceparent")
        };
        assert!(cx.is_remote() && cx.is_sampled());
        assert_eq!(format(&cx), TP);
        assert_eq!(cx.trace_state().get("congo"), Some("t61rcWkgMzE"));
    }

    #[test]
    fn malformed_traceparents_are_ignored() {
        for bad in [
            "",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
        ] {
            assert!(parse(bad, None).is_none(), "{bad}");
        }
        // A later version may carry more fields; the first four are read.
        assert!(
            parse(
                "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-x",
                None
            )
            .is_some()
        );
    }
}
