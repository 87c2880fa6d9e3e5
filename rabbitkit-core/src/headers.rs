//! Header names rabbitkit writes, and typed readers for the headers it reads.
//!
//! rabbitkit's own headers are the authority for attempt counting: RabbitMQ 4.x ignores
//! client-set `x-death`, so republished retries restart its `count` at 1 (3.10–3.12 keep
//! counting). `x-death` is parsed into [`XDeath`] and used as evidence only.

use lapin::types::{AMQPValue, FieldTable};

/// Attempt number of this delivery (1 = first delivery). Integer.
pub const ATTEMPT: &str = "x-rabbitkit-attempt";
/// Exchange the message was first published to.
pub const ORIGINAL_EXCHANGE: &str = "x-rabbitkit-original-exchange";
/// Routing key the message was first published with; restored for the handler on retries.
pub const ORIGINAL_ROUTING_KEY: &str = "x-rabbitkit-original-routing-key";
/// Work queue the failing delivery was consumed from.
pub const SOURCE_QUEUE: &str = "x-rabbitkit-source-queue";
/// Kind of the last failure (`error`, `timeout`, `panic`, `decode`, `rejected`, ...).
pub const ERROR_KIND: &str = "x-rabbitkit-error-kind";
/// Message of the last failure, truncated to [`MAX_ERROR_MESSAGE`] bytes.
pub const ERROR_MESSAGE: &str = "x-rabbitkit-error-message";
/// Time of the first failure, milliseconds since the Unix epoch.
pub const FIRST_FAILURE_AT: &str = "x-rabbitkit-first-failure-at";
/// Time of the last failure, milliseconds since the Unix epoch.
pub const LAST_FAILURE_AT: &str = "x-rabbitkit-last-failure-at";
/// Name of the handler that failed.
pub const HANDLER: &str = "x-rabbitkit-handler";
/// Why the copy was parked (`max-attempts`, `permanent`, `decode`, `handler`).
pub const PARK_REASON: &str = "x-rabbitkit-park-reason";
/// Delay tier (for example `30s`) a retry copy went through.
pub const RETRY_TIER: &str = "x-rabbitkit-retry-tier";
/// Set on a message replayed from a parking queue: how many times it was replayed.
pub const REPLAYED: &str = "x-rabbitkit-replayed";
/// Set on a message replayed from a parking queue: the same for every copy made of one
/// parked message in one replay round (digest of message id and body, then the round), so
/// a consumer can recognise a second copy. Kept when the copy is parked again.
pub const REPLAY_ID: &str = "x-rabbitkit-replay-id";

/// Requeues the message went through before it was parked with reason `requeue-limit`.
pub const REQUEUES: &str = "x-rabbitkit-requeues";

/// Why the copy could not be published as it was (parked with reason `unpublishable`).
pub const UNPUBLISHABLE: &str = "x-rabbitkit-unpublishable";

/// Size in bytes of the body dropped from an `unpublishable` parking copy.
pub const BODY_DROPPED_SIZE: &str = "x-rabbitkit-body-dropped-size";

/// Digest of the body dropped from an `unpublishable` parking copy (`fnv1a64:<hex>`).
pub const BODY_DIGEST: &str = "x-rabbitkit-body-digest";

/// How many original headers were dropped from an `unpublishable` parking copy.
pub const HEADERS_DROPPED: &str = "x-rabbitkit-headers-dropped";

/// Set by the publisher only on a mandatory publish whose message id is already awaiting
/// its confirm on the same channel: a `basic.return` names the message by its properties,
/// and this token tells two publishes with one id apart. Stripped from every other publish
/// (a copy of a message that carried one does not inherit it).
pub const PUBLISH_TOKEN: &str = "x-rabbitkit-publish-token";

/// Quorum queues' count of failed deliveries of this message (reject, lost channel; on
/// RabbitMQ before 4.3 also `basic.nack` with requeue). Set by the broker on delivery.
pub const DELIVERY_COUNT: &str = "x-delivery-count";
/// Quorum queues' count of every hand-out of this message to a consumer (RabbitMQ 4.3+).
/// Set by the broker on delivery.
pub const ACQUIRED_COUNT: &str = "x-acquired-count";
/// Counters a quorum queue writes on delivery. Retry and parking copies drop them: they
/// describe the original's life in its queue, and a copy that carried them into a queue
/// that does not overwrite them (a classic one, or a 4.3 quorum queue before any failure)
/// would show stale counts.
pub const BROKER_COUNT_HEADERS: &[&str] = &[DELIVERY_COUNT, ACQUIRED_COUNT];

/// The signature of rabbitkit's own routing and attempt headers (`v1:` and an
/// HMAC-SHA256 in hex; see [`HeaderTrust`](crate::trust::HeaderTrust)). A replay strips it
/// and signs its copy anew.
pub const SIGNATURE: &str = "x-rabbitkit-signature";

/// Headers that describe a failure; a replay strips them.
pub const FAILURE_HEADERS: &[&str] = &[
    ERROR_KIND,
    ERROR_MESSAGE,
    FIRST_FAILURE_AT,
    LAST_FAILURE_AT,
    HANDLER,
    PARK_REASON,
    RETRY_TIER,
    ATTEMPT,
    REQUEUES,
    UNPUBLISHABLE,
    SIGNATURE,
    HEADERS_DROPPED,
    "x-death",
    "x-first-death-exchange",
    "x-first-death-queue",
    "x-first-death-reason",
    "x-last-death-exchange",
    "x-last-death-queue",
    "x-last-death-reason",
];

/// Error messages are cut to this many bytes so the copy always fits a frame.
pub const MAX_ERROR_MESSAGE: usize = 1024;

/// Highest attempt number accepted from a header; anything above is treated as forged.
pub const MAX_ATTEMPT: u32 = 1_000_000;

/// Reads an integer header leniently (other clients encode integers in several widths).
pub fn int(value: &AMQPValue) -> Option<i64> {
    match value {
        AMQPValue::ShortShortInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortShortUInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortUInt(n) => Some(i64::from(*n)),
        AMQPValue::LongInt(n) => Some(i64::from(*n)),
        AMQPValue::LongUInt(n) => Some(i64::from(*n)),
        AMQPValue::LongLongInt(n) => Some(*n),
        AMQPValue::Timestamp(n) => i64::try_from(*n).ok(),
        _ => None,
    }
}

/// Reads a string header (long or short string, lossy UTF-8).
pub fn string(value: &AMQPValue) -> Option<String> {
    match value {
        AMQPValue::LongString(s) => Some(s.to_string()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}

/// Looks a header up in an optional table.
pub(crate) fn get<'a>(headers: Option<&'a FieldTable>, name: &str) -> Option<&'a AMQPValue> {
    headers?.inner().get(name)
}

/// One entry of the broker's `x-death` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XDeathEntry {
    /// Queue the message was dead-lettered from.
    pub queue: String,
    /// `rejected`, `expired`, `maxlen` or `delivery_limit`.
    pub reason: String,
    /// How many times the broker counted this (queue, reason) pair.
    pub count: i64,
    /// Exchange the message had been published to.
    pub exchange: Option<String>,
}

/// Typed summary of the `x-death` header (newest entry first, as the broker writes it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct XDeath {
    /// The parsed entries; malformed entries are skipped.
    pub entries: Vec<XDeathEntry>,
}

impl XDeath {
    /// Parses `x-death` from a header table; absent or malformed gives an empty summary.
    pub fn from_headers(headers: Option<&FieldTable>) -> Self {
        let Some(AMQPValue::FieldArray(arr)) = get(headers, "x-death") else {
            return Self::default();
        };
        let entries = arr
            .as_slice()
            .iter()
            .filter_map(|v| {
                let t = v.as_field_table()?.inner();
                Some(XDeathEntry {
                    queue: t.get("queue").and_then(string)?,
                    reason: t.get("reason").and_then(string)?,
                    count: t.get("count").and_then(int).unwrap_or(1).max(0),
                    exchange: t.get("exchange").and_then(string),
                })
            })
            .collect();
        Self { entries }
    }

    /// The count the broker recorded for `(queue, reason)`, if any.
    pub fn count(&self, queue: &str, reason: &str) -> Option<i64> {
        self.entries
            .iter()
            .find(|e| e.queue == queue && e.reason == reason)
            .map(|e| e.count)
    }

    /// Sum of the counts of entries whose queue satisfies `pred` and whose reason is `reason`.
    pub fn total(&self, reason: &str, pred: impl Fn(&str) -> bool) -> i64 {
        self.entries
            .iter()
            .filter(|e| e.reason == reason && pred(&e.queue))
            .map(|e| e.count)
            // Forged entries can hold any i64: a plain sum would overflow (a panic in debug
            // builds, a wrapped negative count in release).
            .fold(0i64, i64::saturating_add)
    }

    /// True when the broker recorded nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// What rabbitkit knows about how often this message was attempted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// The attempt number of this delivery, starting at 1.
    pub number: u32,
    /// The own attempt header was present and valid.
    pub from_header: bool,
    /// The own header was present but unusable (wrong type, out of range): it was ignored.
    pub forged_header: Option<String>,
    /// The broker's `x-death` summary (evidence).
    pub x_death: XDeath,
    /// Quorum queues' `x-delivery-count`, if present, whatever its integer type. Up to
    /// RabbitMQ 4.2 every requeue counts; from 4.3 only failed deliveries (reject, lost
    /// channel) do, not `basic.nack` with requeue. Evidence only: rabbitkit's own attempt
    /// header is the authority.
    pub delivery_count: Option<i64>,
    /// Quorum queues' `x-acquired-count` (RabbitMQ 4.3+): every hand-out to a consumer,
    /// requeues by `basic.nack` included. `None` before 4.3 and on classic queues.
    pub acquired_count: Option<i64>,
}

impl Attempt {
    /// Derives the attempt number from the headers of a delivery from `work_queue`.
    ///
    /// The own header wins; `x-death` expiries out of this queue's retry tiers are a floor
    /// (they keep counting on 3.10–3.12 and restart at 1 on 4.x), so a header lowered by
    /// hand cannot make a message retry forever on brokers that count.
    pub fn from_headers(headers: Option<&FieldTable>, work_queue: &str) -> Self {
        let x_death = XDeath::from_headers(headers);
        let evidence = x_death.total("expired", |q| crate::retry::is_tier_of(q, work_queue));
        let evidence = u32::try_from(evidence.saturating_add(1))
            .unwrap_or(MAX_ATTEMPT)
            .min(MAX_ATTEMPT);
        let (own, forged) = match get(headers, ATTEMPT) {
            None => (None, None),
            Some(v) => match int(v) {
                Some(n) if (1..=i64::from(MAX_ATTEMPT)).contains(&n) => {
                    (u32::try_from(n).ok(), None)
                }
                Some(n) => (None, Some(format!("out of range: {n}"))),
                None => (None, Some(format!("not an integer: {v:?}"))),
            },
        };
        Self {
            number: own.unwrap_or(1).max(evidence),
            from_header: own.is_some(),
            forged_header: forged,
            x_death,
            delivery_count: get(headers, DELIVERY_COUNT).and_then(int),
            acquired_count: get(headers, ACQUIRED_COUNT).and_then(int),
        }
    }

    /// An attempt built directly (for tests).
    pub fn new(number: u32) -> Self {
        Self {
            number: number.max(1),
            from_header: number > 1,
            forged_header: None,
            x_death: XDeath::default(),
            delivery_count: None,
            acquired_count: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::{FieldArray, LongString};

    fn xdeath(entries: &[(&str, &str, i64)]) -> AMQPValue {
        let arr: Vec<AMQPValue> = entries
            .iter()
            .map(|(q, r, c)| {
                let mut t = FieldTable::default();
                t.insert("queue".into(), AMQPValue::LongString(LongString::from(*q)));
                t.insert("reason".into(), AMQPValue::LongString(LongString::from(*r)));
                t.insert("count".into(), AMQPValue::LongLongInt(*c));
                AMQPValue::FieldTable(t)
            })
            .collect();
        AMQPValue::FieldArray(FieldArray::from(arr))
    }

    #[test]
    fn first_delivery_is_attempt_one() {
        let a = Attempt::from_headers(None, "orders");
        assert_eq!(a.number, 1);
        assert!(!a.from_header);
    }

    #[test]
    fn own_header_is_the_authority() {
        let mut h = FieldTable::default();
        h.insert(ATTEMPT.into(), AMQPValue::LongLongInt(3));
        // 4.x restarts x-death at 1: the own header still says 3.
        h.insert(
            "x-death".into(),
            xdeath(&[("orders.delay.5s", "expired", 1)]),
        );
        let a = Attempt::from_headers(Some(&h), "orders");
        assert_eq!(a.number, 3);
        assert!(a.from_header);
    }

    #[test]
    fn x_death_is_a_floor_against_lowered_headers() {
        let mut h = FieldTable::default();
        h.insert(ATTEMPT.into(), AMQPValue::LongInt(1));
        h.insert(
            "x-death".into(),
            xdeath(&[
                // Quorum and classic (earlier releases) tiers both count.
                ("orders.delay.5s", "expired", 3),
                ("orders.retry.30s", "expired", 1),
                ("other.delay.5s", "expired", 9),
            ]),
        );
        assert_eq!(Attempt::from_headers(Some(&h), "orders").number, 5);
    }

    #[test]
    fn forged_headers_are_ignored_with_a_note() {
        for v in [
            AMQPValue::LongLongInt(-4),
            AMQPValue::LongLongInt(i64::MAX),
            AMQPValue::LongString("7".into()),
            AMQPValue::Boolean(true),
        ] {
            let mut h = FieldTable::default();
            h.insert(ATTEMPT.into(), v);
            let a = Attempt::from_headers(Some(&h), "orders");
            assert_eq!(a.number, 1);
            assert!(a.forged_header.is_some());
        }
    }

    #[test]
    fn x_death_counts_past_i64_saturate() {
        let entry = || {
            let mut t = FieldTable::default();
            t.insert(
                "queue".into(),
                AMQPValue::LongString("orders.retry.5s".into()),
            );
            t.insert("reason".into(), AMQPValue::LongString("expired".into()));
            t.insert("count".into(), AMQPValue::LongLongInt(i64::MAX));
            AMQPValue::FieldTable(t)
        };
        let mut h = FieldTable::default();
        h.insert(
            "x-death".into(),
            AMQPValue::FieldArray(FieldArray::from(vec![entry(), entry()])),
        );
        let x = XDeath::from_headers(Some(&h));
        assert_eq!(x.total("expired", |_| true), i64::MAX);
        assert_eq!(
            Attempt::from_headers(Some(&h), "orders").number,
            MAX_ATTEMPT
        );
    }

    #[test]
    fn malformed_x_death_entries_are_skipped() {
        let mut h = FieldTable::default();
        let mut bad = FieldTable::default();
        bad.insert("count".into(), AMQPValue::LongLongInt(2));
        h.insert(
            "x-death".into(),
            AMQPValue::FieldArray(FieldArray::from(vec![
                AMQPValue::FieldTable(bad),
                AMQPValue::Boolean(false),
            ])),
        );
        assert!(XDeath::from_headers(Some(&h)).is_empty());
        h.insert("x-death".into(), AMQPValue::LongString("nope".into()));
        assert!(XDeath::from_headers(Some(&h)).is_empty());
    }

    #[test]
    fn broker_counts_are_read_whatever_their_integer_type() {
        let cases = [
            (AMQPValue::ShortShortInt(3), 3),
            (AMQPValue::ShortShortUInt(200), 200),
            (AMQPValue::ShortInt(-2), -2),
            (AMQPValue::ShortUInt(60_000), 60_000),
            (AMQPValue::LongInt(70_000), 70_000),
            (AMQPValue::LongUInt(4_000_000_000), 4_000_000_000),
            (AMQPValue::LongLongInt(1 << 40), 1 << 40),
            (AMQPValue::Timestamp(9), 9),
        ];
        for (v, want) in cases {
            let mut h = FieldTable::default();
            h.insert(DELIVERY_COUNT.into(), v.clone());
            h.insert(ACQUIRED_COUNT.into(), v.clone());
            let a = Attempt::from_headers(Some(&h), "orders");
            assert_eq!(a.delivery_count, Some(want), "{v:?}");
            assert_eq!(a.acquired_count, Some(want), "{v:?}");
            // Evidence only: the attempt number does not follow the broker's counts.
            assert_eq!(a.number, 1, "{v:?}");
        }
        let mut h = FieldTable::default();
        h.insert(DELIVERY_COUNT.into(), AMQPValue::LongString("2".into()));
        let a = Attempt::from_headers(Some(&h), "orders");
        assert_eq!((a.delivery_count, a.acquired_count), (None, None));
        let a = Attempt::from_headers(None, "orders");
        assert_eq!((a.delivery_count, a.acquired_count), (None, None));
    }

    #[test]
    fn x_death_count_lookup() {
        let mut h = FieldTable::default();
        h.insert("x-death".into(), xdeath(&[("orders", "rejected", 2)]));
        let x = XDeath::from_headers(Some(&h));
        assert_eq!(x.count("orders", "rejected"), Some(2));
        assert_eq!(x.count("orders", "expired"), None);
    }
}
