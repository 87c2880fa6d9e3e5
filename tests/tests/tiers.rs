//! Delay tiers against the broker: quorum tiers with at-least-once dead-lettering by default,
//! classic tiers only as an opt-in, and the migration of classic tiers (every tier of
//! earlier releases) into quorum tiers without losing a copy.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use rabbitkit_core::extract::Body;
use rabbitkit_core::headers::{self, Attempt};
use rabbitkit_core::topology::MigratedTier;
use rabbitkit_core::{BoxError, ConnectionConfig, QueueType, RetryPolicy, Subscriber, Topology};
use rabbitkit_tests::{Broker, Vhost, http, table, wait_until};

const WAIT: Duration = Duration::from_secs(30);

/// The broker's view of a queue (management API): its type and arguments.
fn queue_info(vh: &Vhost, queue: &str) -> serde_json::Value {
    let (status, body) = http(
        &vh.broker.mgmt,
        "GET",
        &format!("/api/queues/{}/{queue}", vh.name),
        None,
    );
    assert_eq!(status, 200, "{queue}: {body}");
    serde_json::from_str(&body).unwrap()
}

fn ls(s: &str) -> AMQPValue {
    AMQPValue::LongString(s.into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tiers_are_quorum_with_at_least_once_dead_lettering_and_retry_through_them() {
    let vh = Broker::from_env().vhost("tiers-quorum");
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let a2 = attempts.clone();
    // More failures than RabbitMQ 4.x's default quorum delivery-limit (20): every retry is
    // a new message in the tier, which never delivers anything, so the limit never applies.
    let sub = Subscriber::new("orders", move |a: Attempt| {
        let attempts = a2.clone();
        let n = a.number;
        async move {
            attempts.lock().unwrap().push(n);
            if n <= 22 {
                Err::<(), BoxError>("not yet".into())
            } else {
                Ok(())
            }
        }
    })
    .retry(RetryPolicy::new([Duration::from_millis(20)]).max_attempts(30));
    let w = vh.start_worker(sub).await;
    let q = queue_info(&vh, "orders.delay.20ms");
    assert_eq!(q["type"], "quorum", "{q}");
    let args = &q["arguments"];
    assert_eq!(args["x-dead-letter-strategy"], "at-least-once", "{q}");
    assert_eq!(args["x-overflow"], "reject-publish", "{q}");
    assert_eq!(args["x-message-ttl"], 20, "{q}");
    assert_eq!(args["x-dead-letter-exchange"], "", "{q}");
    assert_eq!(args["x-dead-letter-routing-key"], "orders", "{q}");
    assert_eq!(
        vh.try_depth("orders.retry.20ms").await,
        None,
        "no classic tier"
    );
    vh.publish_raw("", "orders", b"{}", BasicProperties::default())
        .await;
    wait_until(WAIT, "23 attempts, the last one succeeding", || async {
        attempts.lock().unwrap().len() >= 23
    })
    .await;
    let st = w.shutdown().await.subscribers["orders"];
    assert_eq!(st.retried, 22, "{st:?}");
    assert_eq!(
        *attempts.lock().unwrap(),
        (1..=23).collect::<Vec<u32>>(),
        "{st:?}"
    );
    assert_eq!(st.parked, 0, "{st:?}");
    assert_eq!(vh.depth("orders.parking").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn classic_tiers_are_an_opt_in_under_their_classic_names() {
    let vh = Broker::from_env().vhost("tiers-classic");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let sub = Subscriber::new("orders", move |a: Attempt| {
        let seen = s2.clone();
        let n = a.number;
        async move {
            seen.lock().unwrap().push(n);
            if n == 1 {
                Err::<(), BoxError>("once".into())
            } else {
                Ok(())
            }
        }
    })
    .tier_queue_type(QueueType::Classic)
    .retry(RetryPolicy::new([Duration::from_millis(100)]));
    let w = vh.start_worker(sub).await;
    let q = queue_info(&vh, "orders.retry.100ms");
    assert_eq!(q["type"], "classic", "{q}");
    assert!(q["arguments"]["x-dead-letter-strategy"].is_null(), "{q}");
    assert_eq!(vh.try_depth("orders.delay.100ms").await, None);
    vh.publish_raw("", "orders", b"{}", BasicProperties::default())
        .await;
    wait_until(WAIT, "retried through the classic tier", || async {
        seen.lock().unwrap().len() >= 2
    })
    .await;
    w.shutdown().await;
    assert_eq!(*seen.lock().unwrap(), [1, 2]);
}

/// The retry copy carries its tier's delay as its own `expiration` too (a tier that lost
/// its `x-message-ttl` still lets it go on time), and the broker takes it off when it
/// dead-letters the copy: the retried message cannot expire in the work queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retry_copies_expire_on_their_own_and_arrive_without_an_expiration() {
    for tier_type in [QueueType::Quorum, QueueType::Classic] {
        let vh = Broker::from_env().vhost("tiers-expiration");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = seen.clone();
        let sub = Subscriber::new("orders", move |d: rabbitkit_core::Delivery| {
            let seen = s2.clone();
            async move {
                let n = d.attempt().number;
                let expiration = d.properties().expiration().as_ref().map(|e| e.to_string());
                seen.lock().unwrap().push((n, expiration));
                if n == 1 {
                    Err::<(), BoxError>("once".into())
                } else {
                    Ok(())
                }
            }
        })
        .tier_queue_type(tier_type)
        .retry(RetryPolicy::new([Duration::from_millis(300)]));
        let w = vh.start_worker(sub).await;
        vh.publish_raw("", "orders", b"{}", BasicProperties::default())
            .await;
        wait_until(WAIT, "retried through the tier", || async {
            seen.lock().unwrap().len() >= 2
        })
        .await;
        w.shutdown().await;
        assert_eq!(
            *seen.lock().unwrap(),
            [(1, None), (2, None)],
            "{tier_type:?}: the retried delivery has no expiration"
        );
    }
    // The broker side of it: a quorum queue without `x-message-ttl` dead-letters a copy
    // whose own expiration passed, at least once, and without the expiration.
    let vh = Broker::from_env().vhost("tiers-message-ttl");
    vh.declare_queue("target", FieldTable::default()).await;
    vh.declare_queue(
        "tier-without-ttl",
        table(&[
            ("x-queue-type", ls("quorum")),
            ("x-dead-letter-exchange", ls("")),
            ("x-dead-letter-routing-key", ls("target")),
            ("x-dead-letter-strategy", ls("at-least-once")),
            ("x-overflow", ls("reject-publish")),
        ]),
    )
    .await;
    vh.publish_raw(
        "",
        "tier-without-ttl",
        b"copy",
        BasicProperties::default()
            .with_delivery_mode(2)
            .with_expiration("200".into()),
    )
    .await;
    wait_until(WAIT, "the copy expired into the target", || async {
        vh.depth("target").await == 1
    })
    .await;
    let got = vh.get_all("target", 1).await;
    assert_eq!(got[0].body, b"copy");
    assert!(got[0].properties.expiration().is_none(), "{got:?}");
}

/// Declares the topology of an earlier release (classic tiers `{q}.retry.{delay}`) for
/// `queue` with `delays`, as the classic opt-in still does.
async fn classic_topology(vh: &Vhost, queue: &str, delays: &[Duration]) -> Topology {
    let mut t = Topology::new(queue);
    t.tiers = delays.to_vec();
    t.tier_queue_type = QueueType::Classic;
    t.declare(&ConnectionConfig::new(vh.url())).await.unwrap();
    t
}

/// A copy as the runtime writes it into a tier: own headers, ids, content type.
fn tier_copy(i: usize, tier: &str) -> BasicProperties {
    BasicProperties::default()
        .with_message_id(format!("m-{i}").into())
        .with_correlation_id(format!("c-{i}").into())
        .with_content_type("application/json".into())
        .with_headers(table(&[
            (headers::ATTEMPT, AMQPValue::LongLongInt(2)),
            (headers::RETRY_TIER, ls(tier)),
            (headers::ORIGINAL_ROUTING_KEY, ls("order.paid")),
            ("tenant", ls("acme")),
        ]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrate_moves_every_classic_tier_copy_into_the_quorum_tiers_then_deletes_them() {
    let vh = Broker::from_env().vhost("tiers-migrate");
    let conn = ConnectionConfig::new(vh.url());
    // 10 s: long enough for the migration to finish before the classic tier would expire
    // anything on its own (every copy must go through the quorum tier).
    let (d10, d1m) = (Duration::from_secs(10), Duration::from_secs(60));
    let old = classic_topology(&vh, "orders", &[d10, d1m]).await;
    const N: usize = 40;
    for i in 0..N {
        let (tier, key) = if i % 4 == 0 {
            ("1m", "orders.retry.1m")
        } else {
            ("10s", "orders.retry.10s")
        };
        vh.publish_raw(
            "orders.retry",
            key,
            format!(r#"{{"id":{i}}}"#).as_bytes(),
            tier_copy(i, tier),
        )
        .await;
    }
    assert_eq!(vh.depth("orders.retry.10s").await, 30);
    assert_eq!(vh.depth("orders.retry.1m").await, 10);

    // The new schedule keeps 10 s and drops 1 min; the old 1 min tier is named with `also`.
    let mut new = Topology::new("orders");
    new.tiers = vec![d10, Duration::from_secs(30)];
    let legacy = new.legacy_tiers(&conn).await.unwrap();
    assert_eq!(
        legacy.iter().map(|t| t.queue.as_str()).collect::<Vec<_>>(),
        ["orders.retry.10s"],
        "only the delays of the schedule are looked for"
    );
    assert_eq!(legacy[0].messages, 30);

    let report = new.migrate_tiers(&conn, &[d1m]).await.unwrap();
    assert!(report.is_complete(), "{report:?}");
    assert_eq!(report.moved(), N as u64, "{report:?}");
    let by_old: Vec<_> = report
        .tiers
        .iter()
        .map(|t| {
            (
                t.old_queue.as_str(),
                t.new_queue.as_str(),
                t.moved,
                &t.outcome,
            )
        })
        .collect();
    assert_eq!(
        by_old,
        [
            (
                "orders.retry.10s",
                "orders.delay.10s",
                30,
                &MigratedTier::Deleted
            ),
            (
                "orders.retry.30s",
                "orders.delay.30s",
                0,
                &MigratedTier::Absent
            ),
            (
                "orders.retry.1m",
                "orders.delay.1m",
                10,
                &MigratedTier::Deleted
            ),
        ]
    );
    // The classic tiers are gone, the copies wait in the quorum tiers of the same delays.
    assert_eq!(vh.try_depth("orders.retry.10s").await, None);
    assert_eq!(vh.try_depth("orders.retry.1m").await, None);
    assert_eq!(queue_info(&vh, "orders.delay.10s")["type"], "quorum");
    assert_eq!(vh.depth("orders.delay.1m").await, 10);
    assert_eq!(vh.depth("orders").await, 0, "nothing skipped the delay");
    assert!(new.legacy_tiers(&conn).await.unwrap().is_empty());
    // The retry exchange routes the new names only.
    assert!(old.retry_exchange() == new.retry_exchange());

    // The 10 s copies expire into the work queue through the quorum tier, untouched.
    wait_until(WAIT, "30 copies in the work queue", || async {
        vh.depth("orders").await == 30
    })
    .await;
    let got = vh.get_all("orders", 100).await;
    let mut ids = HashSet::new();
    for g in &got {
        let id = g.properties.message_id().as_ref().unwrap().to_string();
        let i: usize = id.trim_start_matches("m-").parse().unwrap();
        assert_eq!(g.body, format!(r#"{{"id":{i}}}"#).as_bytes());
        assert_eq!(
            g.properties.correlation_id().as_ref().unwrap().as_str(),
            format!("c-{i}")
        );
        assert_eq!(
            g.properties.content_type().as_ref().unwrap().as_str(),
            "application/json"
        );
        assert_eq!(g.properties.delivery_mode(), &Some(2));
        assert_eq!(g.header_int(headers::ATTEMPT), Some(2));
        assert_eq!(g.header_str(headers::RETRY_TIER).as_deref(), Some("10s"));
        assert_eq!(
            g.header_str(headers::ORIGINAL_ROUTING_KEY).as_deref(),
            Some("order.paid")
        );
        assert_eq!(g.header_str("tenant").as_deref(), Some("acme"));
        // Dead-lettered by the quorum tier: the broker's evidence names it.
        let AMQPValue::FieldArray(deaths) = g.header("x-death").unwrap() else {
            panic!("x-death: {:?}", g.header("x-death"));
        };
        let newest = deaths.as_slice()[0].as_field_table().unwrap().inner();
        assert_eq!(newest.get("queue"), Some(&ls("orders.delay.10s")));
        assert_eq!(newest.get("reason"), Some(&ls("expired")));
        ids.insert(i);
    }
    assert_eq!(ids.len(), 30, "each copy once");
    assert!(ids.iter().all(|i| i % 4 != 0));

    // A second run finds nothing to do.
    let again = new.migrate_tiers(&conn, &[d1m]).await.unwrap();
    assert!(again.is_complete() && again.moved() == 0, "{again:?}");
    assert!(
        again
            .tiers
            .iter()
            .all(|t| t.outcome == MigratedTier::Absent)
    );
}

#[tokio::test]
async fn migrate_refuses_without_a_work_queue_and_for_classic_tiers() {
    let vh = Broker::from_env().vhost("tiers-migrate-refused");
    let conn = ConnectionConfig::new(vh.url());
    vh.declare_queue(
        "orders.retry.10s",
        table(&[("x-message-ttl", AMQPValue::LongInt(10_000))]),
    )
    .await;
    vh.publish_raw("", "orders.retry.10s", b"x", BasicProperties::default())
        .await;
    let mut t = Topology::new("orders");
    t.tiers = vec![Duration::from_secs(10)];
    let err = t.migrate_tiers(&conn, &[]).await.unwrap_err().to_string();
    assert!(err.contains("does not exist"), "{err}");
    t.tier_queue_type = QueueType::Classic;
    let err = t.migrate_tiers(&conn, &[]).await.unwrap_err().to_string();
    assert!(err.contains("classic"), "{err}");
    assert_eq!(vh.depth("orders.retry.10s").await, 1, "nothing touched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_with_quorum_tiers_starts_next_to_classic_tiers_of_an_earlier_release() {
    let vh = Broker::from_env().vhost("tiers-upgrade");
    let d = Duration::from_millis(300);
    classic_topology(&vh, "orders", &[d]).await;
    // A copy left by the earlier release: still delivered, through the classic tier.
    vh.publish_raw(
        "orders.retry",
        "orders.retry.300ms",
        b"old",
        tier_copy(0, "300ms"),
    )
    .await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let sub = Subscriber::new("orders", move |Body(b): Body, a: Attempt| {
        let seen = s2.clone();
        let n = a.number;
        async move {
            seen.lock().unwrap().push((b.to_vec(), n));
            if b.as_ref() == b"new" && n == 1 {
                Err::<(), BoxError>("once".into())
            } else {
                Ok(())
            }
        }
    })
    .retry(RetryPolicy::new([d]));
    // No 406: the quorum tier has a name of its own.
    let w = vh.start_worker(sub).await;
    assert_eq!(queue_info(&vh, "orders.delay.300ms")["type"], "quorum");
    vh.publish_raw("", "orders", b"new", BasicProperties::default())
        .await;
    wait_until(WAIT, "old copy and new message handled", || async {
        seen.lock().unwrap().len() >= 3
    })
    .await;
    w.shutdown().await;
    let seen = seen.lock().unwrap().clone();
    assert!(seen.contains(&(b"old".to_vec(), 2)), "{seen:?}");
    assert!(seen.contains(&(b"new".to_vec(), 2)), "{seen:?}");
    let mut t = Topology::new("orders");
    t.tiers = vec![d];
    let legacy = t
        .legacy_tiers(&ConnectionConfig::new(vh.url()))
        .await
        .unwrap();
    assert_eq!(
        legacy.len(),
        1,
        "the classic tier is left for the migration"
    );
    assert_eq!(legacy[0].messages, 0);
}
