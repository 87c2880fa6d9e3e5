//! Runtime and stable traits of rabbitkit. Users depend on the `rabbitkit` facade crate.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod coalesce;
pub mod config;
pub mod connection;
pub mod decide;
pub mod delivery;
pub mod envelope;
pub mod error;
pub mod extract;
pub mod handler;
pub mod headers;
pub mod idempotency;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod inbox;
pub mod kind;
pub mod manual;
mod names;
pub mod observe;
pub mod outcome;
pub mod parking;
pub mod policy;
pub mod publisher;
mod queue_type;
mod requeues;
pub mod retry;
mod run;
pub mod settle;
mod signal;
mod stats;
pub mod subscriber;
#[cfg(feature = "test-util")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod testing;
pub mod topology;
mod trim;
pub mod trust;
pub mod worker;

pub use coalesce::AckCoalescing;
pub use connection::{ConnectionConfig, NodeOrder, TlsConfig};
pub use delivery::Delivery;
pub use envelope::Envelope;
pub use error::{BoxError, Error, Result};
pub use kind::{Classify, DefaultClassifier};
pub use manual::Settle;
pub use outcome::{ErrorClass, Failure, IntoOutcome, Outcome, Permanent};
pub use parking::{ParkedMessage, Parking, ReplayOptions, ReplayReport};
pub use policy::{AckPolicy, ManualFallback};
pub use publisher::{PendingConfirm, PublishOutcome, Publisher, PublisherConfig, PublisherStats};
pub use retry::RetryPolicy;
pub use settle::SettleReport;
pub use signal::shutdown_signal;
pub use stats::SubscriberStats;
pub use subscriber::{IntoSubscriber, Subscriber};
pub use topology::{QueueType, Topology, TopologyMode, TopologyReport};
pub use trust::{HeaderKeys, HeaderTrust};
pub use worker::{Worker, WorkerHandle, WorkerReport};

/// AMQP types rabbitkit deliberately re-exports from lapin (properties and header values).
pub mod amqp {
    pub use lapin::BasicProperties;
    pub use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
}
