//! Per-subscriber settlement counters, mirrored into the `metrics` crate.
//!
//! Every counter is an atomic (read by [`SubscriberStats`] snapshots) and a `metrics`
//! counter named `rabbitkit_<name>_total` with labels `vhost` and `queue`. The metric
//! handles are taken from the global recorder when the subscriber starts, so a recorder
//! (rabbitkit's Prometheus endpoint, or your own) must be installed before
//! [`Worker::start`](crate::Worker::start); without one they cost nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::decide::ParkReason;

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
            // Parked is exported by reason only (`Counters::parked`): a series without the
            // label beside the labelled ones would be counted twice by any `sum`.
            metric: if name == "rabbitkit_parked_total" {
                metrics::Counter::noop()
            } else {
                metrics::counter!(name, "vhost" => labels.vhost.clone(), "queue" => labels.queue.clone())
            },
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
    /// The error kinds `rabbitkit_failures_total` has a series of (`KnownKinds::metric_kinds`);
    /// any other is counted as `other`.
    pub(crate) kinds: Vec<String>,
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
            /// Receipt to settlement (`messaging_process_duration_seconds`).
            process_seconds: metrics::Histogram,
            /// Deliveries received (`messaging_client_consumed_messages_total`).
            consumed_messages: metrics::Counter,
            /// `rabbitkit_parked_total` by reason, in [`ParkReason::ALL`] order.
            parked_by_reason: [metrics::Counter; ParkReason::ALL.len()],
            /// `rabbitkit_failures_total` by error kind, sorted by kind; `other` last.
            failures_by_kind: Vec<(String, metrics::Counter)>,
            /// Deliveries received and not yet settled, for the shutdown log.
            in_flight_now: AtomicU64,
            /// Handlers cut off at the shutdown deadline (their deliveries requeued).
            pub(crate) stragglers: AtomicU64,
            /// When these counters were made: the origin of `last_progress`.
            born: std::time::Instant,
            /// Milliseconds after `born` when a delivery last started or finished: what
            /// tells a stalled subscriber from a busy one (no delivery starts while every
            /// slot is taken, so this is the time since the slots last moved).
            last_progress: AtomicU64,
            /// The work queue (span attributes).
            #[cfg_attr(not(feature = "otel"), allow(dead_code))]
            pub(crate) queue: String,
        }

        /// A snapshot of a subscriber's counters.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct SubscriberStats { $($(#[$m])* pub $name: u64,)* }

        /// Names of the counters, as exported (`rabbitkit_<name>_total`).
        pub const COUNTER_NAMES: &[&str] = &[$(concat!("rabbitkit_", stringify!($name), "_total"),)*];

        impl Counters {
            /// Counters whose metrics carry `labels`.
            pub(crate) fn new(labels: &Labels) -> Self {
                let semconv = |op: &'static str| {
                    [
                        ("vhost", labels.vhost.clone()),
                        ("messaging_system", "rabbitmq".to_owned()),
                        ("messaging_destination_name", labels.queue.clone()),
                        ("messaging_operation_name", op.to_owned()),
                    ]
                };
                Self {
                    $($name: Count::new(concat!("rabbitkit_", stringify!($name), "_total"), labels),)*
                    in_flight: metrics::gauge!(IN_FLIGHT, "vhost" => labels.vhost.clone(), "queue" => labels.queue.clone()),
                    handler_seconds: metrics::histogram!(HANDLER_DURATION, "vhost" => labels.vhost.clone(), "queue" => labels.queue.clone()),
                    process_seconds: metrics::histogram!(PROCESS_DURATION, &semconv("process")),
                    consumed_messages: metrics::counter!(CONSUMED_MESSAGES, &semconv("process")),
                    parked_by_reason: ParkReason::ALL.map(|r| {
                        metrics::counter!(
                            "rabbitkit_parked_total",
                            "vhost" => labels.vhost.clone(),
                            "queue" => labels.queue.clone(),
                            "reason" => r.as_str()
                        )
                    }),
                    failures_by_kind: {
                        let mut kinds = labels.kinds.clone();
                        kinds.sort();
                        kinds.dedup();
                        kinds.retain(|k| k != OTHER_KIND);
                        kinds.push(OTHER_KIND.to_owned());
                        kinds
                            .into_iter()
                            .map(|kind| {
                                let counter = metrics::counter!(
                                    FAILURES,
                                    "vhost" => labels.vhost.clone(),
                                    "queue" => labels.queue.clone(),
                                    "kind" => kind.clone()
                                );
                                (kind, counter)
                            })
                            .collect()
                    },
                    in_flight_now: AtomicU64::new(0),
                    stragglers: AtomicU64::new(0),
                    born: std::time::Instant::now(),
                    last_progress: AtomicU64::new(0),
                    queue: labels.queue.clone(),
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
    /// Originals acked (successes, and failures whose copy was confirmed), counted per
    /// message whether acked alone or by a coalesced `multiple` ack, once the ack frame is
    /// written to the socket (an ack whose channel died first counts as `ack_lost`).
    acked,
    /// `basic.ack` frames sent for originals: one per ack, one per coalesced run
    /// ([`Subscriber::ack_coalescing`](crate::Subscriber::ack_coalescing)); `acked /
    /// ack_frames` is the coalescing ratio.
    ack_frames,
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
    /// Manual handlers that returned cleanly without settling (the fallback applied).
    unsettled,
    /// Deliveries whose own attempt or route headers were ignored: unsigned (and not from a
    /// delay tier) or badly signed ([`HeaderTrust`](crate::trust::HeaderTrust)).
    untrusted_headers,
}

/// Counter: failed handler attempts by error kind (`vhost`, `queue`, `kind`), one per
/// retry or parking copy decided. `kind` is one the subscriber knows (rabbitkit's own, its
/// registered error types', its declared ones) or [`OTHER_KIND`].
pub(crate) const FAILURES: &str = "rabbitkit_failures_total";
/// The `kind` of `rabbitkit_failures_total` for a kind the subscriber does not know (a
/// custom classifier's, an undeclared ad-hoc one): the label's values stay bounded.
pub(crate) const OTHER_KIND: &str = "other";

/// Gauge: deliveries received and not yet settled, per subscriber.
pub const IN_FLIGHT: &str = "rabbitkit_in_flight";
/// Histogram: handler run time in seconds, per subscriber.
pub const HANDLER_DURATION: &str = "rabbitkit_handler_duration_seconds";
/// Histogram: publish-to-confirm latency in seconds, per publisher connection.
pub const CONFIRM_LATENCY: &str = "rabbitkit_confirm_latency_seconds";
/// Histogram (OpenTelemetry `messaging.process.duration`): receipt to settlement in
/// seconds, per subscriber.
pub const PROCESS_DURATION: &str = "messaging_process_duration_seconds";
/// Counter (OpenTelemetry `messaging.client.consumed.messages`): deliveries received.
pub const CONSUMED_MESSAGES: &str = "messaging_client_consumed_messages_total";
/// Gauge: 1 while the named connection is open, 0 otherwise (labels `connection`, `vhost`).
pub const CONNECTION_UP: &str = "rabbitkit_connection_up";
/// Counter: connections opened, the first one included (labels `connection`, `vhost`).
pub const CONNECTS: &str = "rabbitkit_connects_total";
/// Counter: connections found lost (labels `connection`, `vhost`); each is followed by a reconnect.
pub const CONNECTION_LOST: &str = "rabbitkit_connection_lost_total";
/// Counter: failed connection attempts (labels `connection`, `vhost`).
pub const CONNECT_FAILURES: &str = "rabbitkit_connect_failures_total";
/// Gauge: messages in a subscriber's parking queue, polled when
/// [`Worker::parking_depth_interval`](crate::Worker::parking_depth_interval) is set.
pub const PARKING_DEPTH: &str = "rabbitkit_parking_depth";

/// Puts a `# HELP` line on every series rabbitkit exports. Idempotent; applies to the
/// recorder installed when called.
pub(crate) fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    let counters: [(&str, &str); 13] = [
        ("rabbitkit_consumed_total", "Deliveries received."),
        (
            "rabbitkit_acked_total",
            "Originals acked (successes, and failures whose copy was confirmed).",
        ),
        (
            "rabbitkit_ack_frames_total",
            "basic.ack frames sent for originals: one per ack, one per coalesced run.",
        ),
        (
            "rabbitkit_retried_total",
            "Retry copies confirmed (the original then acked).",
        ),
        (
            "rabbitkit_parked_total",
            "Parking copies confirmed, by reason (max-attempts, permanent, decode, handler, requeue-limit, unpublishable, bad-signature).",
        ),
        (
            "rabbitkit_requeued_total",
            "Originals nacked with requeue (asked for, fallback, shutdown stragglers, copies not confirmed).",
        ),
        (
            "rabbitkit_rejected_total",
            "Originals nacked without requeue.",
        ),
        (
            "rabbitkit_settlement_failures_total",
            "Retry or parking copies not confirmed (returned, nacked, timed out, failed); the original was kept.",
        ),
        (
            "rabbitkit_ack_lost_total",
            "Acks or nacks that found their channel gone; the broker redelivers.",
        ),
        ("rabbitkit_panics_total", "Handler panics."),
        (
            "rabbitkit_timeouts_total",
            "Handlers that ran past their deadline.",
        ),
        (
            "rabbitkit_unsettled_total",
            "Manual handlers that returned without settling.",
        ),
        (
            "rabbitkit_untrusted_headers_total",
            "Deliveries whose own attempt or route headers were ignored (unsigned or badly signed).",
        ),
    ];
    for (name, help) in counters {
        describe_counter!(name, Unit::Count, help);
    }
    describe_counter!(
        FAILURES,
        Unit::Count,
        "Failed handler attempts (a retry or parking copy decided), by error kind; kinds the subscriber does not know are `other`."
    );
    describe_gauge!(
        IN_FLIGHT,
        Unit::Count,
        "Deliveries received and not yet settled."
    );
    describe_histogram!(
        HANDLER_DURATION,
        Unit::Seconds,
        "Handler service run time, extractors included."
    );
    describe_histogram!(
        CONFIRM_LATENCY,
        Unit::Seconds,
        "Publish to broker confirm, every confirmed publish."
    );
    describe_histogram!(
        PROCESS_DURATION,
        Unit::Seconds,
        "OpenTelemetry messaging.process.duration: receipt to settlement."
    );
    describe_counter!(
        CONSUMED_MESSAGES,
        Unit::Count,
        "OpenTelemetry messaging.client.consumed.messages: deliveries received."
    );
    describe_gauge!(
        CONNECTION_UP,
        "1 while the connection is open, 0 when it was found lost or closed."
    );
    describe_counter!(
        CONNECTS,
        Unit::Count,
        "Connections opened (the first one included; more than one means reconnects)."
    );
    describe_counter!(CONNECTION_LOST, Unit::Count, "Connections found lost.");
    describe_counter!(CONNECT_FAILURES, Unit::Count, "Failed connection attempts.");
    describe_gauge!(
        PARKING_DEPTH,
        Unit::Count,
        "Messages in the subscriber's parking queue (polled)."
    );
}

impl Default for Counters {
    fn default() -> Self {
        Self::new(&Labels::default())
    }
}

impl Counters {
    pub(crate) fn inc(counter: &Count) {
        Self::add(counter, 1);
    }

    /// Adds `n` (a multiple ack counts every message it acks).
    pub(crate) fn add(counter: &Count, n: u64) {
        counter.value.fetch_add(n, Ordering::Relaxed);
        counter.metric.increment(n);
    }

    /// A delivery entered the pipeline; the guard marks it settled when dropped.
    pub(crate) fn enter(&self) -> InFlight<'_> {
        self.in_flight.increment(1.0);
        self.in_flight_now.fetch_add(1, Ordering::Relaxed);
        self.consumed_messages.increment(1);
        self.progress();
        InFlight(self, std::time::Instant::now())
    }

    /// Deliveries received and not yet settled.
    pub(crate) fn in_flight_now(&self) -> u64 {
        self.in_flight_now.load(Ordering::Relaxed)
    }

    /// Notes that a delivery started or finished now.
    fn progress(&self) {
        let now = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_progress.fetch_max(now, Ordering::Relaxed);
    }

    /// Whether the subscriber consumes nothing: all of its `slots` are taken and no
    /// delivery has started or finished for longer than `limit` (handlers that hang, or are stuck
    /// with no deadline, while the broker holds the rest of the queue back).
    pub(crate) fn stalled(&self, slots: u64, limit: Duration) -> bool {
        if self.in_flight_now() < slots.max(1) {
            return false;
        }
        let now = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        let last = self.last_progress.load(Ordering::Relaxed);
        let limit = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
        now.saturating_sub(last) > limit
    }

    /// A parking copy was confirmed.
    pub(crate) fn parked(&self, reason: ParkReason) {
        Self::inc(&self.parked);
        let i = ParkReason::ALL
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(0);
        self.parked_by_reason[i].increment(1);
    }

    /// A failed attempt of error kind `kind` (its retry or parking copy decided).
    pub(crate) fn failed(&self, kind: &str) {
        let counter = self
            .failures_by_kind
            .iter()
            .find(|(k, _)| k == kind)
            .or_else(|| self.failures_by_kind.last());
        if let Some((_, counter)) = counter {
            counter.increment(1);
        }
    }

    pub(crate) fn handler_ran(&self, took: Duration) {
        self.handler_seconds.record(took.as_secs_f64());
    }
}

/// Counts a delivery in flight until dropped, and how long it was.
pub(crate) struct InFlight<'a>(&'a Counters, std::time::Instant);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.decrement(1.0);
        self.0.in_flight_now.fetch_sub(1, Ordering::Relaxed);
        self.0.progress();
        self.0
            .process_seconds
            .record(self.1.elapsed().as_secs_f64());
    }
}
