//! # rabbitkit
//!
//! RabbitMQ consumers that never lose a message.
//!
//! You write handlers; rabbitkit consumes, runs them, and settles every delivery:
//!
//! - success → ack;
//! - failure → a **retry copy** into a delay tier (`orders.retry.30s`) or a **parking copy**
//!   with evidence headers, published on a confirm-mode channel with `mandatory = true`; the
//!   original is acked **only after that copy is confirmed**. A nack, a return, a timeout or a
//!   lost channel leaves the original unacked and it is requeued;
//! - attempts are counted in rabbitkit's own header (RabbitMQ 4.x restarts `x-death` counts);
//!   past the limit the message is parked with its body, headers and failure reason;
//! - undecodable payloads are parked at once, never requeued in a loop;
//! - manual ack mode for handlers that commit to a database first.
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
//!     .run_until(async { /* a shutdown signal */ })
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! Guides: `docs/ARCHITECTURE.md`, `docs/GUARANTEES.md`, `docs/RETRY-AND-PARKING.md`,
//! `docs/BROKER-VERSIONS.md` in the repository.

pub use rabbitkit_core::{
    AckPolicy, BoxError, Classify, ConnectionConfig, DefaultClassifier, Delivery, Envelope, Error,
    ErrorClass, Failure, IntoOutcome, IntoSubscriber, ManualFallback, Outcome, PendingConfirm,
    Permanent, PublishOutcome, Publisher, PublisherConfig, PublisherStats, QueueType, Result,
    RetryPolicy, Settle, SettleReport, Subscriber, SubscriberStats, Topology, TopologyMode, Worker,
    WorkerHandle, WorkerReport,
};
pub use rabbitkit_core::{amqp, decide, extract, handler, headers, retry, topology};

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
}
