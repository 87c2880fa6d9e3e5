//! Parking-queue tooling: count, inspect and replay what a subscriber parked.
//!
//! A parked message keeps its body, properties and evidence headers. [`Parking::peek`]
//! reads them without removing anything; [`Parking::replay`] moves messages back to the
//! work queue, one at a time, through the confirmed publisher: a parked message is acked
//! **only after its replayed copy is confirmed**, so a replay interrupted at any point
//! loses nothing (at worst one message is both replayed and still parked).
//!
//! A replayed copy has the failure evidence stripped ([`headers::FAILURE_HEADERS`]), so it
//! starts again at attempt 1, keeps its original exchange and routing key (the subscriber
//! restores them), and carries [`headers::REPLAYED`] counting its replays and
//! [`headers::REPLAY_ID`], the same for every copy made of one parked message in one round
//! (see [`Parking::replay_with`] for what that and the rest of the replay protect against).

mod replay;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use lapin::options::{BasicGetOptions, BasicNackOptions, QueueDeclareOptions, QueuePurgeOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel};

use crate::connection::{ConnectionConfig, Connector};
use crate::error::{Error, Result};
use crate::headers::{self, XDeath, int, string};
use crate::publisher::{Publisher, PublisherConfig};
use crate::retry;

pub use replay::{ReplayOptions, ReplayReport};

/// How long one parking operation waits for a connection.
const CONNECT_WAIT: Duration = Duration::from_secs(15);
/// Longest wait for a browse's requeued messages to be counted back (a quorum parking
/// queue applies returns through its log; a classic one at once).
const SETTLE_WAIT: Duration = Duration::from_secs(5);

/// Access to one work queue's parking queue.
#[derive(Debug)]
pub struct Parking {
    work_queue: String,
    parking_queue: String,
    connector: Connector,
    publisher: Publisher,
    trust: crate::trust::HeaderTrust,
}

/// A parked message and what its headers say about why it was parked.
#[derive(Debug, Clone)]
pub struct ParkedMessage {
    /// The body, byte for byte.
    pub body: Bytes,
    /// All properties, headers included.
    pub properties: BasicProperties,
    /// Why it was parked: rabbitkit's reason (`max-attempts`, `permanent`, `decode`, ...)
    /// or, for messages the broker dead-lettered, the `x-death` reason (`rejected`,
    /// `delivery_limit`, ...). `None` when nothing says.
    pub reason: Option<String>,
    /// The error kind recorded at the last failure.
    pub error_kind: Option<String>,
    /// The error message recorded at the last failure (cut to 1 KiB).
    pub error_message: Option<String>,
    /// The attempt number it failed at.
    pub attempts: Option<i64>,
    /// The handler that failed it.
    pub handler: Option<String>,
    /// The work queue it was parked from: rabbitkit's source-queue header, or the queue
    /// of the newest `x-death` entry for messages the broker dead-lettered.
    pub source_queue: Option<String>,
    /// The exchange it was first published to.
    pub original_exchange: Option<String>,
    /// The routing key it was first published with.
    pub original_routing_key: Option<String>,
    /// When it first failed (RFC 3339, UTC, from the millisecond header).
    pub first_failure_at: Option<String>,
    /// When it last failed (RFC 3339, UTC, from the millisecond header).
    pub last_failure_at: Option<String>,
    /// When it was parked: its last failure, or for messages the broker dead-lettered the
    /// time of the newest `x-death` entry. `None` when nothing says.
    pub parked_at: Option<SystemTime>,
    /// How many times it was replayed before.
    pub replayed: i64,
}

impl ParkedMessage {
    fn from_parts(body: Bytes, properties: BasicProperties) -> Self {
        let h = properties.headers().as_ref();
        let s = |name: &str| headers::get(h, name).and_then(string);
        let x_death = XDeath::from_headers(h);
        let reason = s(headers::PARK_REASON).or_else(|| {
            headers::get(h, "x-first-death-reason")
                .and_then(string)
                .or_else(|| x_death.entries.first().map(|e| e.reason.clone()))
        });
        let original_routing_key = s(headers::ORIGINAL_ROUTING_KEY).or_else(|| {
            // Broker dead-lettering keeps the routing keys in `x-death`.
            first_death_routing_key(h)
        });
        let original_exchange = s(headers::ORIGINAL_EXCHANGE)
            .or_else(|| headers::get(h, "x-first-death-exchange").and_then(string));
        Self {
            reason,
            error_kind: s(headers::ERROR_KIND),
            error_message: s(headers::ERROR_MESSAGE),
            attempts: headers::get(h, headers::ATTEMPT).and_then(int),
            handler: s(headers::HANDLER),
            // rabbitkit's header only on what rabbitkit parked: a message the broker
            // dead-lettered keeps its producer's headers, which may name another queue
            // (forwarded, or forged); the broker's own `x-death` says where it came from.
            source_queue: {
                let ours = s(headers::SOURCE_QUEUE);
                let broker = x_death.entries.first().map(|e| e.queue.clone());
                if s(headers::PARK_REASON).is_some() {
                    ours.or(broker)
                } else {
                    broker.or(ours)
                }
            },
            original_exchange,
            original_routing_key,
            first_failure_at: time_header(h, headers::FIRST_FAILURE_AT).map(rfc3339),
            last_failure_at: time_header(h, headers::LAST_FAILURE_AT).map(rfc3339),
            parked_at: time_header(h, headers::LAST_FAILURE_AT).or_else(|| newest_death_time(h)),
            replayed: headers::get(h, headers::REPLAYED)
                .and_then(int)
                .unwrap_or(0)
                .max(0),
            body,
            properties,
        }
    }

    /// The message id, if it has one.
    pub fn message_id(&self) -> Option<&str> {
        self.properties.message_id().as_ref().map(|id| id.as_str())
    }

    /// How long it has been parked, as of `now` (`None` when the parking time is unknown).
    pub fn age(&self, now: SystemTime) -> Option<Duration> {
        self.parked_at
            .map(|at| now.duration_since(at).unwrap_or(Duration::ZERO))
    }

    /// The replay id its next replayed copy carries in [`headers::REPLAY_ID`]: a digest of
    /// the message id and the body, then the replay round (`{digest:016x}.{round}`). Two
    /// copies made of the same parked message in the same round carry the same id.
    pub fn replay_id(&self) -> String {
        format!(
            "{:016x}.{}",
            self.content_digest(),
            self.replayed.saturating_add(1)
        )
    }

    /// FNV-1a over message id and body: stable across processes and Rust versions
    /// (unlike `DefaultHasher`), which a replay id read by other programs needs.
    fn content_digest(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let id = self.message_id().unwrap_or("");
        for b in id.bytes().chain([0xff]).chain(self.body.iter().copied()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h
    }

    /// The headers of the replayed copy: failure evidence stripped, original route kept
    /// (taken from `x-death` when only the broker recorded it), replay count raised, replay
    /// id set.
    pub fn replay_headers(&self) -> FieldTable {
        let mut map = self
            .properties
            .headers()
            .as_ref()
            .map(|t| t.inner().clone())
            .unwrap_or_default();
        // A quorum parking queue writes its own delivery counts on what it delivers (each
        // browse adds one): carried into the work queue they would count as requeues there.
        map.retain(|k, _| {
            !headers::FAILURE_HEADERS.contains(&k.as_str())
                && !headers::BROKER_COUNT_HEADERS.contains(&k.as_str())
        });
        let mut table = FieldTable::from(map);
        if let Some(rk) = &self.original_routing_key {
            table.insert(
                headers::ORIGINAL_ROUTING_KEY.into(),
                AMQPValue::LongString(LongString::from(rk.as_str())),
            );
        }
        if let Some(ex) = &self.original_exchange {
            table.insert(
                headers::ORIGINAL_EXCHANGE.into(),
                AMQPValue::LongString(LongString::from(ex.as_str())),
            );
        }
        table.insert(
            headers::REPLAYED.into(),
            AMQPValue::LongLongInt(self.replayed.saturating_add(1)),
        );
        table.insert(
            headers::REPLAY_ID.into(),
            AMQPValue::LongString(LongString::from(self.replay_id())),
        );
        table
    }
}

/// A time header as rabbitkit writes it (milliseconds since the epoch, any integer width).
fn time_header(h: Option<&FieldTable>, name: &str) -> Option<SystemTime> {
    let ms = u64::try_from(headers::get(h, name).and_then(int)?).ok()?;
    UNIX_EPOCH.checked_add(Duration::from_millis(ms))
}

/// The `time` of the newest `x-death` entry (the broker writes a timestamp in seconds).
fn newest_death_time(h: Option<&FieldTable>) -> Option<SystemTime> {
    let AMQPValue::FieldArray(arr) = headers::get(h, "x-death")? else {
        return None;
    };
    let entry = arr.as_slice().first()?.as_field_table()?.inner();
    let secs = u64::try_from(entry.get("time").and_then(int)?).ok()?;
    UNIX_EPOCH.checked_add(Duration::from_secs(secs))
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

fn first_death_routing_key(h: Option<&FieldTable>) -> Option<String> {
    let AMQPValue::FieldArray(arr) = headers::get(h, "x-death")? else {
        return None;
    };
    // The broker writes the newest entry first; the first death is the last entry.
    let entry = arr.as_slice().last()?.as_field_table()?.inner();
    match entry.get("routing-keys")? {
        AMQPValue::FieldArray(keys) => keys.as_slice().first().and_then(string),
        _ => None,
    }
}

impl Parking {
    /// Access to the parking queue of `work_queue` (`{work_queue}.parking`). Opens its own
    /// connection lazily and a confirmed publisher for replays.
    ///
    /// Replayed copies keep the original route in rabbitkit's headers, which workers
    /// believe only when signed: the copies are signed with the keys in
    /// `RABBITKIT_HEADER_KEY` (and `RABBITKIT_HEADER_KEY_PREVIOUS`), the workers' own, or
    /// those given to [`Parking::header_trust`]. Fails when a key there is too short.
    pub fn new(connection: ConnectionConfig, work_queue: impl Into<String>) -> Result<Self> {
        let work_queue = work_queue.into();
        let parking_queue = retry::parking_queue(&work_queue);
        crate::names::check("work queue", &work_queue)?;
        crate::names::check("parking queue", &parking_queue)?;
        let trust =
            crate::trust::HeaderTrust::from_env().map_err(|e| Error::Config(e.to_string()))?;
        Ok(Self {
            trust,
            connector: Connector::new(
                connection.clone(),
                format!("rabbitkit-parking {work_queue}"),
            )?,
            publisher: Publisher::new(connection, PublisherConfig::default())?,
            work_queue,
            parking_queue,
        })
    }

    /// Signs replayed copies' route headers with these keys (instead of the environment's).
    #[must_use]
    pub fn header_trust(mut self, trust: crate::trust::HeaderTrust) -> Self {
        self.trust = trust;
        self
    }

    /// The parking queue's name.
    pub fn queue(&self) -> &str {
        &self.parking_queue
    }

    /// The work queue whose parking queue this is (where a replay sends copies).
    pub fn work_queue(&self) -> &str {
        &self.work_queue
    }

    pub(super) async fn channel(&self) -> Result<Channel> {
        let conn = self.connector.get(CONNECT_WAIT).await?;
        conn.conn.create_channel().await.map_err(Error::amqp)
    }

    /// How many messages are parked (ready, not counting ones other clients hold). A
    /// browse of this client ([`Parking::peek`], a replay's passed-over messages) is
    /// counted back before it returns, on a quorum parking queue too.
    /// Fails with [`Error::Topology`] when the parking queue does not exist.
    pub async fn count(&self) -> Result<u32> {
        let ch = self.channel().await?;
        let count = self.passive_count(&ch).await;
        let _ = ch.close(200, "rabbitkit parking count".into()).await;
        count
    }

    pub(super) async fn passive_count(&self, ch: &Channel) -> Result<u32> {
        let opts = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        match ch
            .queue_declare(
                ShortString::from(self.parking_queue.as_str()),
                opts,
                FieldTable::default(),
            )
            .await
        {
            Ok(q) => Ok(q.message_count()),
            Err(e) => Err(Error::Topology(format!(
                "parking queue {} is not there: {e}",
                self.parking_queue
            ))),
        }
    }

    /// Gets one parked message (unacked) with its delivery tag.
    pub(super) async fn get_one(&self, ch: &Channel) -> Result<Option<(u64, ParkedMessage)>> {
        let got = ch
            .basic_get(
                ShortString::from(self.parking_queue.as_str()),
                BasicGetOptions { no_ack: false },
            )
            .await
            .map_err(Error::amqp)?;
        Ok(got.map(|m| {
            let tag = m.delivery.delivery_tag;
            let parked =
                ParkedMessage::from_parts(Bytes::from(m.delivery.data), m.delivery.properties);
            (tag, parked)
        }))
    }

    /// Waits until the parking queue counts at least `at_least` ready messages again, at
    /// most [`SETTLE_WAIT`]: messages this client held and requeued (a `basic.nack`, a
    /// channel closed) are back in a classic queue's count at once, but a quorum queue
    /// applies the return through its log, after the channel is closed. Without this
    /// wait, a count taken right after a browse (the next `parking list`, a replay's
    /// `remaining`) reads them as gone. A concurrent replay or purge may keep the count
    /// below: then it returns after the wait with what it counts.
    pub(super) async fn settled_count(&self, at_least: u32) -> Result<u32> {
        let start = tokio::time::Instant::now();
        loop {
            let n = self.count().await?;
            if n >= at_least || start.elapsed() >= SETTLE_WAIT {
                return Ok(n);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Reads up to `limit` parked messages, oldest first, without removing any: they are
    /// requeued before this returns (the channel closing would requeue them too), and
    /// counted back in the queue (see [`Parking::count`]).
    pub async fn peek(&self, limit: usize) -> Result<Vec<ParkedMessage>> {
        let ch = self.channel().await?;
        let parked_at_start = self.passive_count(&ch).await?;
        let mut out = Vec::new();
        let mut last_tag = None;
        while out.len() < limit {
            let Some((tag, parked)) = self.get_one(&ch).await? else {
                break;
            };
            last_tag = Some(tag);
            out.push(parked);
        }
        if let Some(tag) = last_tag {
            ch.basic_nack(
                tag,
                BasicNackOptions {
                    multiple: true,
                    requeue: true,
                },
            )
            .await
            .map_err(Error::amqp)?;
        }
        let _ = ch.close(200, "rabbitkit parking peek".into()).await;
        if !out.is_empty() {
            self.settled_count(parked_at_start).await?;
        }
        Ok(out)
    }

    /// Deletes every parked message; returns how many there were. Irreversible.
    pub async fn purge(&self) -> Result<u32> {
        let ch = self.channel().await?;
        self.passive_count(&ch).await?;
        let n = ch
            .queue_purge(
                ShortString::from(self.parking_queue.as_str()),
                QueuePurgeOptions::default(),
            )
            .await
            .map_err(Error::amqp)?;
        let _ = ch.close(200, "rabbitkit parking purge".into()).await;
        Ok(n)
    }

    /// Closes the connection and the publisher.
    pub async fn close(&self) {
        self.publisher.close(Duration::from_secs(5)).await;
        self.connector.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::FieldArray;

    fn props(entries: &[(&str, AMQPValue)]) -> BasicProperties {
        let mut t = FieldTable::default();
        for (k, v) in entries {
            t.insert((*k).into(), v.clone());
        }
        BasicProperties::default().with_headers(t)
    }

    fn assert_replay_route(h: &FieldTable, routing_key: &str, replayed: i64) {
        assert_eq!(
            h.inner().get(headers::ORIGINAL_ROUTING_KEY),
            Some(&ls(routing_key))
        );
        assert_eq!(
            h.inner().get(headers::REPLAYED),
            Some(&AMQPValue::LongLongInt(replayed))
        );
    }

    fn ls(s: &str) -> AMQPValue {
        AMQPValue::LongString(LongString::from(s))
    }

    #[test]
    fn rabbitkit_evidence_is_read_and_stripped_for_replay() {
        let p = props(&[
            (headers::PARK_REASON, ls("max-attempts")),
            (headers::ERROR_KIND, ls("error")),
            (headers::ERROR_MESSAGE, ls("db down")),
            (headers::ATTEMPT, AMQPValue::LongLongInt(5)),
            (headers::ORIGINAL_ROUTING_KEY, ls("order.created")),
            (headers::ORIGINAL_EXCHANGE, ls("shop")),
            ("tenant", ls("acme")),
        ]);
        let m = ParkedMessage::from_parts(Bytes::from_static(b"{}"), p);
        assert_eq!(m.reason.as_deref(), Some("max-attempts"));
        assert_eq!(m.error_message.as_deref(), Some("db down"));
        assert_eq!(m.attempts, Some(5));
        assert_eq!(m.replayed, 0);
        let h = m.replay_headers();
        assert!(h.inner().get(headers::ATTEMPT).is_none());
        assert!(h.inner().get(headers::PARK_REASON).is_none());
        assert!(h.inner().get(headers::ERROR_MESSAGE).is_none());
        assert_eq!(h.inner().get("tenant"), Some(&ls("acme")));
        assert_replay_route(&h, "order.created", 1);
    }

    #[test]
    fn a_quorum_parking_queues_delivery_counts_are_not_replayed() {
        let p = props(&[
            (headers::DELIVERY_COUNT, AMQPValue::LongLongInt(30)),
            (headers::ACQUIRED_COUNT, AMQPValue::LongLongInt(31)),
            ("tenant", ls("acme")),
        ]);
        let h = ParkedMessage::from_parts(Bytes::from_static(b"{}"), p).replay_headers();
        assert!(!h.inner().contains_key(headers::DELIVERY_COUNT));
        assert!(!h.inner().contains_key(headers::ACQUIRED_COUNT));
        assert_eq!(h.inner().get("tenant"), Some(&ls("acme")));
    }

    #[test]
    fn broker_dead_lettered_message_keeps_its_route_from_x_death() {
        let mut entry = FieldTable::default();
        entry.insert("queue".into(), ls("orders"));
        entry.insert("reason".into(), ls("rejected"));
        entry.insert("count".into(), AMQPValue::LongLongInt(1));
        entry.insert("exchange".into(), ls("shop"));
        entry.insert(
            "routing-keys".into(),
            AMQPValue::FieldArray(FieldArray::from(vec![ls("order.paid")])),
        );
        let p = props(&[
            (
                "x-death",
                AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::FieldTable(entry)])),
            ),
            ("x-first-death-reason", ls("rejected")),
            ("x-first-death-exchange", ls("shop")),
            (headers::REPLAYED, AMQPValue::LongLongInt(2)),
            // A producer's (forwarded or forged) header: not rabbitkit's, since rabbitkit
            // did not park it (no park reason). The broker's x-death names the queue.
            (headers::SOURCE_QUEUE, ls("billing")),
        ]);
        let m = ParkedMessage::from_parts(Bytes::new(), p);
        assert_eq!(m.reason.as_deref(), Some("rejected"));
        assert_eq!(m.source_queue.as_deref(), Some("orders"));
        assert_eq!(m.original_routing_key.as_deref(), Some("order.paid"));
        assert_eq!(m.original_exchange.as_deref(), Some("shop"));
        let h = m.replay_headers();
        assert!(h.inner().get("x-death").is_none());
        assert_replay_route(&h, "order.paid", 3);
    }

    #[test]
    fn parking_time_and_replay_id_come_from_the_headers() {
        let p = props(&[
            (headers::FIRST_FAILURE_AT, AMQPValue::LongLongInt(1_000)),
            (headers::LAST_FAILURE_AT, AMQPValue::LongLongInt(61_000)),
            (headers::REPLAYED, AMQPValue::LongLongInt(1)),
        ])
        .with_message_id("m-1".into());
        let m = ParkedMessage::from_parts(Bytes::from_static(b"body"), p);
        assert_eq!(
            m.first_failure_at.as_deref(),
            Some("1970-01-01T00:00:01.000Z")
        );
        let now = UNIX_EPOCH + Duration::from_secs(121);
        assert_eq!(m.age(now), Some(Duration::from_secs(60)));
        assert!(m.replay_id().ends_with(".2"), "{}", m.replay_id());
        // Same id and body, other evidence: same replay id. Other body: another one.
        let twin = ParkedMessage::from_parts(Bytes::from_static(b"body"), m.properties.clone());
        assert_eq!(twin.replay_id(), m.replay_id());
        let other = ParkedMessage::from_parts(Bytes::from_static(b"bodY"), m.properties.clone());
        assert_ne!(other.replay_id(), m.replay_id());
        let h = m.replay_headers();
        assert_eq!(h.inner().get(headers::REPLAY_ID), Some(&ls(&m.replay_id())));
    }

    #[test]
    fn broker_dead_lettered_message_is_aged_from_x_death_time() {
        let mut entry = FieldTable::default();
        entry.insert("time".into(), AMQPValue::Timestamp(100));
        let p = props(&[(
            "x-death",
            AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::FieldTable(entry)])),
        )]);
        let m = ParkedMessage::from_parts(Bytes::new(), p);
        assert_eq!(m.parked_at, Some(UNIX_EPOCH + Duration::from_secs(100)));
        assert!(m.age(UNIX_EPOCH).is_some_and(|a| a.is_zero()));
    }

    #[test]
    fn forged_replay_count_does_not_go_negative() {
        let p = props(&[(headers::REPLAYED, AMQPValue::LongLongInt(-9))]);
        let m = ParkedMessage::from_parts(Bytes::new(), p);
        assert_eq!(m.replayed, 0);
        assert!(m.reason.is_none());
    }
}
