//! Manual acks for a database-backed handler: an idempotent insert keyed by the message id
//! in SQLite, committed **before** the ack. Two layers of protection against duplicates:
//!
//! - the `Idempotent` layer with a SQLite-backed store: a message id already processed is
//!   acked without running the handler (its `ack` records the id first, then acks, so a
//!   crash before the ack makes the redelivery a skip);
//! - `INSERT OR IGNORE` on the message id, in the ledger's own transaction, for what the
//!   layer does not cover (two copies of one message running at the same time, a crash
//!   between the commit and the mark).
//!
//! It checks both against the broker: a duplicate publish is acked by the layer without
//! running the handler, and a duplicate whose mark was lost runs the handler, which finds
//! its row already committed and adds nothing. Then hostile input: a deposit that is not
//! JSON is parked at once with reason `decode`, and a deposit that makes the handler panic
//! is retried once and parked (`max-attempts`, error kind `panic`). Neither is requeued in
//! a loop nor acked unprocessed, and the ledger is unchanged by them.
//!
//! Run with:
//!
//! ```sh
//! scripts/broker start --version 3
//! RABBITKIT_URL=$(scripts/broker url --version 3) cargo run -p rabbitkit-examples --bin manual_sqlite
//! ```

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rabbitkit::idempotency::{IdempotencyStore, IdempotentLayer, StoreFuture};
use rabbitkit::prelude::*;
use rabbitkit::{Failure, Parking};
use rabbitkit_examples::{check, init_logging, url, wait_for};
use rusqlite::Connection;
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct Deposit {
    account: String,
    cents: i64,
}

/// The database, shared by all deliveries (SQLite wants one writer at a time).
#[derive(Clone)]
struct Db(Arc<Mutex<Connection>>);

impl Db {
    /// Runs `f` on the connection off the async runtime.
    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, BoxError> {
        let db = self.0.clone();
        let r = tokio::task::spawn_blocking(move || {
            let mut conn = db.lock().map_err(|_| rusqlite::Error::InvalidQuery)?;
            f(&mut conn)
        })
        .await?;
        Ok(r?)
    }
}

/// Processed message ids, in the same database as the ledger: the dedup layer's store.
struct SqliteStore(Db);

impl IdempotencyStore for SqliteStore {
    fn seen<'a>(&'a self, key: &'a str) -> StoreFuture<'a, bool> {
        let key = key.to_owned();
        Box::pin(self.0.with(move |c| {
            c.query_row(
                "SELECT COUNT(*) FROM processed WHERE message_id = ?1",
                [&key],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n > 0)
        }))
    }

    fn mark<'a>(&'a self, key: &'a str) -> StoreFuture<'a, ()> {
        let key = key.to_owned();
        Box::pin(self.0.with(move |c| {
            c.execute(
                "INSERT OR IGNORE INTO processed (message_id) VALUES (?1)",
                [&key],
            )
            .map(|_| ())
        }))
    }
}

/// How often the handler body ran (the skipped duplicate does not count).
static RUNS: AtomicU32 = AtomicU32::new(0);

/// Records a deposit once per message id, then acks. One delivery at a time, so the
/// duplicate below arrives after the first copy was marked (running at once, both copies
/// would miss the store, and `INSERT OR IGNORE` would be what saves the ledger).
#[subscriber(
    queue = "example.ledger",
    exchange = "example",
    routing_key = "deposit.*",
    ack = "manual",
    concurrency = 1,
    retry = ["200ms"],
    max_attempts = 2
)]
async fn record(
    settle: Settle,
    MessageId(id): MessageId,
    Json(d): Json<Deposit>,
    State(db): State<Db>,
) -> Result<(), BoxError> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    if d.account == "corrupt" {
        // A bug that only this deposit triggers: the runtime catches the panic and retries
        // the message, then parks it; the ledger never sees it.
        panic!("ledger invariant broken by deposit {id:?}");
    }
    let Some(id) = id else {
        // Without a key there is no idempotency: park it for a human, with the reason.
        settle
            .park(Failure::new(
                "missing-message-id",
                "deposits need a message id",
            ))
            .await;
        return Ok(());
    };
    let key = id.clone();
    let inserted = db
        .with(move |conn| {
            let tx = conn.transaction()?;
            let n = tx.execute(
                "INSERT OR IGNORE INTO deposits (message_id, account, cents) VALUES (?1, ?2, ?3)",
                (&key, &d.account, d.cents),
            )?;
            tx.commit()?;
            Ok(n == 1)
        })
        .await;
    match inserted {
        // Committed (or already there): now, and only now, ack.
        Ok(fresh) => {
            let report = settle.ack().await;
            println!(
                "deposit {id}: {} -> {report:?}",
                if fresh {
                    "inserted"
                } else {
                    "duplicate, skipped"
                }
            );
        }
        // The database said no: retry through the delay tiers, the ack waits.
        Err(e) => {
            let report = settle.retry(Failure::error(e.to_string())).await;
            println!("deposit {id}: database error {e} -> {report:?}");
        }
    }
    Ok(())
}

fn open(path: &PathBuf) -> rusqlite::Result<Connection> {
    let _ = std::fs::remove_file(path);
    let conn = Connection::open(path)?;
    conn.execute_batch(
        "CREATE TABLE deposits (message_id TEXT PRIMARY KEY, account TEXT NOT NULL, cents INTEGER NOT NULL);
         CREATE TABLE processed (message_id TEXT PRIMARY KEY);",
    )?;
    Ok(conn)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    init_logging();
    let path = std::env::temp_dir().join(format!(
        "rabbitkit-example-ledger-{}.sqlite",
        std::process::id()
    ));
    let db = Db(Arc::new(Mutex::new(open(&path)?)));
    let worker = Worker::new(ConnectionConfig::new(url()))
        .subscribe(record::subscriber().layer(IdempotentLayer::new(SqliteStore(db.clone()))))
        .state(db.clone())
        .start()
        .await?;
    // dep-2 is published twice, as a retrying producer would.
    for (id, cents) in [
        ("dep-1", 500),
        ("dep-2", 1200),
        ("dep-2", 1200),
        ("dep-3", 75),
    ] {
        let d = Deposit {
            account: "acme".into(),
            cents,
        };
        let msg = Envelope::json("example", "deposit.new", &d)?.message_id(id);
        check(
            worker.publisher().publish(msg).await?.is_confirmed(),
            &format!("{id} published"),
        )?;
    }
    wait_for(&worker, record::NAME, Duration::from_secs(30), |s| {
        s.acked >= 4
    })
    .await?;
    check(
        RUNS.load(Ordering::SeqCst) == 3,
        "the duplicate was acked by the dedup layer without running the handler",
    )?;
    // A crash after the ledger commit but before the mark: the id is not in `processed`,
    // so the redelivery runs the handler, and `INSERT OR IGNORE` is what keeps the ledger
    // right. Simulated by forgetting dep-1's mark and publishing dep-1 again.
    db.with(|c| c.execute("DELETE FROM processed WHERE message_id LIKE 'dep-1#%'", []))
        .await?;
    let again = Deposit {
        account: "acme".into(),
        cents: 500,
    };
    let msg = Envelope::json("example", "deposit.new", &again)?.message_id("dep-1");
    check(
        worker.publisher().publish(msg).await?.is_confirmed(),
        "dep-1 published again",
    )?;
    wait_for(&worker, record::NAME, Duration::from_secs(30), |s| {
        s.acked >= 5
    })
    .await?;
    // Hostile input: a body that is not JSON, and a deposit that panics the handler.
    let poison = Envelope::new("example", "deposit.new", "not json")
        .content_type("application/json")
        .message_id("dep-poison");
    let corrupt = Deposit {
        account: "corrupt".into(),
        cents: 1,
    };
    for msg in [
        poison,
        Envelope::json("example", "deposit.new", &corrupt)?.message_id("dep-corrupt"),
    ] {
        check(
            worker.publisher().publish(msg).await?.is_confirmed(),
            "hostile deposit published",
        )?;
    }
    // Poison: parked (1 ack); corrupt: retried (1 ack), then parked (1 ack).
    let stats = wait_for(&worker, record::NAME, Duration::from_secs(30), |s| {
        s.acked >= 8
    })
    .await?;
    worker.shutdown().await;
    let parking = Parking::new(ConnectionConfig::new(url()), "example.ledger")?;
    let mut parked: Vec<(Option<String>, Option<String>, Option<String>)> = parking
        .peek(10)
        .await?
        .into_iter()
        .map(|m| {
            let id = m.message_id().map(str::to_owned);
            (id, m.reason, m.error_kind)
        })
        .collect();
    parked.sort();
    let purged = parking.purge().await?;
    parking.close().await;
    println!("parked: {parked:?}");
    check(
        parked
            == vec![
                (
                    Some("dep-corrupt".into()),
                    Some("max-attempts".into()),
                    Some("panic".into()),
                ),
                (
                    Some("dep-poison".into()),
                    Some("decode".into()),
                    Some("decode".into()),
                ),
            ]
            && purged == 2,
        "poison parked as decode at once, the panicking deposit parked after its retry",
    )?;
    check(
        stats.requeued == 0 && stats.retried == 1 && stats.panics == 2,
        "nothing requeued in a loop; one retry of the panicking deposit",
    )?;
    let (rows, total, marks): (i64, i64, i64) = db
        .with(|c| {
            c.query_row(
                "SELECT COUNT(*), COALESCE(SUM(cents), 0), (SELECT COUNT(*) FROM processed) FROM deposits",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
        })
        .await?;
    let runs = RUNS.load(Ordering::SeqCst);
    println!(
        "counters: {stats:?}; rows: {rows}, total cents: {total}, marks: {marks}, handler runs: {runs}"
    );
    check(
        stats.acked == 8,
        "five deposits acked after their commit, three hostile deliveries after their copies",
    )?;
    check(
        runs == 6,
        "the unmarked duplicate ran the handler, which found its row already committed (and the panicking deposit ran twice)",
    )?;
    check(
        rows == 3 && total == 1775,
        "three rows: neither duplicate had a second effect",
    )?;
    // Two marks per processed message (the key, and the id's own mark): see
    // `idempotency::KeyBy`.
    check(marks == 6, "the unmarked duplicate marked dep-1 again")?;
    let _ = std::fs::remove_file(&path);
    Ok(())
}
