//! The settle handle of manual ack mode, and what a settlement reports.
//!
//! The handle knows neither the delivery nor the broker: it forwards the handler's request
//! to a sink (the worker's pipeline, or the test kit), which knows which delivery it
//! settles. So the settlement walk stays one-way: run → decide → settle.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::outcome::{Failure, Outcome};

/// What became of a settlement.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SettleReport {
    /// The original was acked: its ack frame is queued on its channel, in order (or held
    /// by the channel's ack coalescing). Should the channel die before the frame is
    /// written, the broker redelivers the message (counted `ack_lost`).
    Acked,
    /// A retry copy was confirmed, then the original acked (as [`SettleReport::Acked`]).
    Retried,
    /// A parking copy was confirmed, then the original acked (as [`SettleReport::Acked`]).
    Parked,
    /// The original was nacked with requeue.
    Requeued,
    /// The original was nacked without requeue.
    Rejected,
    /// The copy was not confirmed (the label says why); the original was requeued.
    CopyNotConfirmed(String),
    /// The channel of the original is gone; the broker will redeliver it.
    ChannelGone,
    /// Nothing to do (already settled).
    Nothing,
}

/// Where a settle request goes (the broker in production; a recorder in tests). The sink
/// knows the delivery; after the handler returned it answers [`SettleReport::Nothing`].
pub(crate) trait SettleSink: Send + Sync + 'static {
    fn settle(&self, outcome: Outcome) -> Pin<Box<dyn Future<Output = SettleReport> + Send + '_>>;
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
    /// Whether a settle (the handler's, or the fallback's claim) was taken. A lock, not a
    /// flag: the handler's settle hands its request to the sink while holding it, so a
    /// claim racing a settle from another task sees either nothing or a request the sink
    /// already holds (and the pipeline waits for), never a settle taken but not yet started.
    settled: Mutex<bool>,
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
                settled: Mutex::new(false),
            }),
        }
    }

    /// Takes the right to settle; false when the handler already settled.
    pub(crate) fn claim(&self) -> bool {
        !std::mem::replace(&mut *self.lock(), true)
    }

    /// Whether a settle call has been made.
    pub fn is_settled(&self) -> bool {
        *self.lock()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, bool> {
        self.shared
            .settled
            .lock()
            .unwrap_or_else(|p| p.into_inner())
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
        let started = {
            let mut settled = self.lock();
            if std::mem::replace(&mut *settled, true) {
                tracing::warn!("delivery settled twice; the second settle is ignored");
                return SettleReport::Nothing;
            }
            // Starts the settlement (the worker spawns it) before the lock is released.
            self.shared.sink.settle(outcome)
        };
        started.await
    }
}
