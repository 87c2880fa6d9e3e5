//! The settle handle of manual ack mode.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::delivery::Delivery;
use crate::outcome::{Failure, Outcome};
use crate::settle::SettleReport;

/// Where a settle request goes (the broker in production; a recorder in tests).
pub(crate) trait SettleSink: Send + Sync + 'static {
    fn settle(
        &self,
        delivery: Delivery,
        outcome: Outcome,
    ) -> Pin<Box<dyn Future<Output = SettleReport> + Send + '_>>;
}

/// Settles a delivery by hand (manual ack mode). Settle before the handler returns: once it
/// returns unsettled the fallback applies and a later settle is ignored.
///
/// `retry` and `park` go through the same confirmed path as auto mode: the copy is
/// confirmed before the original is acked. Only the first settle counts; later ones return
/// [`SettleReport::Nothing`].
#[derive(Clone)]
pub struct Settle {
    shared: Arc<Shared>,
}

struct Shared {
    sink: Arc<dyn SettleSink>,
    delivery: Mutex<Option<Delivery>>,
    settled: AtomicBool,
}

impl std::fmt::Debug for Settle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settle")
            .field("settled", &self.is_settled())
            .finish()
    }
}

impl Settle {
    pub(crate) fn new(sink: Arc<dyn SettleSink>) -> Self {
        Self {
            shared: Arc::new(Shared {
                sink,
                delivery: Mutex::new(None),
                settled: AtomicBool::new(false),
            }),
        }
    }

    /// Links the delivery (after it is built with this handle inside).
    pub(crate) fn attach(&self, d: Delivery) {
        *self
            .shared
            .delivery
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(d);
    }

    /// Breaks the handle ↔ delivery cycle once the handler is done.
    pub(crate) fn detach(&self) {
        self.shared
            .delivery
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
    }

    /// Takes the right to settle; false when the handler already settled.
    pub(crate) fn claim(&self) -> bool {
        !self.shared.settled.swap(true, Ordering::AcqRel)
    }

    /// Whether a settle call has been made.
    pub fn is_settled(&self) -> bool {
        self.shared.settled.load(Ordering::Acquire)
    }

    /// Acks the delivery.
    pub async fn ack(&self) -> SettleReport {
        self.run(Outcome::Ack).await
    }

    /// Nacks with requeue.
    pub async fn requeue(&self) -> SettleReport {
        self.run(Outcome::Requeue).await
    }

    /// Nacks without requeue (dead-lettered to parking by the broker).
    pub async fn reject(&self) -> SettleReport {
        self.run(Outcome::Reject).await
    }

    /// Publishes a confirmed retry copy (or parks when attempts are exhausted), then acks.
    pub async fn retry(&self, failure: impl Into<Failure>) -> SettleReport {
        self.run(Outcome::retry(failure)).await
    }

    /// Like [`Settle::retry`] through the smallest tier at least `after` long.
    pub async fn retry_after(&self, after: Duration, failure: impl Into<Failure>) -> SettleReport {
        self.run(Outcome::retry_after(after, failure)).await
    }

    /// Publishes a confirmed parking copy, then acks.
    pub async fn park(&self, failure: impl Into<Failure>) -> SettleReport {
        self.run(Outcome::park(failure)).await
    }

    pub(crate) async fn run(&self, outcome: Outcome) -> SettleReport {
        if self.shared.settled.swap(true, Ordering::AcqRel) {
            tracing::warn!("delivery settled twice; the second settle is ignored");
            return SettleReport::Nothing;
        }
        let d = self
            .shared
            .delivery
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        match d {
            Some(d) => self.shared.sink.settle(d, outcome).await,
            None => {
                tracing::warn!("settle after the handler returned: the fallback already applied");
                SettleReport::Nothing
            }
        }
    }
}
