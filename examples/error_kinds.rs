//! Error kinds and a retry policy by kind: the README's "Error kinds" example, run against
//! the broker. A typed error enum names its kinds; `validation` is parked at once,
//! `inventory` retries on its own schedule, everything else follows the default.
//!
//! Run with:
//!
//! ```sh
//! scripts/broker start --version 3
//! RABBITKIT_URL=$(scripts/broker url --version 3) cargo run -p rabbitkit-examples --bin error_kinds
//! ```

use std::borrow::Cow;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use rabbitkit::kind::{ErrorKind, KindPolicy};
use rabbitkit::prelude::*;
use rabbitkit_examples::{check, init_logging, url, wait_for};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct Payment {
    id: u32,
    sku: String,
}

/// What charging can fail with; each variant has a kind.
#[derive(Debug)]
enum ChargeError {
    /// The order names no product: retrying cannot help.
    Invalid,
    /// The warehouse is out of stock for now.
    OutOfStock,
}

impl std::fmt::Display for ChargeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ChargeError::Invalid => "the payment names no product",
            ChargeError::OutOfStock => "out of stock",
        })
    }
}

impl std::error::Error for ChargeError {}

impl ErrorKind for ChargeError {
    const KINDS: &'static [&'static str] = &["validation", "inventory"];
    fn kind(&self) -> Cow<'static, str> {
        match self {
            ChargeError::Invalid => "validation".into(),
            ChargeError::OutOfStock => "inventory".into(),
        }
    }
}

/// Stock arrives after the first try.
static STOCK_CHECKS: AtomicU32 = AtomicU32::new(0);

// `error_kind` registers the type whose `KINDS` the `on_kind` policies below name: a policy
// for a kind nothing produces is refused at start.
#[subscriber(
    queue = "example.kinds.payments",
    retry = ["30s"],
    max_attempts = 3,
    error_kind = ChargeError
)]
async fn charge(Json(p): Json<Payment>, attempt: Attempt) -> Result<(), ChargeError> {
    if p.sku.is_empty() {
        return Err(ChargeError::Invalid);
    }
    if p.sku == "backorder" && STOCK_CHECKS.fetch_add(1, Ordering::SeqCst) == 0 {
        return Err(ChargeError::OutOfStock);
    }
    println!("charged payment {} on attempt {}", p.id, attempt.number);
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    init_logging();
    // The attribute's policy, extended by kind: `validation` parks at once, `inventory`
    // waits 200 ms (its own tier) up to 5 attempts; other errors wait 30 s.
    let payments = charge::subscriber()
        .on_kind("validation", KindPolicy::park())
        .on_kind(
            "inventory",
            KindPolicy::tiers([Duration::from_millis(200)]).max_attempts(5),
        );
    let worker = Worker::new(ConnectionConfig::new(url()))
        .subscribe(payments)
        .start()
        .await?;
    let parked_before = worker.stats(charge::NAME).map_or(0, |s| s.parked);
    for (id, sku) in [(1, "book"), (2, ""), (3, "backorder")] {
        let msg = Envelope::json(
            "",
            charge::QUEUE,
            &Payment {
                id,
                sku: sku.into(),
            },
        )?;
        check(
            worker.publisher().publish(msg).await?.is_confirmed(),
            &format!("payment {id} confirmed"),
        )?;
    }
    let stats = wait_for(&worker, charge::NAME, Duration::from_secs(20), |s| {
        s.acked >= 4 && s.parked > parked_before
    })
    .await?;
    worker.shutdown().await;
    check(
        stats.retried == 1,
        "the out-of-stock payment was retried once, after 200 ms",
    )?;
    check(
        stats.parked == parked_before + 1,
        "the invalid payment was parked at once, not retried",
    )?;
    Ok(())
}
