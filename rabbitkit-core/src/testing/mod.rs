//! Broker-free tests of handlers and subscribers (feature `test-util`).
//!
//! Build a [`TestDelivery`], run it through a [`TestKit`] made from a handler, a tower
//! service or a whole [`Subscriber`], and assert on the [`Settlement`]: ack, retry (tier,
//! next attempt), park (reason, evidence headers), requeue, reject, and the copy that would
//! be published.
//!
//! The kit is not a model of the runtime: it calls the worker's own code for everything
//! between the delivery and the decision (extractors, the handler deadline, panics,
//! immediate retries, the manual `Settle` handle and its fallback, error classification,
//! the retry schedule, [`decide`](crate::decide::decide)). Only the broker is left out: the
//! decision is reported instead of carried out, as if every copy were confirmed.
//!
//! ```
//! use std::time::Duration;
//! use rabbitkit_core::{BoxError, RetryPolicy, Subscriber};
//! use rabbitkit_core::extract::Json;
//! use rabbitkit_core::testing::{TestDelivery, TestKit};
//!
//! #[derive(serde::Deserialize)]
//! struct Order { id: u64 }
//!
//! async fn handle(Json(order): Json<Order>) -> Result<(), BoxError> {
//!     if order.id == 0 { return Err("no such order".into()) }
//!     Ok(())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), BoxError> {
//! let kit = TestKit::new(
//!     Subscriber::new("orders", handle).retry(RetryPolicy::new([Duration::from_secs(5)])),
//! );
//! let s = kit.run(TestDelivery::json(&serde_json::json!({ "id": 0 }))?).await;
//! assert!(s.is_retry_after(Duration::from_secs(5)), "{s}");
//! assert_eq!(s.next_attempt(), Some(2));
//! assert_eq!(s.copy().map(|c| c.routing_key()), Some("orders.delay.5s"));
//! # Ok(()) }
//! ```

mod delivery;
mod settlement;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tower::util::BoxCloneService;
use tower::{Service, ServiceExt};

pub use self::delivery::{HeaderValue, TestDelivery};
pub use self::settlement::{SettledBy, Settlement};
pub use crate::decide::{CopyKind, Decision, ParkReason};

use crate::decide::{self, SettleSpec};
use crate::delivery::{Delivery, Extensions};
use crate::error::BoxError;
use crate::handler::Handler;
use crate::manual::SettleSink;
use crate::outcome::Outcome;
use crate::policy::AckPolicy;
use crate::run::{Link, LinkedSink, Runner};
use crate::settle::SettleReport;
use crate::stats::Counters;
use crate::subscriber::{BoxDeliveryService, IntoSubscriber, Subscriber};

/// Runs deliveries through a subscriber's handler and policies, without a broker.
pub struct TestKit {
    spec: Arc<SettleSpec>,
    // BoxCloneService is Send but not Sync; each run clones it out under the lock.
    service: Mutex<BoxDeliveryService>,
    deadline: Option<Duration>,
    worker_state: Extensions,
    subscriber_state: Extensions,
}

impl std::fmt::Debug for TestKit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestKit")
            .field("spec", &self.spec)
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

impl TestKit {
    /// A kit for a whole subscriber definition: its handler and layers, ack policy, manual
    /// fallback, classifier, retry policy, deadline and state. A `#[subscriber]` function
    /// works too.
    ///
    /// # Panics
    ///
    /// When [`Worker::start`](crate::Worker::start) would refuse the subscriber's settings
    /// (a zero deadline, a delivery limit on a classic queue, a `Settle` argument outside
    /// manual mode, a bad retry schedule...): a test of a definition the worker refuses
    /// would pass for nothing. State is not checked here; give it with
    /// [`TestKit::state`].
    pub fn new(subscriber: impl IntoSubscriber) -> Self {
        let s = subscriber.into_subscriber();
        if let Err(e) = s.validate() {
            panic!("TestKit: Worker::start would refuse this subscriber: {e}");
        }
        let deadline = s.effective_deadline();
        Self {
            spec: Arc::new(s.settle_spec()),
            service: Mutex::new(s.service),
            deadline,
            worker_state: Extensions::default(),
            subscriber_state: s.extensions,
        }
    }

    /// A kit for a handler function on `queue`, with the default subscriber settings.
    pub fn handler<H, Args>(queue: impl Into<String>, handler: H) -> Self
    where
        H: Handler<Args>,
        Args: 'static,
    {
        Self::new(Subscriber::new(queue, handler))
    }

    /// A kit for a tower service on `queue`, with the default subscriber settings.
    pub fn service<S>(queue: impl Into<String>, service: S) -> Self
    where
        S: Service<Delivery, Response = Outcome> + Clone + Send + 'static,
        S::Error: Into<BoxError>,
        S::Future: Send + 'static,
    {
        Self::new(Subscriber::service(queue, service))
    }

    /// Signs the copies' own headers as a worker with this [`HeaderTrust`] does
    /// ([`Worker::header_trust`](crate::Worker::header_trust)). The kit believes the headers
    /// of the deliveries it is given, as the runtime does once they are verified.
    ///
    /// [`HeaderTrust`]: crate::trust::HeaderTrust
    pub fn header_trust(mut self, trust: crate::trust::HeaderTrust) -> Self {
        Arc::make_mut(&mut self.spec).trust = trust;
        self
    }

    /// Worker-level state ([`Worker::state`](crate::Worker::state)); the subscriber's own
    /// state of the same type wins, as in the worker. A `Publisher` is not provided.
    #[must_use]
    pub fn state<T: Clone + Send + Sync + 'static>(mut self, value: T) -> Self {
        self.worker_state.insert(value);
        self
    }

    /// The work queue.
    pub fn queue(&self) -> &str {
        &self.spec.queue
    }

    /// Runs `delivery` through the handler and returns what the runtime would do.
    ///
    /// Immediate-retry pauses and deadlines are real `tokio::time` waits: a test can use
    /// `#[tokio::test(start_paused = true)]` to skip them.
    pub async fn run(&self, delivery: TestDelivery) -> Settlement {
        let runs = Arc::new(AtomicU32::new(0));
        let counted = {
            let runs = runs.clone();
            let svc = self
                .service
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            BoxCloneService::new(svc.map_request(move |d: Delivery| {
                runs.fetch_add(1, Ordering::Relaxed);
                d
            }))
        };
        let counters = Arc::new(Counters::default());
        let runner = Runner {
            spec: self.spec.clone(),
            service: Mutex::new(counted),
            deadline: self.deadline,
            counters: counters.clone(),
        };
        let mut state = self.worker_state.clone();
        state.extend(self.subscriber_state.clone());
        let builder = Delivery::builder(self.spec.queue.clone(), delivery.body)
            .route(delivery.exchange, delivery.routing_key)
            .redelivered(delivery.redelivered)
            .properties(delivery.properties)
            .extensions(Arc::new(state));
        let sink = Arc::new(RecordingSink {
            spec: self.spec.clone(),
            link: Link::default(),
            recorded: Mutex::new(None),
        });
        let handle_sink = sink.clone();
        let (d, manual) = runner.delivery(builder, move || handle_sink);
        let outcome = runner.run(&d).await;
        let decision = runner.conclude(&d, Some(outcome), manual.as_ref());
        let recorded = sink
            .recorded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let (decision, settled_by) = match (self.spec.policy, recorded) {
            (AckPolicy::AckFirst, _) => (decision, SettledBy::Receipt),
            (_, Some(by_handle)) => (by_handle, SettledBy::Handler),
            // A clean return without a settlement; a failure takes the policy's decision.
            (AckPolicy::Manual, None) if counters.snapshot().unsettled > 0 => {
                (decision, SettledBy::Fallback)
            }
            (_, None) => (decision, SettledBy::Policy),
        };
        Settlement {
            decision,
            settled_by,
            runs: runs.load(Ordering::Relaxed),
            stats: counters.snapshot(),
        }
    }
}

/// The manual handle's destination in tests: records the decision the runtime's sink would
/// carry out, and answers as if the broker confirmed it.
struct RecordingSink {
    spec: Arc<SettleSpec>,
    link: Link,
    recorded: Mutex<Option<Decision>>,
}

impl LinkedSink for RecordingSink {
    fn link(&self) -> &Link {
        &self.link
    }
}

impl SettleSink for RecordingSink {
    fn settle(
        &self,
        outcome: Outcome,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = SettleReport> + Send + '_>> {
        let Some(delivery) = self.link.get() else {
            return Box::pin(std::future::ready(SettleReport::Nothing));
        };
        let decision = decide::auto(&self.spec, &delivery, outcome);
        let report = match &decision {
            Decision::Ack => SettleReport::Acked,
            Decision::Republish {
                kind: CopyKind::Retry { .. },
                ..
            } => SettleReport::Retried,
            Decision::Republish { .. } => SettleReport::Parked,
            Decision::Requeue => SettleReport::Requeued,
            Decision::Reject => SettleReport::Rejected,
            Decision::Nothing => SettleReport::Nothing,
        };
        *self.recorded.lock().unwrap_or_else(|p| p.into_inner()) = Some(decision);
        Box::pin(std::future::ready(report))
    }
}

#[cfg(test)]
mod tests;
