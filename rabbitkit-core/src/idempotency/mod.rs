//! Skipping deliveries that were already processed: the [`Idempotent`] tower layer.
//!
//! At-least-once delivery means duplicates: a connection lost after the handler's effect
//! but before the ack redelivers the message, and producers retry publishes. The layer
//! keeps a key per processed message (by default the message id **and a digest of the
//! body**, see [`KeyBy`]) in an [`IdempotencyStore`] and acks a delivery whose key is
//! already there without running the handler again.
//!
//! # The key
//!
//! | key | a duplicate is | a reused or guessed id with another body |
//! |---|---|---|
//! | [`KeyBy::MessageIdAndBody`] (default) | same id, same body | runs the handler; a warning names the id |
//! | [`KeyBy::MessageId`] | same id | **acked without running the handler: the message is lost to the handler** |
//! | [`IdempotentLayer::key`] | same key you compute | as your key decides |
//!
//! The default is the message id plus a SHA-256 digest of the body. A redelivery, a retry
//! copy and a replayed copy carry the body unchanged, so every duplicate rabbitkit itself
//! can cause is still caught; a producer that reuses an id (a counter reset, a bug, an id
//! derived from a business key that repeats) or a producer guessing another's id can no
//! longer make the layer ack a *different* message unprocessed: different body, different
//! key, and the handler runs. When the id was already processed with another body, the
//! layer logs a warning with the message id (it keeps a second mark per message for that,
//! `"{id}#sha256"`, looked up together with the key). The digest is a cryptographic hash: a
//! producer cannot craft another body with the same key, and a store shared by processes
//! or kept across restarts sees the same key for the same message everywhere.
//!
//! [`KeyBy::MessageId`] keys on the id alone: for producers that legitimately resend one
//! message id with a re-serialised body (field order, whitespace, a new timestamp inside),
//! where a body digest would let the resend run the handler again. It trusts every
//! producer of the queue with the id's uniqueness: an id used twice for two messages
//! skips the second one.
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
//! - With the default key, a resend of one message id whose body differs by a single byte
//!   (re-serialised JSON): it runs the handler (and warns). Use [`KeyBy::MessageId`] or
//!   your own key for such producers.
//!
//! # Upgrading from marks keyed on the bare message id
//!
//! rabbitkit 0.1.0 keyed marks on the bare message id, and that is all a persistent store
//! filled by it holds. The default key does not match those marks: a duplicate of
//! a message processed just before the upgrade runs the handler once more (a duplicate,
//! which at-least-once allows; matching bare ids would let any reused id through, a loss).
//! To keep them matched through the store's retention window, start with
//! `.key_by(KeyBy::MessageId)`, and switch to the default once that window has passed.
//! [`MemoryStore`] is empty after the restart of an upgrade anyway.
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

/// What the [`Idempotent`] layer keys a processed message on (see the
/// [module docs](self#the-key) for what each protects against).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum KeyBy {
    /// The message id and a SHA-256 digest of the body (the default): a duplicate is the
    /// same message id with the same body. A reused or guessed id with another body runs
    /// the handler, with a warning naming the id. The key is `"{id}#sha256:{digest}"`
    /// (the digest's first 128 bits, in hex), and a second mark, `"{id}#sha256"`, says
    /// the id was processed with some body.
    #[default]
    MessageIdAndBody,
    /// The message id alone (the key is the id): a duplicate is any delivery with an id
    /// already processed, whatever its body. For producers that resend one id with a
    /// re-serialised body; every producer of the queue must keep ids unique, or a message
    /// that reuses one is acked without running the handler.
    MessageId,
}

impl KeyBy {
    /// The store key of a message with `message_id` and `body` under this choice: what
    /// the layer looks up and marks (to inspect or fill a store by hand).
    pub fn key_of(self, message_id: &str, body: &[u8]) -> String {
        match self {
            KeyBy::MessageId => message_id.to_owned(),
            KeyBy::MessageIdAndBody => format!("{message_id}#sha256:{}", body_digest(body)),
        }
    }
}

/// Wraps a service in [`Idempotent`].
#[derive(Clone)]
pub struct IdempotentLayer {
    store: Arc<dyn IdempotencyStore>,
    key: Keyer,
}

/// How the keys of a delivery are made.
#[derive(Clone)]
enum Keyer {
    By(KeyBy),
    Custom(KeyFn),
}

/// The store keys of one delivery.
struct Keys {
    /// Marked once the handler succeeded; a delivery whose key is marked is skipped.
    key: String,
    /// With [`KeyBy::MessageIdAndBody`]: the message id, and its mark `"{id}#sha256"`, set
    /// with the key, that says the id was processed with some body (read only to warn).
    sighting: Option<(String, String)>,
}

impl Keyer {
    fn keys(&self, delivery: &Delivery) -> Option<Keys> {
        // An empty id is no id: keyed on it, every such message after the first would be
        // acked unprocessed.
        let id = || delivery.message_id().filter(|id| !id.is_empty());
        match self {
            Keyer::By(KeyBy::MessageId) => Some(Keys {
                key: id()?.to_owned(),
                sighting: None,
            }),
            Keyer::By(KeyBy::MessageIdAndBody) => {
                let id = id()?;
                Some(Keys {
                    key: KeyBy::MessageIdAndBody.key_of(id, delivery.body()),
                    sighting: Some((id.to_owned(), format!("{id}#sha256"))),
                })
            }
            Keyer::Custom(f) => Some(Keys {
                key: f(delivery)?,
                sighting: None,
            }),
        }
    }
}

/// The first 128 bits of the body's SHA-256, in hex: stable across processes, releases and
/// platforms (a store may be shared and outlive a restart), and no producer can make
/// another body with the same digest.
fn body_digest(body: &[u8]) -> String {
    use sha2::Digest;
    use std::fmt::Write;
    let digest = sha2::Sha256::digest(body);
    digest[..16]
        .iter()
        .fold(String::with_capacity(32), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

impl std::fmt::Debug for IdempotentLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotentLayer").finish_non_exhaustive()
    }
}

impl IdempotentLayer {
    /// Deduplicates by message id and body digest ([`KeyBy::MessageIdAndBody`]) in
    /// `store`. Deliveries without a message id (or with an empty one) run as usual.
    pub fn new(store: impl IdempotencyStore) -> Self {
        Self {
            store: Arc::new(store),
            key: Keyer::By(KeyBy::default()),
        }
    }

    /// Deduplicates by `key_by` instead of the default (see [`KeyBy`] for what each
    /// protects against).
    #[must_use]
    pub fn key_by(mut self, key_by: KeyBy) -> Self {
        self.key = Keyer::By(key_by);
        self
    }

    /// Deduplicates by the key `key` computes instead (`None`: no key, the handler runs).
    /// Everything a delivery with the same key carries is then taken as processed: make
    /// the key name the message, not only its sender's claim of an id.
    #[must_use]
    pub fn key<F>(mut self, key: F) -> Self
    where
        F: Fn(&Delivery) -> Option<String> + Send + Sync + 'static,
    {
        self.key = Keyer::Custom(Arc::new(key));
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
    key: Keyer,
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
        let Some(keys) = self.key.keys(&delivery) else {
            let fut = inner.call(delivery);
            return ResponseFuture {
                inner: Box::pin(async move { fut.await.map_err(Into::into) }),
            };
        };
        let store = self.store.clone();
        ResponseFuture {
            inner: Box::pin(async move {
                // Both marks at once: one round trip to a remote store, not two.
                let sighting = keys.sighting.as_ref().map(|(_, s)| store.seen(s));
                let (seen, sighted) = futures_util::future::join(
                    store.seen(&keys.key),
                    futures_util::future::OptionFuture::from(sighting),
                )
                .await;
                match seen {
                    Ok(false) => {}
                    Ok(true) => return Ok(skip(&delivery, &keys.key).await),
                    Err(e) => {
                        return Ok(Outcome::retry(Failure::from_error(
                            "idempotency-store",
                            e.as_ref(),
                        )));
                    }
                }
                match (sighted, &keys.sighting) {
                    (Some(Ok(true)), Some((id, _))) => tracing::warn!(
                        message_id = %id,
                        key = %keys.key,
                        "message id already processed with another body (a reused or guessed id); running the handler"
                    ),
                    (Some(Err(e)), _) => {
                        tracing::debug!(error = %e, "idempotency store: the id's mark could not be read")
                    }
                    _ => {}
                }
                let Some(handle) = delivery.settle_handle().cloned() else {
                    let outcome = inner.call(delivery).await.map_err(Into::into)?;
                    if matches!(outcome, Outcome::Ack) {
                        mark(store.as_ref(), &keys).await;
                    }
                    return Ok(outcome);
                };
                // Manual mode: the handler acks itself, so the mark goes into its handle.
                let sink = Arc::new(MarkingSink {
                    store,
                    keys,
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

async fn mark(store: &dyn IdempotencyStore, keys: &Keys) {
    let sighting = keys.sighting.as_ref().map(|(_, s)| store.mark(s));
    let (marked, sighted) = futures_util::future::join(
        store.mark(&keys.key),
        futures_util::future::OptionFuture::from(sighting),
    )
    .await;
    if let Err(e) = marked {
        // The effect happened: ack it anyway rather than retry it (which would repeat it).
        tracing::warn!(key = %keys.key, error = %e, "could not record the key as processed; acking anyway, a later duplicate would run again");
    }
    if let Some(Err(e)) = sighted {
        // Only the warning about a reused id depends on it.
        tracing::debug!(key = %keys.key, error = %e, "could not record the message id's mark");
    }
}

/// The handle given to a manual handler: `ack` marks the key, then acks the original.
struct MarkingSink {
    store: Arc<dyn IdempotencyStore>,
    keys: Keys,
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
                mark(self.store.as_ref(), &self.keys).await;
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
