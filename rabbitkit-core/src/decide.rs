//! The settlement decision: outcome + delivery + policy → what to do with the original.
//!
//! Pure code, shared by the runtime and the broker-free test kit (`testing`), so a handler
//! test that passes means production settles the same way.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

use crate::delivery::Delivery;
use crate::envelope::Envelope;
use crate::headers;
use crate::kind::Classify;
use crate::names;
use crate::outcome::{ErrorClass, Failure, Outcome};
use crate::policy::{AckPolicy, ManualFallback};
use crate::retry::{self, RetryPolicy, RetryStep};
use crate::topology::QueueType;
use crate::trust::HeaderTrust;

/// What a subscriber's settlement depends on.
#[derive(Clone)]
pub struct SettleSpec {
    /// The work queue.
    pub queue: Arc<str>,
    /// The handler name (written to evidence headers).
    pub handler: Arc<str>,
    /// The retry schedule.
    pub retry: RetryPolicy,
    /// The type of the delay tiers, which names them (`{q}.delay.5s` quorum,
    /// `{q}.retry.5s` classic).
    pub tier_queue_type: QueueType,
    /// The error classifier.
    pub classifier: Arc<dyn Classify>,
    /// The ack policy.
    pub policy: AckPolicy,
    /// The manual-mode fallback.
    pub fallback: ManualFallback,
    /// Requeues allowed per message; the next requeue parks it (`requeue-limit`).
    pub requeue_limit: u32,
    /// Signs the copies' own headers, and judges those of deliveries.
    pub trust: HeaderTrust,
}

impl std::fmt::Debug for SettleSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SettleSpec")
            .field("queue", &self.queue)
            .field("handler", &self.handler)
            .field("retry", &self.retry)
            .field("tier_queue_type", &self.tier_queue_type)
            .field("policy", &self.policy)
            .field("fallback", &self.fallback)
            .field("requeue_limit", &self.requeue_limit)
            .field("trust", &self.trust)
            .finish()
    }
}

/// Why a copy was parked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParkReason {
    /// The attempt limit was reached.
    MaxAttempts,
    /// The error was classified permanent.
    Permanent,
    /// The payload did not decode.
    Decode,
    /// The handler asked to park.
    Handler,
    /// The message was requeued more times than the requeue limit allows.
    RequeueLimit,
    /// Its retry or parking copy can never be published as it is (body or headers too
    /// large): a trimmed copy was parked.
    Unpublishable,
    /// rabbitkit's own headers carried a signature that does not verify (a forgery, or
    /// workers that do not share a key): parked without running the handler.
    BadSignature,
}

impl ParkReason {
    /// Every reason (the bounded set of the `reason` metric label).
    pub const ALL: [ParkReason; 7] = [
        ParkReason::MaxAttempts,
        ParkReason::Permanent,
        ParkReason::Decode,
        ParkReason::Handler,
        ParkReason::RequeueLimit,
        ParkReason::Unpublishable,
        ParkReason::BadSignature,
    ];

    /// The header value: `max-attempts`, `permanent`, `decode`, `handler`,
    /// `requeue-limit`, `unpublishable`, `bad-signature`.
    pub fn as_str(self) -> &'static str {
        match self {
            ParkReason::MaxAttempts => "max-attempts",
            ParkReason::Permanent => "permanent",
            ParkReason::Decode => "decode",
            ParkReason::Handler => "handler",
            ParkReason::RequeueLimit => "requeue-limit",
            ParkReason::Unpublishable => "unpublishable",
            ParkReason::BadSignature => "bad-signature",
        }
    }
}

/// What kind of copy is published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyKind {
    /// A retry copy into a delay tier.
    Retry {
        /// The tier's delay.
        tier: Duration,
        /// The attempt number the copy carries.
        next_attempt: u32,
    },
    /// A parking copy.
    Park {
        /// Why.
        reason: ParkReason,
    },
}

/// What to do with the original delivery.
#[derive(Debug, Clone)]
#[non_exhaustive]
// One Decision per delivery, moved once into the settler: boxing would add an allocation
// on the hot path for nothing.
#[allow(clippy::large_enum_variant)]
pub enum Decision {
    /// Ack it.
    Ack,
    /// Publish `copy` (confirmed, mandatory); ack the original only when it is confirmed.
    Republish {
        /// The copy.
        copy: Envelope,
        /// Retry or park, with details.
        kind: CopyKind,
        /// The failure the copy records.
        failure: Failure,
    },
    /// Nack with requeue.
    Requeue,
    /// Nack without requeue (broker dead-letters to parking).
    Reject,
    /// Nothing: already settled (manual mode, or acked first).
    Nothing,
}

impl Decision {
    /// `ack`, `retry`, `park`, `requeue`, `reject`, `none`.
    pub fn label(&self) -> &'static str {
        match self {
            Decision::Ack => "ack",
            Decision::Republish {
                kind: CopyKind::Retry { .. },
                ..
            } => "retry",
            Decision::Republish { .. } => "park",
            Decision::Requeue => "requeue",
            Decision::Reject => "reject",
            Decision::Nothing => "none",
        }
    }
}

/// Decides what to do with `delivery` after `outcome`, under `spec`'s policy.
pub fn decide(spec: &SettleSpec, delivery: &Delivery, outcome: Outcome) -> Decision {
    match spec.policy {
        AckPolicy::Auto => auto(spec, delivery, outcome),
        // The transaction (crate::inbox) commits before an `Ack` and rolls back otherwise;
        // the decision itself is auto's.
        AckPolicy::Transactional => auto(spec, delivery, outcome),
        AckPolicy::NackOnError => match outcome {
            Outcome::Error(_) => Decision::Reject,
            other => auto(spec, delivery, other),
        },
        AckPolicy::AckFirst => Decision::Nothing,
        AckPolicy::Manual => match outcome {
            Outcome::Settled => Decision::Nothing,
            // A clean return without a settlement: the handler ran to its end and chose
            // nothing, so the configured fallback applies.
            Outcome::Ack => {
                tracing::warn!(
                    handler = %spec.handler,
                    queue = %spec.queue,
                    message_id = delivery.message_id().unwrap_or(""),
                    routing_key = %delivery.routing_key(),
                    fallback = ?spec.fallback,
                    "manual handler returned without settling; applying the fallback"
                );
                match spec.fallback {
                    ManualFallback::NackRequeue => requeue(spec, delivery),
                    ManualFallback::Ack | ManualFallback::Auto => Decision::Ack,
                    ManualFallback::Reject => Decision::Reject,
                }
            }
            // Everything else is a failure (a decode rejection, a panic, a deadline overrun,
            // an error) or an explicit request: decided exactly as in auto mode, so poison
            // parks at once with its reason, a panic is retried then parked, and no fallback
            // can ack a message the handler did not process.
            other => auto(spec, delivery, other),
        },
    }
}

/// The `Auto` mapping; also what manual `Settle` actions use.
pub(crate) fn auto(spec: &SettleSpec, delivery: &Delivery, outcome: Outcome) -> Decision {
    match outcome {
        Outcome::Ack => Decision::Ack,
        Outcome::Requeue => requeue(spec, delivery),
        Outcome::Reject => Decision::Reject,
        // Only a manual handler can have settled; anywhere else the delivery would be left
        // unacked until the channel closes: requeue it, loudly.
        Outcome::Settled => {
            tracing::warn!(
                handler = %spec.handler,
                queue = %spec.queue,
                "handler returned Outcome::Settled but is not in manual ack mode; requeueing"
            );
            requeue(spec, delivery)
        }
        Outcome::Retry { after, failure } => retry_or_park(spec, delivery, after, failure),
        Outcome::Park(failure) => {
            let reason = match failure.kind.as_ref() {
                "decode" => ParkReason::Decode,
                "bad-signature" => ParkReason::BadSignature,
                _ => ParkReason::Handler,
            };
            park(spec, delivery, reason, failure)
        }
        Outcome::Error(e) => {
            // tower's load shedding: the handler never ran, no attempt is spent; the
            // settler paces repeated requeues.
            if crate::kind::is_overloaded(&e) {
                return Decision::Requeue;
            }
            let failure = Failure::from_error(spec.classifier.kind(&e), e.as_ref());
            match spec.classifier.classify(&e) {
                ErrorClass::Retryable => retry_or_park(spec, delivery, None, failure),
                ErrorClass::Permanent => park(spec, delivery, ParkReason::Permanent, failure),
            }
        }
    }
}

/// A requeue, unless the message has been requeued `requeue_limit` times already: then it
/// is parked, so that nothing loops for ever.
fn requeue(spec: &SettleSpec, d: &Delivery) -> Decision {
    let n = d.requeues();
    if n < spec.requeue_limit {
        return Decision::Requeue;
    }
    let failure = Failure::new(
        "requeue-limit",
        format!(
            "requeued {n} times (limit {}); parked instead of requeued again",
            spec.requeue_limit
        ),
    );
    match park(spec, d, ParkReason::RequeueLimit, failure) {
        Decision::Republish {
            mut copy,
            kind,
            failure,
        } => {
            copy = copy.header(headers::REQUEUES, AMQPValue::LongLongInt(i64::from(n)));
            Decision::Republish {
                copy,
                kind,
                failure,
            }
        }
        other => other,
    }
}

fn retry_or_park(
    spec: &SettleSpec,
    d: &Delivery,
    after: Option<Duration>,
    failure: Failure,
) -> Decision {
    let attempt = d.attempt().number;
    match spec.retry.next_for(&failure.kind, attempt, after) {
        RetryStep::Tier(tier) => {
            let next_attempt = attempt.saturating_add(1);
            let tier_queue = retry::tier_queue_of(&spec.queue, tier, spec.tier_queue_type);
            let mut h = evidence(spec, d, &failure);
            h.insert(
                headers::ATTEMPT.into(),
                AMQPValue::LongLongInt(i64::from(next_attempt)),
            );
            h.insert(
                headers::RETRY_TIER.into(),
                long_string(&retry::tier_label(tier)),
            );
            // The tier's delay also as the copy's own expiration: the copy leaves the tier
            // on time even where the broker loses the queue's `x-message-ttl` (measured: a
            // RabbitMQ 3.10 quorum tier recovered from a `kill -9` without it, and its
            // copies stayed for ever). The broker removes `expiration` when it dead-letters
            // the copy, so the message does not expire in the work queue.
            let tier_copy = copy(
                spec,
                d,
                retry::retry_exchange(&spec.queue),
                tier_queue,
                h,
                Some(tier.as_millis().to_string().into()),
            );
            Decision::Republish {
                copy: tier_copy,
                kind: CopyKind::Retry { tier, next_attempt },
                failure,
            }
        }
        RetryStep::Exhausted => park(spec, d, ParkReason::MaxAttempts, failure),
        RetryStep::ParkNow => park(spec, d, ParkReason::Permanent, failure),
    }
}

/// The decision when deciding itself panicked (a classifier, an error kind or an error's
/// `Display` is user code): park with the panic as evidence. Runs no user code, so it cannot
/// panic the same way; requeueing would re-run the handler and panic again, for ever.
pub(crate) fn park_after_panic(spec: &SettleSpec, d: &Delivery, message: String) -> Decision {
    park(spec, d, ParkReason::Handler, Failure::panic(message))
}

fn park(spec: &SettleSpec, d: &Delivery, reason: ParkReason, failure: Failure) -> Decision {
    // The tier the message last waited in is not where it is now: a parked copy that said
    // so would mislead whoever reads the parking queue.
    let mut map = evidence(spec, d, &failure).inner().clone();
    map.remove(headers::RETRY_TIER);
    let mut h = FieldTable::from(map);
    h.insert(
        headers::ATTEMPT.into(),
        AMQPValue::LongLongInt(i64::from(d.attempt().number)),
    );
    h.insert(headers::PARK_REASON.into(), long_string(reason.as_str()));
    Decision::Republish {
        copy: copy(
            spec,
            d,
            String::new(),
            retry::parking_queue(&spec.queue),
            h,
            None,
        ),
        kind: CopyKind::Park { reason },
        failure,
    }
}

/// The original headers plus rabbitkit's evidence headers.
fn evidence(spec: &SettleSpec, d: &Delivery, failure: &Failure) -> FieldTable {
    let mut map = d.headers().map(|h| h.inner().clone()).unwrap_or_default();
    map.retain(|k, _| !headers::BROKER_COUNT_HEADERS.contains(&k.as_str()));
    let mut h = FieldTable::from(map);
    let now = AMQPValue::LongLongInt(now_millis());
    if !h.contains_key(headers::FIRST_FAILURE_AT) {
        h.insert(headers::FIRST_FAILURE_AT.into(), now.clone());
    }
    h.insert(headers::LAST_FAILURE_AT.into(), now);
    h.insert(headers::ORIGINAL_EXCHANGE.into(), long_string(d.exchange()));
    h.insert(
        headers::ORIGINAL_ROUTING_KEY.into(),
        long_string(d.routing_key()),
    );
    h.insert(headers::SOURCE_QUEUE.into(), long_string(d.queue()));
    h.insert(headers::HANDLER.into(), long_string(&spec.handler));
    h.insert(
        headers::ERROR_KIND.into(),
        long_string(names::truncate(&failure.kind, 64)),
    );
    h.insert(
        headers::ERROR_MESSAGE.into(),
        long_string(names::truncate(
            &failure.message,
            headers::MAX_ERROR_MESSAGE,
        )),
    );
    h
}

/// A persistent copy with the original's identifying properties and `expiration` (a retry
/// copy gets its tier's delay; the original's own expiration is never copied).
fn copy(
    spec: &SettleSpec,
    d: &Delivery,
    exchange: String,
    routing_key: String,
    mut headers: FieldTable,
    expiration: Option<ShortString>,
) -> Envelope {
    let o = d.properties();
    // Signed last, over what the copy carries: its attempt and original route.
    spec.trust.sign(&mut headers, d.body());
    let mut p = BasicProperties::default()
        .with_delivery_mode(2)
        .with_headers(headers);
    if let Some(v) = expiration {
        p = p.with_expiration(v);
    }
    if let Some(v) = o.message_id() {
        p = p.with_message_id(v.clone());
    }
    if let Some(v) = o.correlation_id() {
        p = p.with_correlation_id(v.clone());
    }
    if let Some(v) = o.content_type() {
        p = p.with_content_type(v.clone());
    }
    if let Some(v) = o.content_encoding() {
        p = p.with_content_encoding(v.clone());
    }
    if let Some(v) = o.timestamp() {
        p = p.with_timestamp(*v);
    }
    if let Some(v) = o.kind() {
        p = p.with_type(v.clone());
    }
    if let Some(v) = o.app_id() {
        p = p.with_app_id(v.clone());
    }
    if let Some(v) = o.reply_to() {
        p = p.with_reply_to(v.clone());
    }
    if let Some(v) = o.priority() {
        p = p.with_priority(*v);
    }
    Envelope::new(exchange, routing_key, d.body().clone()).properties(p)
}

fn long_string(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kind::DefaultClassifier;
    use crate::outcome::Permanent;

    fn spec(policy: AckPolicy) -> SettleSpec {
        SettleSpec {
            queue: "orders".into(),
            handler: "handle_order".into(),
            retry: RetryPolicy::new([Duration::from_secs(5), Duration::from_secs(30)])
                .max_attempts(3),
            tier_queue_type: QueueType::Quorum,
            classifier: Arc::new(DefaultClassifier),
            policy,
            fallback: ManualFallback::NackRequeue,
            requeue_limit: 20,
            trust: HeaderTrust::default(),
        }
    }

    fn delivery(attempt: u32) -> Delivery {
        Delivery::builder("orders", r#"{"id":1}"#)
            .route("shop", "order.created")
            .properties(
                BasicProperties::default()
                    .with_message_id("m-1".into())
                    .with_expiration("1000".into()),
            )
            .attempt(attempt)
            .build()
    }

    const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn h<'a>(e: &'a Envelope, name: &str) -> Option<&'a AMQPValue> {
        e.basic_properties().headers().as_ref()?.inner().get(name)
    }

    #[test]
    fn copies_drop_the_quorum_queue_counters() {
        for attempt in [1, 3] {
            // Attempt 1 makes a retry copy, attempt 3 (the last) a parking copy.
            let d = Delivery::builder("orders", "{}")
                .header(headers::DELIVERY_COUNT, AMQPValue::LongLongInt(3))
                .header(headers::ACQUIRED_COUNT, AMQPValue::ShortShortUInt(7))
                .attempt(attempt)
                .build();
            assert_eq!((d.delivery_count(), d.acquired_count()), (Some(3), Some(7)));
            let Decision::Republish { copy, .. } =
                decide(&spec(AckPolicy::Auto), &d, Outcome::error("db down"))
            else {
                panic!("expected a copy at attempt {attempt}");
            };
            assert_eq!(h(&copy, headers::DELIVERY_COUNT), None);
            assert_eq!(h(&copy, headers::ACQUIRED_COUNT), None);
        }
    }

    #[test]
    fn unknown_error_goes_to_the_first_tier_with_evidence() {
        let d = decide(
            &spec(AckPolicy::Auto),
            &delivery(1),
            Outcome::error("db down"),
        );
        let Decision::Republish {
            copy,
            kind,
            failure,
        } = d
        else {
            panic!("expected a retry copy, got {d:?}");
        };
        assert_eq!(
            kind,
            CopyKind::Retry {
                tier: Duration::from_secs(5),
                next_attempt: 2
            }
        );
        assert_eq!(failure.message, "db down");
        assert_eq!(copy.exchange_name(), "orders.retry");
        assert_eq!(copy.routing_key(), "orders.delay.5s");
        assert_eq!(h(&copy, headers::ATTEMPT), Some(&AMQPValue::LongLongInt(2)));
        assert_eq!(
            h(&copy, headers::ORIGINAL_ROUTING_KEY),
            Some(&AMQPValue::LongString("order.created".into()))
        );
        let p = copy.basic_properties();
        assert_eq!(p.message_id().as_ref().map(|s| s.as_str()), Some("m-1"));
        assert_eq!(*p.delivery_mode(), Some(2));
        assert_eq!(
            p.expiration().as_ref().map(|s| s.as_str()),
            Some("5000"),
            "the original's expiration is replaced by the tier's delay"
        );
    }

    #[test]
    fn last_attempt_parks_with_max_attempts() {
        // It waited in a tier last time: the parked copy must not say it still does.
        let retried = Delivery::builder("orders", "{}")
            .route("shop", "order.created")
            .header(headers::RETRY_TIER, AMQPValue::LongString("5s".into()))
            .header("traceparent", AMQPValue::LongString(TRACEPARENT.into()))
            .attempt(3)
            .build();
        let d = decide(
            &spec(AckPolicy::Auto),
            &retried,
            Outcome::error("still down"),
        );
        let Decision::Republish { copy, kind, .. } = d else {
            panic!("expected a parking copy");
        };
        assert_eq!(h(&copy, headers::RETRY_TIER), None);
        assert_eq!(
            h(&copy, "traceparent"),
            Some(&AMQPValue::LongString(TRACEPARENT.into())),
            "the producer's trace context travels with the parked copy"
        );
        assert_eq!(
            kind,
            CopyKind::Park {
                reason: ParkReason::MaxAttempts
            }
        );
        assert_eq!(copy.exchange_name(), "");
        assert_eq!(copy.routing_key(), "orders.parking");
        assert_eq!(h(&copy, headers::ATTEMPT), Some(&AMQPValue::LongLongInt(3)));
        assert_eq!(
            h(&copy, headers::PARK_REASON),
            Some(&AMQPValue::LongString("max-attempts".into()))
        );
    }

    #[test]
    fn permanent_errors_and_decode_failures_park_at_once() {
        let d = decide(
            &spec(AckPolicy::Auto),
            &delivery(1),
            Outcome::error(Permanent::new("bad sku")),
        );
        assert!(matches!(
            d,
            Decision::Republish {
                kind: CopyKind::Park {
                    reason: ParkReason::Permanent
                },
                ..
            }
        ));
        let d = decide(
            &spec(AckPolicy::Auto),
            &delivery(1),
            Outcome::park(Failure::decode("eof")),
        );
        assert!(matches!(
            d,
            Decision::Republish {
                kind: CopyKind::Park {
                    reason: ParkReason::Decode
                },
                ..
            }
        ));
    }

    #[test]
    fn first_failure_time_is_kept_across_retries() {
        let d = Delivery::builder("orders", "x")
            .header(headers::FIRST_FAILURE_AT, AMQPValue::LongLongInt(7))
            .build();
        let Decision::Republish { copy, .. } =
            decide(&spec(AckPolicy::Auto), &d, Outcome::error("e"))
        else {
            panic!("expected a copy");
        };
        assert_eq!(
            h(&copy, headers::FIRST_FAILURE_AT),
            Some(&AMQPValue::LongLongInt(7))
        );
    }

    #[test]
    fn policies_map_outcomes() {
        let d = delivery(1);
        assert!(matches!(
            decide(&spec(AckPolicy::NackOnError), &d, Outcome::error("x")),
            Decision::Reject
        ));
        assert!(matches!(
            decide(&spec(AckPolicy::AckFirst), &d, Outcome::error("x")),
            Decision::Nothing
        ));
        assert!(matches!(
            decide(&spec(AckPolicy::Manual), &d, Outcome::Settled),
            Decision::Nothing
        ));
        assert!(matches!(
            decide(&spec(AckPolicy::Manual), &d, Outcome::Ack),
            Decision::Requeue
        ));
        let mut s = spec(AckPolicy::Manual);
        s.fallback = ManualFallback::Auto;
        assert!(matches!(decide(&s, &d, Outcome::Ack), Decision::Ack));
        assert!(matches!(
            decide(&spec(AckPolicy::Auto), &d, Outcome::Requeue),
            Decision::Requeue
        ));
    }

    #[test]
    fn long_error_messages_are_truncated() {
        let d = decide(
            &spec(AckPolicy::Auto),
            &delivery(1),
            Outcome::error("e".repeat(10_000)),
        );
        let Decision::Republish { copy, .. } = d else {
            panic!("expected a copy");
        };
        let Some(AMQPValue::LongString(m)) = h(&copy, headers::ERROR_MESSAGE) else {
            panic!("no message header");
        };
        assert_eq!(m.as_bytes().len(), headers::MAX_ERROR_MESSAGE);
    }
}
