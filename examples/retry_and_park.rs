//! Retry and park: delay tiers, an attempt limit, permanent errors, an undecodable payload,
//! and the parking queue's evidence — then a replay once the cause is fixed.
//!
//! Four payments go in. `ok` succeeds at once; `flaky` fails on its first attempt and
//! succeeds from the 200 ms tier; `broken` fails every attempt and is parked after the third;
//! `fraud` fails permanently and is parked at once; a body that is not JSON is parked
//! without the handler running. Every retry and parking copy is confirmed by the broker
//! before the original is acked.
//!
//! Run with:
//!
//! ```sh
//! scripts/broker start --version 3
//! RABBITKIT_URL=$(scripts/broker url --version 3) cargo run -p rabbitkit-examples --bin retry_and_park
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rabbitkit::prelude::*;
use rabbitkit::{Error, Parking};
use rabbitkit_examples::{check, init_logging, url, wait_for};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct Payment {
    id: u32,
    kind: String,
}

/// Whether the downstream fault behind `broken` has been fixed (flipped before the replay).
#[derive(Clone, Default)]
struct Fixed(Arc<AtomicBool>);

/// Charges a payment; fails the way its `kind` says.
#[subscriber(
    queue = "example.payments",
    exchange = "example",
    routing_key = "payment.*",
    retry = ["200ms", "1s"],
    max_attempts = 3,
    deadline = "5s"
)]
async fn charge(
    Json(p): Json<Payment>,
    attempt: Attempt,
    State(fixed): State<Fixed>,
) -> Result<(), BoxError> {
    println!("payment {} ({}) attempt {}", p.id, p.kind, attempt.number);
    match p.kind.as_str() {
        "flaky" if attempt.number < 2 => Err("gateway timeout".into()),
        "broken" if !fixed.0.load(Ordering::SeqCst) => Err("ledger unavailable".into()),
        "fraud" => Err(Permanent::new("card reported stolen").into()),
        _ => Ok(()),
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    init_logging();
    let fixed = Fixed::default();
    let worker = Worker::new(ConnectionConfig::new(url()))
        .subscribe(charge)
        .state(fixed.clone())
        .start()
        .await?;
    // A fresh run: forget what earlier runs parked.
    let parking = Parking::new(ConnectionConfig::new(url()), charge::QUEUE)?;
    match parking.purge().await {
        Ok(n) if n > 0 => println!("purged {n} messages parked by an earlier run"),
        Ok(_) | Err(Error::Topology(_)) => {}
        Err(e) => return Err(e.into()),
    }

    let publisher = worker.publisher();
    for (id, kind) in [(1, "ok"), (2, "flaky"), (3, "broken"), (4, "fraud")] {
        let p = Payment {
            id,
            kind: kind.into(),
        };
        let msg = Envelope::json("example", "payment.new", &p)?.message_id(format!("pay-{id}"));
        check(
            publisher.publish(msg).await?.is_confirmed(),
            &format!("payment {id} published"),
        )?;
    }
    let poison =
        Envelope::new("example", "payment.new", &b"{not json"[..]).message_id("pay-poison");
    check(
        publisher.publish(poison).await?.is_confirmed(),
        "poison published",
    )?;

    let stats = wait_for(&worker, charge::NAME, Duration::from_secs(30), |s| {
        s.parked >= 3 && s.acked >= 5
    })
    .await?;
    println!("counters: {stats:?}");
    check(
        stats.retried == 3,
        "three retries: flaky once, broken twice",
    )?;
    check(stats.parked == 3, "three parked: broken, fraud, poison")?;

    println!("\nthe parking queue {}:", parking.queue());
    let parked = parking.peek(10).await?;
    for m in &parked {
        println!(
            "  {:<11} reason={:<13} attempts={} error={:?} route={}/{} body={}",
            m.properties
                .message_id()
                .as_ref()
                .map_or("-", |s| s.as_str()),
            m.reason.as_deref().unwrap_or("-"),
            m.attempts.unwrap_or(0),
            m.error_message.as_deref().unwrap_or("-"),
            m.original_exchange.as_deref().unwrap_or("-"),
            m.original_routing_key.as_deref().unwrap_or("-"),
            String::from_utf8_lossy(&m.body),
        );
    }
    check(
        parked.len() == 3,
        "peek shows the three parked messages and removes none",
    )?;
    let reasons: Vec<_> = parked.iter().filter_map(|m| m.reason.clone()).collect();
    check(
        reasons.iter().any(|r| r == "max-attempts") && reasons.iter().any(|r| r == "permanent"),
        "reasons recorded: max-attempts and permanent",
    )?;

    // The ledger is back: replay. Each parked message is acked only after its copy is
    // confirmed in the work queue; it starts again at attempt 1.
    fixed.0.store(true, Ordering::SeqCst);
    let acked_before = stats.acked;
    let report = parking
        .replay_matching(usize::MAX, |m| m.reason.as_deref() == Some("max-attempts"))
        .await?;
    println!("replayed what ran out of attempts: {report:?}");
    check(
        report.replayed == 1 && report.remaining == 2,
        "one replayed, two still parked",
    )?;
    let after = wait_for(&worker, charge::NAME, Duration::from_secs(30), |s| {
        s.acked > acked_before
    })
    .await?;
    check(
        after.acked == acked_before + 1,
        "the replayed payment succeeded",
    )?;

    parking.close().await;
    worker.shutdown().await;
    Ok(())
}
