//! Where processed keys are remembered: the store trait and a bounded in-memory store.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::error::BoxError;

/// The future a store returns.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send + 'a>>;

/// Remembers which keys (message ids, or your own) were processed.
///
/// The [`Idempotent`](super::Idempotent) layer asks [`seen`](Self::seen) before the handler
/// runs and calls [`mark`](Self::mark) after it succeeded, before the original is acked.
/// A store shared by several workers (a database table) covers redeliveries to any of them;
/// an in-process one covers redeliveries to the same process only.
pub trait IdempotencyStore: Send + Sync + 'static {
    /// Whether `key` was marked processed (and is still remembered).
    fn seen<'a>(&'a self, key: &'a str) -> StoreFuture<'a, bool>;

    /// Records `key` as processed.
    fn mark<'a>(&'a self, key: &'a str) -> StoreFuture<'a, ()>;
}

impl<T: IdempotencyStore> IdempotencyStore for Arc<T> {
    fn seen<'a>(&'a self, key: &'a str) -> StoreFuture<'a, bool> {
        T::seen(self, key)
    }

    fn mark<'a>(&'a self, key: &'a str) -> StoreFuture<'a, ()> {
        T::mark(self, key)
    }
}

/// An in-process store holding at most `capacity` keys, each for `ttl`.
///
/// Past the capacity the oldest mark is forgotten first; a key older than `ttl` counts as
/// unseen. Size both to cover the redelivery window you care about (a redelivery after a
/// connection loss arrives within seconds; a duplicate publish may take longer). Lost on
/// restart: a crash of this process forgets every key, so it does not cover a redelivery to
/// another process or after a restart. Use a shared store for that.
#[derive(Debug)]
pub struct MemoryStore {
    capacity: usize,
    ttl: Duration,
    inner: Mutex<Marks>,
}

#[derive(Debug, Default)]
struct Marks {
    at: HashMap<String, Instant>,
    // Marks in the order they were made; an entry whose instant no longer matches `at` is
    // stale (the key was marked again later) and is skipped on eviction.
    order: VecDeque<(String, Instant)>,
}

impl MemoryStore {
    /// A store of at most `capacity` keys (at least 1), each remembered for `ttl`.
    pub fn new(capacity: usize, ttl: Duration) -> Self {
        Self {
            capacity: capacity.max(1),
            ttl,
            inner: Mutex::new(Marks::default()),
        }
    }

    /// Keys currently remembered (expired ones may still be counted until the next mark).
    pub fn len(&self) -> usize {
        self.lock().at.len()
    }

    /// Whether no key is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Marks> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn seen_now(&self, key: &str) -> bool {
        self.lock()
            .at
            .get(key)
            .is_some_and(|t| t.elapsed() < self.ttl)
    }

    fn mark_now(&self, key: &str) {
        let now = Instant::now();
        let mut m = self.lock();
        m.at.insert(key.to_owned(), now);
        m.order.push_back((key.to_owned(), now));
        if m.order.len() > 2 * self.capacity {
            // Keys marked again leave stale entries behind: drop them so the queue stays
            // bounded too.
            let Marks { at, order } = &mut *m;
            order.retain(|(k, t)| at.get(k) == Some(t));
        }
        while let Some((k, t)) = m.order.front().cloned() {
            let expired = t.elapsed() >= self.ttl;
            if !expired && m.at.len() <= self.capacity {
                break;
            }
            m.order.pop_front();
            if m.at.get(&k) == Some(&t) {
                m.at.remove(&k);
            }
        }
    }
}

impl IdempotencyStore for MemoryStore {
    fn seen<'a>(&'a self, key: &'a str) -> StoreFuture<'a, bool> {
        Box::pin(std::future::ready(Ok(self.seen_now(key))))
    }

    fn mark<'a>(&'a self, key: &'a str) -> StoreFuture<'a, ()> {
        self.mark_now(key);
        Box::pin(std::future::ready(Ok(())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn seen(s: &MemoryStore, k: &str) -> bool {
        s.seen(k).await.unwrap_or_else(|e| panic!("{e}"))
    }

    async fn mark(s: &MemoryStore, k: &str) {
        s.mark(k).await.unwrap_or_else(|e| panic!("{e}"));
    }

    #[tokio::test(start_paused = true)]
    async fn marked_keys_are_seen_until_their_ttl() {
        let s = MemoryStore::new(10, Duration::from_secs(60));
        assert!(!seen(&s, "a").await);
        mark(&s, "a").await;
        assert!(seen(&s, "a").await);
        assert!(!seen(&s, "b").await);
        tokio::time::advance(Duration::from_secs(59)).await;
        assert!(seen(&s, "a").await);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(!seen(&s, "a").await, "expired");
        mark(&s, "b").await;
        assert_eq!(s.len(), 1, "the expired key is dropped on the next mark");
    }

    #[tokio::test(start_paused = true)]
    async fn the_oldest_mark_goes_first_past_the_capacity() {
        let s = MemoryStore::new(2, Duration::from_secs(60));
        mark(&s, "a").await;
        tokio::time::advance(Duration::from_millis(1)).await;
        mark(&s, "b").await;
        tokio::time::advance(Duration::from_millis(1)).await;
        // Marking "a" again makes it the newest: "b" is now the oldest.
        mark(&s, "a").await;
        tokio::time::advance(Duration::from_millis(1)).await;
        mark(&s, "c").await;
        assert_eq!(s.len(), 2);
        assert!(seen(&s, "a").await);
        assert!(!seen(&s, "b").await, "evicted");
        assert!(seen(&s, "c").await);
    }
}
