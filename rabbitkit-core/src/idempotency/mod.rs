//! Skipping deliveries that were already processed: the [`Idempotent`] tower layer.
//!
//! At-least-once delivery means duplicates: a connection lost after the handler's effect
//! but before the ack redelivers the message, and producers retry publishes. The layer
//! keeps a key per processed message (the message id by default) in an
//! [`IdempotencyStore`] and acks a delivery whose key is already there without running the
//! handler again.
//!
//! # What it covers
//!
//! - **Processed, then the ack was lost** (crash, connection closed, channel gone between
//!   the handler's success and the ack): the key was marked before the ack was sent, so the
//!   redelivery is acked without running the handler. Proven on a broker by the
//!   `duplicate_after_a_lost_ack_is_acked_without_a_second_effect` integration test.
//! - A producer publishing the same message id twice, one after the other.
//!
//! Both only when the duplicate reaches a consumer that can see the mark: with
//! [`MemoryStore`], the same process, before a restart, while the key is still held.
//!
//! # What it does not cover
//!
//! - **The effect and the mark are not atomic.** The mark is a separate write after the
//!   handler returns (in manual mode, inside its `ack`). If the process dies between the
//!   effect and the mark, or the mark fails, the next copy runs the handler again. Only an
//!   effect that is itself idempotent (a unique key in the same database transaction, as the
//!   `manual_sqlite` example does) closes this.
//! - **Concurrent duplicates.** Two copies of one key in flight at the same time (a
//!   duplicate publish picked up by another consumer, or by this one with concurrency above
//!   one, while the first still runs) both find the key unseen and both run. `seen` and
//!   `mark` are a lookup and a later write, not a claim, so a shared transactional store
//!   does not prevent this either; again the effect must be idempotent.
//! - **Redeliveries to another process.** After a connection loss the broker may hand the
//!   message to any consumer of the queue. An in-process store (like [`MemoryStore`]) only
//!   knows what its own process marked; a store shared by every consumer (a database
//!   table) is needed for those.
//! - **Forgotten keys.** [`MemoryStore`] is empty after a restart, evicts the oldest keys
//!   past its capacity and treats keys older than its TTL as unseen; a duplicate arriving
//!   after that runs the handler.
//! - Deliveries without a key (no message id, or your key function returned `None`): the
//!   handler runs.
//!
//! # Store failures
//!
//! - The lookup fails: the delivery is **retried** through the delay tiers (failure kind
//!   `idempotency-store`); the handler does not run, so no effect happens twice.
//! - The mark fails after the handler succeeded: the effect has happened, so the original is
//!   **still acked** (never an ack without the effect, never a retry that would repeat it);
//!   a warning says that this key is not remembered and a later duplicate would run again.
//! - The handler fails: nothing is marked, so its retry runs the handler again.
//!
//! # Ack policies
//!
//! In `Auto` and `NackOnError` mode a handler outcome of [`Outcome::Ack`] is marked before
//! the runtime acks. In `Manual` mode the handler's [`Settle`] handle is wrapped: its `ack`
//! marks first, then acks; a skipped duplicate is acked through the handle. Under
//! `AckFirst` the original is acked on receipt, before the layer runs: a crash loses the
//! message rather than duplicating it, so the layer only catches duplicate publishes.
//!
//! ```
//! use std::time::Duration;
//! use rabbitkit_core::Subscriber;
//! use rabbitkit_core::idempotency::{IdempotentLayer, MemoryStore};
//!
//! async fn handle() {}
//!
//! let store = MemoryStore::new(100_000, Duration::from_secs(3600));
//! let orders = Subscriber::new("orders", handle).layer(IdempotentLayer::new(store));
//! ```

mod store;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use tower::{Layer, Service};

pub use self::store::{IdempotencyStore, MemoryStore, StoreFuture};

use crate::delivery::Delivery;
use crate::error::BoxError;
use crate::manual::{Settle, SettleSink};
use crate::outcome::{Failure, Outcome};
use crate::settle::SettleReport;

type KeyFn = Arc<dyn Fn(&Delivery) -> Option<String> + Send + Sync>;

/// Wraps a service in [`Idempotent`].
#[derive(Clone)]
pub struct IdempotentLayer {
    store: Arc<dyn IdempotencyStore>,
    key: KeyFn,
}

impl std::fmt::Debug for IdempotentLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotentLayer").finish_non_exhaustive()
    }
}

impl IdempotentLayer {
    /// Deduplicates by message id in `store`. Deliveries without a message id (or with an
    /// empty one) run as usual.
    pub fn new(store: impl IdempotencyStore) -> Self {
        Self {
            store: Arc::new(store),
            // An empty id is no id: keyed on it, every such message after the first would
            // be acked unprocessed.
            key: Arc::new(|d: &Delivery| {
                d.message_id()
                    .filter(|id| !id.is_empty())
                    .map(str::to_owned)
            }),
        }
    }

    /// Deduplicates by the key `key` computes instead (`None`: no key, the handler runs).
    #[must_use]
    pub fn key<F>(mut self, key: F) -> Self
    where
        F: Fn(&Delivery) -> Option<String> + Send + Sync + 'static,
    {
        self.key = Arc::new(key);
        self
    }
}

impl<S> Layer<S> for IdempotentLayer {
    type Service = Idempotent<S>;

    fn layer(&self, inner: S) -> Idempotent<S> {
        Idempotent {
            inner,
            store: self.store.clone(),
            key: self.key.clone(),
        }
    }
}

/// A service that acks a delivery whose key was already processed without calling `inner`,
/// and marks the key once `inner` succeeded. See the [module docs](self) for exactly what
/// this covers.
#[derive(Clone)]
pub struct Idempotent<S> {
    inner: S,
    store: Arc<dyn IdempotencyStore>,
    key: KeyFn,
}

impl<S: std::fmt::Debug> std::fmt::Debug for Idempotent<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotent")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S> Service<Delivery> for Idempotent<S>
where
    S: Service<Delivery, Response = Outcome> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = Outcome;
    type Error = BoxError;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, delivery: Delivery) -> ResponseFuture {
        // The clone takes the place of the service that was polled ready, which runs now.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let Some(key) = (self.key)(&delivery) else {
            let fut = inner.call(delivery);
            return ResponseFuture {
                inner: Box::pin(async move { fut.await.map_err(Into::into) }),
            };
        };
        let store = self.store.clone();
        ResponseFuture {
            inner: Box::pin(async move {
                match store.seen(&key).await {
                    Ok(false) => {}
                    Ok(true) => return Ok(skip(&delivery, &key).await),
                    Err(e) => {
                        return Ok(Outcome::retry(Failure::from_error(
                            "idempotency-store",
                            e.as_ref(),
                        )));
                    }
                }
                let Some(handle) = delivery.settle_handle().cloned() else {
                    let outcome = inner.call(delivery).await.map_err(Into::into)?;
                    if matches!(outcome, Outcome::Ack) {
                        mark(store.as_ref(), &key).await;
                    }
                    return Ok(outcome);
                };
                // Manual mode: the handler acks itself, so the mark goes into its handle.
                let sink = Arc::new(MarkingSink {
                    store,
                    key,
                    handle,
                    running: AtomicBool::new(true),
                });
                let wrapped = delivery.with_settle(Settle::new(sink.clone()));
                let result = inner.call(wrapped).await.map_err(Into::into);
                sink.running.store(false, Ordering::Release);
                result
            }),
        }
    }
}

/// A duplicate: ack it without running the handler.
async fn skip(delivery: &Delivery, key: &str) -> Outcome {
    tracing::info!(
        key,
        redelivered = delivery.redelivered(),
        "already processed; acked without running the handler"
    );
    match delivery.settle_handle() {
        Some(h) => {
            h.ack().await;
            Outcome::Settled
        }
        None => Outcome::Ack,
    }
}

async fn mark(store: &dyn IdempotencyStore, key: &str) {
    if let Err(e) = store.mark(key).await {
        // The effect happened: ack it anyway rather than retry it (which would repeat it).
        tracing::warn!(key, error = %e, "could not record the key as processed; acking anyway, a later duplicate would run again");
    }
}

/// The handle given to a manual handler: `ack` marks the key, then acks the original.
struct MarkingSink {
    store: Arc<dyn IdempotencyStore>,
    key: String,
    handle: Settle,
    /// False once the handler returned: a later settle must not mark the key.
    running: AtomicBool,
}

impl SettleSink for MarkingSink {
    fn settle(&self, outcome: Outcome) -> Pin<Box<dyn Future<Output = SettleReport> + Send + '_>> {
        Box::pin(async move {
            if !self.running.load(Ordering::Acquire) {
                tracing::warn!("settle after the handler returned: the fallback already applied");
                return SettleReport::Nothing;
            }
            if matches!(outcome, Outcome::Ack) {
                mark(self.store.as_ref(), &self.key).await;
            }
            self.handle.run(outcome).await
        })
    }
}

/// The future of [`Idempotent`].
pub struct ResponseFuture {
    inner: Pin<Box<dyn Future<Output = Result<Outcome, BoxError>> + Send>>,
}

impl std::fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ResponseFuture")
    }
}

impl Future for ResponseFuture {
    type Output = Result<Outcome, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

#[cfg(all(test, feature = "test-util"))]
mod tests;
