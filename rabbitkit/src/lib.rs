//! # rabbitkit
//!
//! RabbitMQ consumers that never lose a message.
//!
//! You write handlers; rabbitkit consumes, runs them, and settles every delivery:
//!
//! - success → ack;
//! - failure → a **retry copy** into a delay tier (`orders.delay.30s`) or a **parking copy**
//!   with evidence headers, published on a confirm-mode channel with `mandatory = true`; the
//!   original is acked **only after that copy is confirmed**. A nack, a return, a timeout or a
//!   lost channel leaves the original unacked and it is requeued;
//! - attempts are counted in rabbitkit's own header (RabbitMQ 4.x restarts `x-death` counts);
//!   past the limit the message is parked with its body, headers and failure reason;
//! - undecodable payloads are parked at once, never requeued in a loop;
//! - manual ack mode for handlers that commit to a database first;
//! - an [`idempotency`] layer that acks already-processed redeliveries, and (feature
//!   `test-util`) a broker-free `testing` kit whose decisions are the runtime's own;
//! - a worker from a strict TOML file, handlers registered by name ([`config`],
//!   [`worker::from_config`]), with a passive topology check for `--check`.
//! - (feature `cli`) the `rabbitkit` operator binary: inspect, replay and purge parking
//!   queues, check or declare a topology, publish a confirmed message.
//! - one WARN per failed attempt with what happens next, [`shutdown_signal`] (SIGINT and
//!   SIGTERM), Prometheus metrics with `/healthz` and `/readyz` (feature `http`), and
//!   OpenTelemetry messaging spans with trace context carried through retries (feature
//!   `otel`); see [`observe`].
//!
//! ```no_run
//! use rabbitkit::prelude::*;
//! use std::time::Duration;
//!
//! #[derive(serde::Deserialize)]
//! struct Order { id: u64 }
//!
//! async fn handle_order(Json(order): Json<Order>, RoutingKey(key): RoutingKey) -> Result<(), BoxError> {
//!     println!("order {} via {key}", order.id);
//!     Ok(())
//! }
//!
//! # async fn run() -> rabbitkit::Result<()> {
//! let orders = Subscriber::new("orders", handle_order)
//!     .bind("shop", "order.*")
//!     .retry(RetryPolicy::new([Duration::from_secs(1), Duration::from_secs(30)]).max_attempts(4))
//!     .prefetch(50);
//! Worker::new(ConnectionConfig::new("amqp://guest:guest@127.0.0.1:5672/%2f"))
//!     .subscribe(orders)
//!     .run_until_signal() // SIGINT or SIGTERM: drain in-flight handlers, then stop
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! Guides: `docs/ARCHITECTURE.md`, `docs/GUARANTEES.md`, `docs/RETRY-AND-PARKING.md`,
//! `docs/BROKER-VERSIONS.md`, `docs/TESTING-HANDLERS.md`, `docs/OPERATOR-CLI.md`,
//! `docs/OBSERVABILITY.md` in the
//! repository.

pub use rabbitkit_core::{
    AckCoalescing, AckPolicy, BoxError, Classify, ConnectionConfig, DefaultClassifier, Delivery,
    Envelope, Error, ErrorClass, Failure, HeaderKeys, HeaderTrust, IntoOutcome, IntoSubscriber,
    ManualFallback, Outcome, ParkedMessage, Parking, PendingConfirm, Permanent, PublishOutcome,
    Publisher, PublisherConfig, PublisherStats, QueueType, ReplayOptions, ReplayReport, Result,
    RetryPolicy, Settle, SettleReport, Subscriber, SubscriberStats, TlsConfig, Topology,
    TopologyMode, Worker, WorkerHandle, WorkerReport, shutdown_signal,
};
pub use rabbitkit_core::{
    amqp, coalesce, config, decide, extract, handler, headers, idempotency, kind, observe, parking,
    retry, topology, trust, worker,
};

#[cfg(feature = "cli")]
pub mod cli;

/// Transactional ack mode: the Postgres inbox and the `Tx` extractor (feature `postgres`;
/// docs/EXACTLY-ONCE.md).
#[cfg(feature = "postgres")]
pub use rabbitkit_core::inbox;
/// Broker-free tests of handlers and subscribers: build a delivery, run it, assert on the
/// settlement the runtime would carry out. See `docs/TESTING-HANDLERS.md`.
#[cfg(feature = "test-util")]
pub use rabbitkit_core::testing;

/// The names most handlers need.
pub mod prelude {
    pub use rabbitkit_core::extract::{
        Body, Headers, Json, MessageId, Redelivered, RoutingKey, State,
    };
    pub use rabbitkit_core::headers::Attempt;
    pub use rabbitkit_core::{
        AckPolicy, BoxError, ConnectionConfig, Envelope, Failure, Outcome, Permanent,
        PublishOutcome, Publisher, QueueType, RetryPolicy, Settle, Subscriber, Worker,
    };
    #[cfg(feature = "macros")]
    pub use rabbitkit_macros::subscriber;
}

/// Turns an `async fn` handler into a subscriber; see the attribute's keys below.
///
/// ```no_run
/// use rabbitkit::prelude::*;
///
/// /// Ships paid orders.
/// #[subscriber(queue = "shipping", exchange = "shop", routing_key = "order.paid",
///              retry = ["1s", "30s", "5m"], max_attempts = 5, prefetch = 50, deadline = "20s")]
/// async fn ship(Body(body): Body) -> Result<(), BoxError> {
///     println!("shipping {} bytes", body.len());
///     Ok(())
/// }
///
/// # async fn run() -> rabbitkit::Result<()> {
/// Worker::new(ConnectionConfig::new("amqp://guest:guest@127.0.0.1:5672/%2f"))
///     .subscribe(ship)
///     .run_until(async { /* a shutdown signal */ })
///     .await?;
/// # Ok(()) }
/// ```
///
/// The function becomes a unit struct of the same name implementing [`IntoSubscriber`];
/// `ship::handler` is the function itself (call it in tests), `ship::subscriber()` the
/// [`Subscriber`] it stands for, `ship::NAME` and `ship::QUEUE` its name and queue. All the
/// generated code is public builder calls, so anything the attribute does can be written by
/// hand.
///
/// | key | value | builder call |
/// |---|---|---|
/// | `queue` (required) | `"orders"` | [`Subscriber::new`] |
/// | `name` | `"orders-v2"` (default: the function name) | [`Subscriber::name`] |
/// | `exchange` | `"shop"` (needs a routing key) | [`Subscriber::bind`] |
/// | `routing_key` | `"order.*"` | [`Subscriber::bind`] |
/// | `routing_keys` | `["order.created", "order.paid"]` | [`Subscriber::bind`] per key |
/// | `exchange_kind` | `"topic"` (default), `"direct"`, `"fanout"`, `"headers"` | [`Subscriber::exchange_kind`] |
/// | `queue_type` | `"classic"` (default), `"quorum"` | [`Subscriber::queue_type`] |
/// | `delivery_limit` | `10` (quorum only) | [`Subscriber::delivery_limit`] |
/// | `tier_queue_type` | `"quorum"` (default), `"classic"` (opt-in: at-most-once dead-lettering out of the tiers) | [`Subscriber::tier_queue_type`] |
/// | `ack` | `"auto"` (default), `"manual"`, `"nack-on-error"`, `"ack-first"` | [`Subscriber::ack_policy`] |
/// | `manual_fallback` | `"nack-requeue"` (default), `"auto"`, `"ack"`, `"reject"` | [`Subscriber::manual_fallback`] |
/// | `requeue_limit` | `20` (default; at least 1) | [`Subscriber::requeue_limit`] |
/// | `retry` | `["1s", "30s", "5m"]`; `[]` parks on the first failure | [`Subscriber::retry`] |
/// | `max_attempts` | `5` | [`RetryPolicy::max_attempts`] |
/// | `immediate_retries` | `2` | [`RetryPolicy::immediate_retries`] |
/// | `jitter` | `true` / `false` | [`RetryPolicy::jitter`] |
/// | `on_kind` | `("inventory", retry = ["30s", "5m"], max_attempts = 10)` or `("validation", park = true)`; once per kind | [`RetryPolicy::on_kind`] with a [`KindPolicy`](kind::KindPolicy) |
/// | `error_kind` | `ChargeError` or `[ChargeError, StockError]`: types implementing [`ErrorKind`](kind::ErrorKind) | [`Subscriber::error_kind`] per type |
/// | `kinds` | `["validation"]`: kinds the handler gives ad hoc | [`Subscriber::kinds`] |
/// | `prefetch` | `50` (1..=65535) | [`Subscriber::prefetch`] |
/// | `concurrency` | `8` (at least 1) | [`Subscriber::concurrency`] |
/// | `deadline` | `"30s"` | [`Subscriber::deadline`] |
/// | `ack_coalescing` | `(32, "5ms")`: max acks (1..=prefetch), max delay (at most 1 s); off by default | [`Subscriber::ack_coalescing`] |
/// | `crate` | `"::my::rabbitkit"` (default `::rabbitkit`) | where the facade is |
///
/// `on_kind` is the attribute's form of `[subscribers.retry.kinds.KIND]` in a worker config
/// file: `park = true` parks failures of that kind at once; `retry` and `max_attempts` give
/// them their own tiers and limit, the subscriber's policy filling in what is left out.
/// The kinds it names must be ones the handler's failures can carry: listed by an
/// `error_kind` type's [`KINDS`](kind::ErrorKind::KINDS), declared in `kinds`, or
/// rabbitkit's own ([`BUILTIN_KINDS`](kind::BUILTIN_KINDS)); otherwise the worker refuses
/// to start ([`Error::UnknownKind`]), since the policy would never apply.
///
/// A mistake in the attribute is one compile error: the function still becomes its unit
/// struct (with a stand-in subscriber), so its uses are not reported too.
///
/// Compile errors point at the offending token: an unknown key, a value of the wrong type,
/// a bad duration, a non-async or generic function, `ack = "manual"` without a [`Settle`]
/// parameter (or a `Settle` parameter without it).
#[cfg(feature = "macros")]
pub use rabbitkit_macros::subscriber;

/// What `#[subscriber]` expands to. Not a public API: names here change without notice.
#[doc(hidden)]
pub mod __private {
    pub use core::time::Duration;
    pub use rabbitkit_core::{
        AckPolicy, IntoSubscriber, ManualFallback, QueueType, RetryPolicy, Subscriber,
        kind::KindPolicy,
    };
}
