//! Per-subscriber settlement counters, mirrored into the `metrics` crate.
//!
//! Every counter is an atomic (read by [`SubscriberStats`] snapshots) and a `metrics`
//! counter named `rabbitkit_<name>_total` with labels `vhost` and `queue`. The metric
//! handles are taken from the global recorder when the subscriber starts, so a recorder
//! (rabbitkit's Prometheus endpoint, or your own) must be installed before
//! [`Worker::start`](crate::Worker::start); without one they cost nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// One count: the atomic the snapshots read and its `metrics` counter.
pub(crate) struct Count {
    value: AtomicU64,
    metric: metrics::Counter,
}

impl std::fmt::Debug for Count {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.value.load(Ordering::Relaxed).fmt(f)
    }
}

impl Count {
    fn new(name: &'static str, labels: &Labels) -> Self {
        Self {
            value: AtomicU64::new(0),
            metric: metrics::counter!(name, "vhost" => labels.vhost.clone(), "queue" => labels.queue.clone()),
        }
    }

    fn get(&self) -> u64 {
        self.value.load(Ordering::Relaxed)
    }
}

/// The labels of one subscriber's metrics.
#[derive(Debug, Clone, Default)]
pub(crate) struct Labels {
    pub(crate) vhost: String,
    pub(crate) queue: String,
}

macro_rules! counters {
    ($($(#[$m:meta])* $name:ident),* $(,)?) => {
        /// Live counters of one subscriber.
        #[derive(Debug)]
        pub(crate) struct Counters {
            $(pub(crate) $name: Count,)*
            /// Deliveries between receipt and settlement (`rabbitkit_in_flight`).
            in_flight: metrics::Gauge,
            /// Handler run time (`rabbitkit_handler_duration_seconds`).
            handler_seconds: metrics::Histogram,
        }

        /// A snapshot of a subscriber's counters.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct SubscriberStats { $($(#[$m])* pub $name: u64,)* }

        /// Names of the counters, as exported (`rabbitkit_<name>_total`).
        pub const COUNTER_NAMES: &[&str] = &[$(concat!("rabbitkit_", stringify!($name), "_total"),)*];

        impl Counters {
            /// Counters whose metrics carry `labels`.
            pub(crate) fn new(labels: &Labels) -> Self {
                Self {
                    $($name: Count::new(concat!("rabbitkit_", stringify!($name), "_total"), labels),)*
                    in_flight: metrics::gauge!(IN_FLIGHT, "vhost" => labels.vhost.clone(), "queue" => labels.queue.clone()),
                    handler_seconds: metrics::histogram!(HANDLER_DURATION, "vhost" => labels.vhost.clone(), "queue" => labels.queue.clone()),
                }
            }

            pub(crate) fn snapshot(&self) -> SubscriberStats {
                SubscriberStats { $($name: self.$name.get(),)* }
            }
        }
    };
}

counters! {
    /// Deliveries received.
    consumed,
    /// Originals acked (successes, and failures whose copy was confirmed).
    acked,
    /// Retry copies confirmed.
    retried,
    /// Parking copies confirmed.
    parked,
    /// Nacked with requeue (requested, fallback, shutdown stragglers, failed copies).
    requeued,
    /// Nacked without requeue.
    rejected,
    /// Copies not confirmed (returned, nacked, timed out, failed): original not acked.
    settlement_failures,
    /// Acks or nacks that found their channel gone (the broker redelivers).
    ack_lost,
    /// Handlers that panicked.
    panics,
    /// Handlers that ran past their deadline.
    timeouts,
    /// Manual handlers that returned without settling.
    unsettled,
}

/// Gauge: deliveries received and not yet settled, per subscriber.
pub const IN_FLIGHT: &str = "rabbitkit_in_flight";
/// Histogram: handler run time in seconds, per subscriber.
pub const HANDLER_DURATION: &str = "rabbitkit_handler_duration_seconds";
/// Histogram: publish-to-confirm latency in seconds, per publisher connection.
pub const CONFIRM_LATENCY: &str = "rabbitkit_confirm_latency_seconds";

impl Default for Counters {
    fn default() -> Self {
        Self::new(&Labels::default())
    }
}

impl Counters {
    pub(crate) fn inc(counter: &Count) {
        counter.value.fetch_add(1, Ordering::Relaxed);
        counter.metric.increment(1);
    }

    /// A delivery entered the pipeline; the guard marks it settled when dropped.
    pub(crate) fn enter(&self) -> InFlight<'_> {
        self.in_flight.increment(1.0);
        InFlight(self)
    }

    pub(crate) fn handler_ran(&self, took: Duration) {
        self.handler_seconds.record(took.as_secs_f64());
    }
}

/// Counts a delivery in flight until dropped.
pub(crate) struct InFlight<'a>(&'a Counters);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.decrement(1.0);
    }
}
