//! Counting requeues, so that a message put back again and again ends parked instead of
//! looping for ever.
//!
//! A requeue (`basic.nack` with `requeue = true`) never counts an attempt, and a classic
//! queue keeps no count of its own (a quorum queue does, in `x-delivery-count`, but on
//! RabbitMQ 4.3 nacks no longer count toward its delivery limit; 4.3 adds
//! `x-acquired-count`). So each subscriber keeps a bounded in-process count per message,
//! and the requeue count a delivery carries is the largest of that count and the broker's
//! own counts when present. The in-process count sees the requeues this worker made: with
//! several workers on one queue the bound is at most the limit per worker.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use lapin::BasicProperties;

use crate::headers;

/// Messages remembered per subscriber; the oldest is forgotten first. Each entry is a few
/// bytes: a requeue loop needs only its own message remembered between two deliveries.
const CAPACITY: usize = 10_000;

/// A message's identity for counting: its message id and body, hashed.
pub(crate) type Key = u64;

/// A key no message has: [`Requeues`] ignores it. Every delivered message gets a real key
/// (see [`Requeues::key`]); the sentinel stays for callers that have nothing to count.
pub(crate) const UNCOUNTED: Key = 0;

/// What the broker counted for this message, when it counts: `x-delivery-count` (quorum
/// queues) and `x-acquired-count` (quorum queues, RabbitMQ 4.3).
pub(crate) fn broker_count(properties: &BasicProperties) -> u32 {
    let hdrs = properties.headers().as_ref();
    ["x-delivery-count", "x-acquired-count"]
        .iter()
        .filter_map(|name| headers::get(hdrs, name).and_then(headers::int))
        .map(|n| u32::try_from(n.max(0)).unwrap_or(u32::MAX))
        .max()
        .unwrap_or(0)
}

/// Requeues per message, bounded.
#[derive(Default)]
pub(crate) struct Requeues {
    inner: Mutex<Table>,
    /// Keys are hashed with a random seed of this table's own (foldhash): a producer
    /// would need the seed to make its message share another's count (the fixed-key
    /// SipHash used before needed none), and every delivery's body hashes faster.
    seed: foldhash::fast::RandomState,
    /// How many messages the table holds, written under the lock: every delivery asks
    /// the table twice (`get`, then `forget` once settled), and while nothing was
    /// requeued, which is nearly always, both answer from this without the lock.
    live: AtomicUsize,
}

#[derive(Debug, Default)]
struct Table {
    counts: HashMap<Key, u32>,
    order: VecDeque<Key>,
}

impl std::fmt::Debug for Requeues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Requeues")
            .field("live", &self.live)
            .finish_non_exhaustive()
    }
}

impl Requeues {
    /// The identity of a delivered message: its message id and body, so producers that
    /// reuse message ids still get one count per distinct message. A message without an id
    /// is known by its body, exchange and routing key: distinct messages that share all
    /// three (an external producer's `ping`) share one count while both are being
    /// requeued, which can park one of them early, at the requeue limit, with its body and
    /// the reason; not counting them let such a message loop for ever on a classic queue.
    pub(crate) fn key(
        &self,
        properties: &BasicProperties,
        body: &[u8],
        route: (&str, &str),
    ) -> Key {
        let mut h = self.seed.build_hasher();
        match properties.message_id().as_ref().map(|s| s.as_str()) {
            Some(id) if !id.is_empty() => {
                1u8.hash(&mut h);
                id.hash(&mut h);
            }
            _ => {
                2u8.hash(&mut h);
                route.0.hash(&mut h);
                route.1.hash(&mut h);
            }
        }
        body.hash(&mut h);
        // A real message never shares the sentinel.
        h.finish().max(1)
    }

    /// Requeues this worker has made of the message.
    pub(crate) fn get(&self, key: Key) -> u32 {
        if key == UNCOUNTED || self.live.load(Ordering::Acquire) == 0 {
            return 0;
        }
        let t = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        t.counts.get(&key).copied().unwrap_or(0)
    }

    /// One more requeue of the message, from at least `seen` (what the delivery carried).
    pub(crate) fn bump(&self, key: Key, seen: u32) {
        if key == UNCOUNTED {
            return;
        }
        let mut t = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let Table { counts, order } = &mut *t;
        match counts.get_mut(&key) {
            Some(n) => *n = (*n).max(seen).saturating_add(1),
            None => {
                while counts.len() >= CAPACITY {
                    match order.pop_front() {
                        Some(old) => {
                            counts.remove(&old);
                        }
                        None => break,
                    }
                }
                counts.insert(key, seen.saturating_add(1));
                order.push_back(key);
                self.live.store(counts.len(), Ordering::Release);
            }
        }
    }

    /// The message left the queue (acked, retried, parked, rejected): forget it.
    pub(crate) fn forget(&self, key: Key) {
        if key == UNCOUNTED || self.live.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut t = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if t.counts.remove(&key).is_some() {
            t.order.retain(|k| *k != key);
            self.live.store(t.counts.len(), Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::{AMQPValue, FieldTable};

    #[test]
    fn messages_without_an_id_are_counted_by_content_and_route() {
        let r = Requeues::default();
        let none = BasicProperties::default();
        let empty = BasicProperties::default().with_message_id("".into());
        for p in [&none, &empty] {
            let k = r.key(p, b"poison", ("shop", "order.created"));
            assert_ne!(k, UNCOUNTED, "a message without an id must be counted");
            assert_eq!(k, r.key(p, b"poison", ("shop", "order.created")));
            assert_ne!(k, r.key(p, b"other", ("shop", "order.created")));
            assert_ne!(k, r.key(p, b"poison", ("shop", "order.paid")));
            r.bump(k, 0);
            r.bump(k, 0);
            assert_eq!(r.get(k), 2, "requeues of a message without an id add up");
            r.forget(k);
        }
        let with_id = BasicProperties::default().with_message_id("poison".into());
        assert_ne!(
            r.key(&with_id, b"x", ("", "q")),
            r.key(&none, b"x", ("", "q")),
            "an id never collides with a route-keyed message by construction"
        );
    }

    #[test]
    fn counts_grow_and_are_forgotten() {
        let r = Requeues::default();
        let p = BasicProperties::default().with_message_id("m".into());
        let (a, b) = (r.key(&p, b"a", ("", "q")), r.key(&p, b"b", ("", "q")));
        assert_eq!(a, r.key(&p, b"a", ("", "q")), "one message, one key");
        assert_ne!(a, b, "one id, two bodies: two messages");
        r.bump(a, 0);
        r.bump(a, 0);
        assert_eq!((r.get(a), r.get(b)), (2, 0));
        r.bump(b, 5);
        assert_eq!(r.get(b), 6, "starts from what the broker counted");
        r.forget(a);
        assert_eq!(r.get(a), 0);
    }

    #[test]
    fn the_table_is_bounded() {
        let r = Requeues::default();
        for k in 0..(CAPACITY as u64 + 10) {
            r.bump(k, 0);
        }
        let t = r.inner.lock().unwrap_or_else(|p| p.into_inner());
        assert_eq!(t.counts.len(), CAPACITY);
        assert_eq!(t.order.len(), CAPACITY);
        assert!(!t.counts.contains_key(&0), "the oldest went first");
    }

    #[test]
    fn broker_counts_are_read_leniently() {
        let mut h = FieldTable::default();
        h.insert("x-delivery-count".into(), AMQPValue::LongInt(4));
        h.insert("x-acquired-count".into(), AMQPValue::LongLongInt(7));
        let p = BasicProperties::default().with_headers(h);
        assert_eq!(broker_count(&p), 7);
        assert_eq!(broker_count(&BasicProperties::default()), 0);
    }
}
