//! Vocabulary shared by the spans of a delivery and the OpenTelemetry bridge: how a
//! process span relates to its producer, and how integer attributes are written.

/// How a consumer's `process` span relates to the context of the producer that sent the
/// message (read from its `traceparent` / `tracestate` headers).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum TraceContext {
    /// The process span starts a trace of its own and **links** to the producer's span,
    /// as the OpenTelemetry messaging conventions recommend (a batch, a retry or a replay
    /// may be processed long after it was sent).
    #[default]
    Link,
    /// The process span is a **child** of the producer's span (one trace from publish to
    /// settlement), and links to it too.
    Parent,
}

/// An integer attribute as `i64`: `tracing-opentelemetry` exports unsigned fields as
/// strings, and the conventions want integers.
pub(crate) fn int(n: impl TryInto<i64>) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}
