//! The transactional Postgres inbox (feature `postgres`) against a real Postgres
//! (`scripts/postgres`, `RABBITKIT_TEST_POSTGRES`) and a real broker: a deposit handler whose
//! effect is not idempotent by itself (`UPDATE balance = balance + amount` and a ledger row)
//! applies each message once. Each test has a schema of its own.
//!
//! `cargo test -p rabbitkit-tests --features postgres --test inbox`
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use lapin::BasicProperties;
use rabbitkit_core::extract::Json;
use rabbitkit_core::headers;
use rabbitkit_core::inbox::{CleanupConfig, CleanupReport, Inbox, InboxError, InboxOptions, Tx};
use rabbitkit_core::{AckPolicy, BoxError, ConnectionConfig, RetryPolicy, Subscriber, Worker};
use rabbitkit_tests::{Broker, Vhost, wait_until};
use serde::Deserialize;

const WAIT: Duration = Duration::from_secs(60);

/// The crash test restarts the shared server: it runs alone (write), the others together (read).
static SERVER: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// The Postgres URL; a missing variable fails the test (never a skip).
fn pg_url() -> String {
    std::env::var("RABBITKIT_TEST_POSTGRES").unwrap_or_else(|_| {
        panic!(
            "RABBITKIT_TEST_POSTGRES is not set: run `scripts/postgres start` and export \
             RABBITKIT_TEST_POSTGRES=$(scripts/postgres url) (scripts/test does both)"
        )
    })
}

fn unique(hint: &str) -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("t_{hint}_{}", n % 1_000_000_000_000)
}

/// An inbox on a fresh schema, migrated, with the application's tables beside it.
async fn inbox(hint: &str) -> Inbox {
    let schema = unique(hint);
    let inbox = Inbox::connect(
        InboxOptions::new(pg_url())
            .schema(&schema)
            .migrate(true)
            .max_connections(20),
    )
    .await
    .unwrap();
    for stmt in [
        format!("CREATE TABLE {schema}.accounts (id text PRIMARY KEY, balance bigint NOT NULL)"),
        format!(
            "CREATE TABLE {schema}.ledger (message_id text NOT NULL, account text NOT NULL, amount bigint NOT NULL)"
        ),
    ] {
        sqlx::query(&stmt).execute(inbox.pool()).await.unwrap();
    }
    inbox
}

#[derive(Deserialize)]
struct Deposit {
    account: String,
    amount: i64,
}

fn body(account: &str, amount: i64) -> Vec<u8> {
    format!("{{\"account\":\"{account}\",\"amount\":{amount}}}").into_bytes()
}

/// Runs of the handler, and how the test wants it to behave.
#[derive(Clone, Default)]
struct Knobs {
    runs: Arc<AtomicU32>,
    /// Fail (after writing the effect) while `runs` is at most this.
    fail_first: u32,
    /// Sleep after writing the effect (keeps the transaction open).
    hold: Duration,
}

/// The deposit handler: a non-idempotent effect through the delivery's transaction.
fn deposit_subscriber(queue: &str, schema: &str, knobs: Knobs) -> Subscriber {
    let schema: Arc<str> = schema.into();
    let handler = move |Json(d): Json<Deposit>, msg: rabbitkit_core::extract::MessageId, tx: Tx| {
        let (schema, knobs) = (schema.clone(), knobs.clone());
        async move {
            let run = knobs.runs.fetch_add(1, Ordering::SeqCst) + 1;
            let mut db = tx.lock().await?;
            sqlx::query(&format!(
                "INSERT INTO {schema}.accounts (id, balance) VALUES ($1, $2)
                 ON CONFLICT (id) DO UPDATE SET balance = accounts.balance + EXCLUDED.balance"
            ))
            .bind(&d.account)
            .bind(d.amount)
            .execute(&mut *db)
            .await?;
            sqlx::query(&format!(
                "INSERT INTO {schema}.ledger (message_id, account, amount) VALUES ($1, $2, $3)"
            ))
            .bind(msg.0.unwrap_or_default())
            .bind(&d.account)
            .bind(d.amount)
            .execute(&mut *db)
            .await?;
            drop(db);
            if !knobs.hold.is_zero() {
                tokio::time::sleep(knobs.hold).await;
            }
            if run <= knobs.fail_first {
                return Err::<(), BoxError>("injected failure after the effect".into());
            }
            Ok(())
        }
    };
    Subscriber::new(queue, handler)
        .ack_policy(AckPolicy::Transactional)
        .retry(RetryPolicy::new([Duration::from_secs(1)]).max_attempts(5))
}

async fn start(vh: &Vhost, inbox: &Inbox, sub: Subscriber) -> rabbitkit_core::WorkerHandle {
    Worker::new(ConnectionConfig::new(vh.url()))
        .shutdown_deadline(Duration::from_secs(5))
        .postgres(inbox.clone())
        .subscribe(sub)
        .start()
        .await
        .unwrap_or_else(|e| panic!("worker start: {e}"))
}

async fn publish(vh: &Vhost, queue: &str, id: Option<&str>, body: &[u8]) {
    let mut p = BasicProperties::default().with_delivery_mode(2);
    if let Some(id) = id {
        p = p.with_message_id(id.into());
    }
    vh.publish_raw("", queue, body, p).await;
}

async fn scalar(inbox: &Inbox, sql: &str) -> i64 {
    sqlx::query_scalar::<_, i64>(sql)
        .fetch_one(inbox.pool())
        .await
        .unwrap()
}

async fn balance(inbox: &Inbox, account: &str) -> i64 {
    let s = inbox.schema();
    sqlx::query_scalar::<_, i64>(&format!("SELECT balance FROM {s}.accounts WHERE id = $1"))
        .bind(account)
        .fetch_optional(inbox.pool())
        .await
        .unwrap()
        .unwrap_or(0)
}

async fn ledger_rows(inbox: &Inbox) -> i64 {
    scalar(
        inbox,
        &format!("SELECT count(*) FROM {}.ledger", inbox.schema()),
    )
    .await
}

async fn settled(vh: &Vhost, w: &rabbitkit_core::WorkerHandle, queue: &str, acked: u64) {
    wait_until(WAIT, "every copy acked and the queue empty", || async {
        w.stats(queue).unwrap().acked >= acked && vh.depth(queue).await == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicate_publish_applies_the_effect_once() {
    let _server = SERVER.read().await;
    let vh = Broker::from_env().vhost("inbox-dup");
    let inbox = inbox("dup").await;
    let knobs = Knobs::default();
    let w = start(
        &vh,
        &inbox,
        deposit_subscriber("deposits", inbox.schema(), knobs.clone()),
    )
    .await;
    let b = body("alice", 500);
    publish(&vh, "deposits", Some("dep-1"), &b).await;
    settled(&vh, &w, "deposits", 1).await;
    publish(&vh, "deposits", Some("dep-1"), &b).await;
    settled(&vh, &w, "deposits", 2).await;
    let st = w.shutdown().await.subscribers["deposits"];
    assert_eq!(balance(&inbox, "alice").await, 500);
    assert_eq!(ledger_rows(&inbox).await, 1);
    assert_eq!(
        knobs.runs.load(Ordering::SeqCst),
        1,
        "the duplicate did not run the handler"
    );
    let s = inbox.stats();
    assert_eq!((s.claimed, s.committed, s.duplicates), (1, 1, 1), "{s:?}");
    assert_eq!((st.acked, st.parked, st.retried), (2, 0, 0), "{st:?}");
    assert_eq!(vh.depth("deposits.parking").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn same_id_with_another_body_is_parked_as_inbox_conflict() {
    let _server = SERVER.read().await;
    let vh = Broker::from_env().vhost("inbox-conflict");
    let inbox = inbox("conflict").await;
    let knobs = Knobs::default();
    let w = start(
        &vh,
        &inbox,
        deposit_subscriber("deposits", inbox.schema(), knobs.clone()),
    )
    .await;
    publish(&vh, "deposits", Some("dep-1"), &body("alice", 500)).await;
    settled(&vh, &w, "deposits", 1).await;
    publish(&vh, "deposits", Some("dep-1"), &body("alice", 900)).await;
    wait_until(WAIT, "the conflicting copy parked", || async {
        vh.depth("deposits.parking").await == 1
    })
    .await;
    w.shutdown().await;
    let parked = vh.get_all("deposits.parking", 10).await;
    assert_eq!(parked.len(), 1);
    assert_eq!(
        parked[0].header_str(headers::ERROR_KIND).as_deref(),
        Some("inbox-conflict")
    );
    assert_eq!(parked[0].body, body("alice", 900));
    assert_eq!(
        balance(&inbox, "alice").await,
        500,
        "effect once, from the first body"
    );
    assert_eq!(ledger_rows(&inbox).await, 1);
    assert_eq!(knobs.runs.load(Ordering::SeqCst), 1);
    assert_eq!(inbox.stats().conflicts, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn handler_error_rolls_back_then_the_retry_applies_once() {
    let _server = SERVER.read().await;
    let vh = Broker::from_env().vhost("inbox-retry");
    let inbox = inbox("retry").await;
    let knobs = Knobs {
        fail_first: 2,
        ..Knobs::default()
    };
    let w = start(
        &vh,
        &inbox,
        deposit_subscriber("deposits", inbox.schema(), knobs.clone()),
    )
    .await;
    publish(&vh, "deposits", Some("dep-1"), &body("bob", 70)).await;
    wait_until(WAIT, "two failures then a success", || async {
        inbox.stats().committed == 1
    })
    .await;
    settled(&vh, &w, "deposits", 3).await;
    let st = w.shutdown().await.subscribers["deposits"];
    assert_eq!(knobs.runs.load(Ordering::SeqCst), 3);
    assert_eq!(
        balance(&inbox, "bob").await,
        70,
        "the failed runs' writes rolled back"
    );
    assert_eq!(ledger_rows(&inbox).await, 1);
    let s = inbox.stats();
    assert_eq!((s.claimed, s.rolled_back, s.committed), (3, 2, 1), "{s:?}");
    assert_eq!(st.retried, 2, "{st:?}");
    assert_eq!(vh.depth("deposits.parking").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_copies_of_one_message_apply_once() {
    let _server = SERVER.read().await;
    let vh = Broker::from_env().vhost("inbox-concurrent");
    let inbox = inbox("concurrent").await;
    let knobs = Knobs {
        hold: Duration::from_millis(400),
        ..Knobs::default()
    };
    let sub = deposit_subscriber("deposits", inbox.schema(), knobs.clone())
        .prefetch(16)
        .concurrency(16);
    let w = start(&vh, &inbox, sub).await;
    // Eight ids, each published four times in one go: copies of one id are in flight at once.
    let mut batch = Vec::new();
    for i in 0..8 {
        for _ in 0..4 {
            let p = BasicProperties::default()
                .with_delivery_mode(2)
                .with_message_id(format!("dep-{i}").into());
            batch.push((body("carol", 10 + i), p));
        }
    }
    rabbitkit_tests::publish_confirmed(&vh.url(), "", "deposits", batch).await;
    settled(&vh, &w, "deposits", 32).await;
    w.shutdown().await;
    let expected: i64 = (0..8).map(|i| 10 + i).sum();
    assert_eq!(balance(&inbox, "carol").await, expected);
    assert_eq!(ledger_rows(&inbox).await, 8);
    let s = inbox.stats();
    assert_eq!((s.committed, s.duplicates), (8, 24), "{s:?}");
    assert_eq!(
        knobs.runs.load(Ordering::SeqCst),
        8,
        "a waiting copy never ran"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn missing_message_id_and_poison_are_parked_without_effect() {
    let _server = SERVER.read().await;
    let vh = Broker::from_env().vhost("inbox-park");
    let inbox = inbox("park").await;
    let knobs = Knobs::default();
    let w = start(
        &vh,
        &inbox,
        deposit_subscriber("deposits", inbox.schema(), knobs.clone()),
    )
    .await;
    publish(&vh, "deposits", None, &body("dave", 5)).await;
    publish(&vh, "deposits", Some("poison-1"), b"not json").await;
    wait_until(WAIT, "both parked", || async {
        vh.depth("deposits.parking").await == 2
    })
    .await;
    w.shutdown().await;
    let mut kinds: Vec<_> = vh
        .get_all("deposits.parking", 10)
        .await
        .iter()
        .map(|g| g.header_str(headers::ERROR_KIND).unwrap_or_default())
        .collect();
    kinds.sort();
    assert_eq!(kinds, ["decode", "missing-message-id"]);
    assert_eq!(knobs.runs.load(Ordering::SeqCst), 0);
    let rows = scalar(
        &inbox,
        &format!("SELECT count(*) FROM {}.rabbitkit_inbox", inbox.schema()),
    )
    .await;
    assert_eq!(rows, 0, "the poison's claim was rolled back");
    assert_eq!(inbox.stats().missing_id, 1);
}

/// `pg_ctl restart -m immediate` during a steady publish: every deposit applied exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_crash_restart_during_publish_applies_each_deposit_once() {
    let _alone = SERVER.write().await;
    let vh = Broker::from_env().vhost("inbox-pgcrash");
    let inbox = inbox("pgcrash").await;
    // Transactions stay open 100 ms: the crash finds some in flight.
    let knobs = Knobs {
        hold: Duration::from_millis(100),
        ..Knobs::default()
    };
    // The outage pause is not built yet (docs/EXACTLY-ONCE.md): claims during the outage are
    // requeued, so the requeue limit is raised for the restart's seconds.
    let sub = deposit_subscriber("deposits", inbox.schema(), knobs.clone())
        .prefetch(8)
        .concurrency(8)
        .requeue_limit(100_000);
    let w = start(&vh, &inbox, sub).await;
    const N: i64 = 400;
    let mut expected: HashMap<String, i64> = HashMap::new();
    let mut copies = 0u64;
    let publisher = {
        let url = vh.url();
        let mut msgs = Vec::new();
        for i in 0..N {
            let account = format!("acc-{}", i % 7);
            *expected.entry(account.clone()).or_default() += i;
            let p = BasicProperties::default()
                .with_delivery_mode(2)
                .with_message_id(format!("dep-{i}").into());
            msgs.push((body(&account, i), p.clone()));
            copies += 1;
            if i % 10 == 0 {
                msgs.push((body(&account, i), p));
                copies += 1;
            }
        }
        tokio::spawn(async move {
            for chunk in msgs.chunks(20) {
                rabbitkit_tests::publish_confirmed(&url, "", "deposits", chunk.to_vec()).await;
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
        })
    };
    wait_until(WAIT, "some deposits committed", || async {
        inbox.stats().committed >= 50
    })
    .await;
    let out = tokio::task::spawn_blocking(|| {
        std::process::Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/postgres"))
            .arg("restart-immediate")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "restart: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    publisher.await.unwrap();
    wait_until(
        Duration::from_secs(120),
        "every deposit in the ledger and the queue empty",
        || async {
            let rows = sqlx::query_scalar::<_, i64>(&format!(
                "SELECT count(DISTINCT message_id) FROM {}.ledger",
                inbox.schema()
            ))
            .fetch_one(inbox.pool())
            .await
            .unwrap_or(0);
            rows == N
                && vh.depth("deposits").await == 0
                && w.stats("deposits").unwrap().acked >= copies
        },
    )
    .await;
    let st = w.shutdown().await.subscribers["deposits"];
    for (account, sum) in &expected {
        assert_eq!(balance(&inbox, account).await, *sum, "{account}");
    }
    assert_eq!(ledger_rows(&inbox).await, N, "no deposit applied twice");
    assert_eq!(vh.depth("deposits.parking").await, 0, "{st:?}");
    let s = inbox.stats();
    eprintln!(
        "pg crash: {s:?}; worker: acked {} requeued {} retried {}",
        st.acked, st.requeued, st.retried
    );
    assert!(
        s.rolled_back + s.claim_failed + s.commit_unknown >= 1,
        "the crash hit transactions in flight: {s:?}"
    );
    // A commit whose outcome was unknown may have committed: its redelivery is a duplicate.
    let n = u64::try_from(N).unwrap();
    assert!(
        s.committed <= n && s.committed + s.commit_unknown >= n,
        "{s:?}"
    );
}

/// Only old rows go, in batches, and only by the session holding the cleanup lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_deletes_only_old_rows_in_batches_by_one_session() {
    let _server = SERVER.read().await;
    let inbox = inbox("cleanup").await;
    let s = inbox.schema().to_owned();
    sqlx::query(&format!(
        "INSERT INTO {s}.rabbitkit_inbox (consumer, message_id, body_digest, claimed_at)
         SELECT 'q', 'old-' || g, '\\x00'::bytea, now() - interval '8 days' FROM generate_series(1, 2500) g
         UNION ALL
         SELECT 'q', 'new-' || g, '\\x00'::bytea, now() - interval '6 days' FROM generate_series(1, 300) g"
    ))
    .execute(inbox.pool())
    .await
    .unwrap();
    let cfg = CleanupConfig {
        batch: 1000,
        pause: Duration::from_millis(1),
        ..CleanupConfig::default()
    };
    let mut other = inbox.pool().acquire().await.unwrap().detach();
    let first = inbox.cleanup_once(&cfg).await.unwrap();
    assert_eq!(
        first,
        CleanupReport::Done {
            deleted: 2500,
            batches: 3
        }
    );
    let left = scalar(&inbox, &format!("SELECT count(*) FROM {s}.rabbitkit_inbox")).await;
    assert_eq!(left, 300, "only rows older than 7 days deleted");
    let kept_old = scalar(
        &inbox,
        &format!("SELECT count(*) FROM {s}.rabbitkit_inbox WHERE message_id LIKE 'old-%'"),
    )
    .await;
    assert_eq!(kept_old, 0);
    // Batches: refill and count the statements of a pass.
    sqlx::query(&format!(
        "INSERT INTO {s}.rabbitkit_inbox (consumer, message_id, body_digest, claimed_at)
         SELECT 'q', 'again-' || g, '\\x00'::bytea, now() - interval '9 days' FROM generate_series(1, 2500) g"
    ))
    .execute(inbox.pool())
    .await
    .unwrap();
    // Hold the lock from another session, as a second instance running its pass would.
    let lock_holder: bool = sqlx::query_scalar(
        "SELECT pg_try_advisory_lock(('x' || substr(encode(sha256(convert_to($1, 'UTF8')), 'hex'), 1, 16))::bit(64)::bigint)",
    )
    .bind(format!("rabbitkit:cleanup:{s}"))
    .fetch_one(&mut other)
    .await
    .unwrap();
    assert!(lock_holder);
    assert_eq!(
        inbox.cleanup_once(&cfg).await.unwrap(),
        CleanupReport::Skipped
    );
    drop(other); // the session ends, its lock with it
    tokio::time::sleep(Duration::from_millis(200)).await;
    let report = inbox.cleanup_once(&cfg).await.unwrap();
    assert_eq!(
        report,
        CleanupReport::Done {
            deleted: 2500,
            batches: 3
        }
    );
    assert_eq!(
        scalar(&inbox, &format!("SELECT count(*) FROM {s}.rabbitkit_inbox")).await,
        300
    );
}

#[tokio::test]
async fn unreachable_postgres_is_a_typed_error_without_the_password() {
    let _server = SERVER.read().await;
    // Nothing listens on port 1.
    let url = "postgres://rabbitkit:Sup3rS3cretPw@127.0.0.1:1/rabbitkit";
    let opts = InboxOptions::new(url).connect_timeout(Duration::from_secs(2));
    assert!(!format!("{opts:?}").contains("Sup3rS3cretPw"), "{opts:?}");
    let err = Inbox::connect(opts).await.unwrap_err();
    assert!(matches!(err, InboxError::Unreachable { .. }), "{err:?}");
    for text in [err.to_string(), format!("{err:?}")] {
        assert!(!text.contains("Sup3rS3cretPw"), "{text}");
    }
    // A wrong password on the real server: refused, and the attempt is not echoed.
    let real = pg_url();
    let mut u = url::Url::parse(&real).unwrap();
    u.set_password(Some("Wr0ngPassw0rdX")).unwrap();
    let err = Inbox::connect(InboxOptions::new(u.as_str()))
        .await
        .unwrap_err();
    assert!(matches!(err, InboxError::Unreachable { .. }), "{err:?}");
    assert!(
        !format!("{err} {err:?}").contains("Wr0ngPassw0rdX"),
        "{err}"
    );
    // A connected inbox's Debug shows neither the password nor the options.
    let ok = Inbox::connect(InboxOptions::new(real.clone()))
        .await
        .unwrap();
    let password = url::Url::parse(&real)
        .unwrap()
        .password()
        .unwrap()
        .to_owned();
    assert!(!format!("{ok:?}").contains(&password), "{ok:?}");
}

#[tokio::test]
async fn transactional_subscriber_without_an_inbox_is_refused_at_start() {
    let _server = SERVER.read().await;
    let vh = Broker::from_env().vhost("inbox-unwired");
    let sub = deposit_subscriber("deposits", "unused", Knobs::default());
    let Err(err) = Worker::new(ConnectionConfig::new(vh.url()))
        .subscribe(sub)
        .start()
        .await
    else {
        panic!("a transactional subscriber started without an inbox");
    };
    let text = err.to_string();
    assert!(text.contains("Inbox") || text.contains("inbox"), "{text}");
}
