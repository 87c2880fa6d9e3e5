//! Manual acks for a database-backed handler: an idempotent insert keyed by the message id
//! in SQLite, committed **before** the ack. A redelivery (or a duplicate publish) finds the
//! row already there and is acked without a second effect.
//!
//! Run with:
//!
//! ```sh
//! scripts/broker start --version 3
//! RABBITKIT_URL=$(scripts/broker url --version 3) cargo run -p rabbitkit-examples --bin manual_sqlite
//! ```

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rabbitkit::Failure;
use rabbitkit::prelude::*;
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

/// Records a deposit once per message id, then acks.
#[subscriber(
    queue = "example.ledger",
    exchange = "example",
    routing_key = "deposit.*",
    ack = "manual"
)]
async fn record(
    settle: Settle,
    MessageId(id): MessageId,
    Json(d): Json<Deposit>,
    State(db): State<Db>,
) -> Result<(), BoxError> {
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
    let inserted = tokio::task::spawn_blocking(move || -> rusqlite::Result<bool> {
        let mut conn = db.0.lock().map_err(|_| rusqlite::Error::InvalidQuery)?;
        let tx = conn.transaction()?;
        let n = tx.execute(
            "INSERT OR IGNORE INTO deposits (message_id, account, cents) VALUES (?1, ?2, ?3)",
            (&key, &d.account, d.cents),
        )?;
        tx.commit()?;
        Ok(n == 1)
    })
    .await?;
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
        "CREATE TABLE deposits (message_id TEXT PRIMARY KEY, account TEXT NOT NULL, cents INTEGER NOT NULL);",
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
        .subscribe(record)
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
    let stats = wait_for(&worker, record::NAME, Duration::from_secs(30), |s| {
        s.acked >= 4
    })
    .await?;
    worker.shutdown().await;
    let (rows, total): (i64, i64) = {
        let conn = db.0.lock().map_err(|_| "database lock poisoned")?;
        conn.query_row(
            "SELECT COUNT(*), COALESCE(SUM(cents), 0) FROM deposits",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?
    };
    println!("counters: {stats:?}; rows: {rows}, total cents: {total}");
    check(
        stats.acked == 4,
        "four deliveries acked, each after its commit",
    )?;
    check(
        rows == 3 && total == 1775,
        "three rows: the duplicate had no second effect",
    )?;
    let _ = std::fs::remove_file(&path);
    Ok(())
}
