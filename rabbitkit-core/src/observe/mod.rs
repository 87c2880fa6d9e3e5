//! Metrics and the worker's HTTP endpoint.
//!
//! rabbitkit reports through the [`metrics`] facade, so any recorder works (install it
//! before [`Worker::start`](crate::Worker::start): the handles are taken then). Per
//! subscriber, labelled `vhost` and `queue`:
//!
//! - counters [`COUNTER_NAMES`]: `rabbitkit_consumed_total`, `rabbitkit_acked_total`,
//!   `rabbitkit_ack_frames_total`, `rabbitkit_retried_total`, `rabbitkit_parked_total`, `rabbitkit_requeued_total`,
//!   `rabbitkit_rejected_total`, `rabbitkit_settlement_failures_total`,
//!   `rabbitkit_ack_lost_total`, `rabbitkit_panics_total`, `rabbitkit_timeouts_total`,
//!   `rabbitkit_unsettled_total` (the same numbers as [`SubscriberStats`](crate::SubscriberStats));
//! - gauge [`IN_FLIGHT`]; histogram [`HANDLER_DURATION`].
//!
//! Per publisher: histogram [`CONFIRM_LATENCY`] (no labels).
//!
//! With the `http` feature, [`Worker::http`](crate::Worker::http) serves, on one port
//! (hyper, HTTP/1): `GET /metrics` (Prometheus text format, rendered by
//! `metrics-exporter-prometheus`, which rabbitkit installs as the global recorder),
//! `GET /healthz` (200 while the worker runs) and `GET /readyz` (200 when every subscriber
//! is connected and consuming, 503 otherwise, and from the moment shutdown starts). The
//! same answers are a `tower::Service` ([`HttpEndpoints`], from
//! [`WorkerHandle::http_service`](crate::WorkerHandle::http_service)) to mount into an
//! axum or hyper server of your own.

pub(crate) mod context;
pub(crate) mod depth;
pub(crate) mod log;
#[cfg(feature = "otel")]
pub(crate) mod otel;
pub(crate) mod span;

pub use crate::stats::{
    CONFIRM_LATENCY, CONNECT_FAILURES, CONNECTION_LOST, CONNECTION_UP, CONNECTS, CONSUMED_MESSAGES,
    COUNTER_NAMES, HANDLER_DURATION, IN_FLIGHT, PARKING_DEPTH, PROCESS_DURATION,
};
pub use context::TraceContext;

/// The W3C trace-context headers.
pub(crate) const TRACEPARENT: &str = "traceparent";
#[cfg(feature = "otel")]
pub(crate) const TRACESTATE: &str = "tracestate";

#[cfg(feature = "http")]
mod endpoint;
#[cfg(feature = "http")]
pub(crate) use endpoint::{Endpoint, UpkeepGuard, bind, upkeep_guard};
#[cfg(feature = "http")]
pub use endpoint::{HttpEndpoints, install_prometheus};
