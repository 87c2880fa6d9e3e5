//! Tower layers around a `#[subscriber]` handler: a per-delivery timeout and a concurrency
//! limit. A timed-out delivery is a failure like any other: retried through the tiers, then
//! parked with the timeout as its reason.
//!
//! Run with:
//!
//! ```sh
//! scripts/broker start --version 3
//! RABBITKIT_URL=$(scripts/broker url --version 3) cargo run -p rabbitkit-examples --bin tower_layers
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rabbitkit::prelude::*;
use rabbitkit::{Error, Parking};
use rabbitkit_examples::{check, init_logging, url, wait_for};
use tower::limit::ConcurrencyLimitLayer;
use tower::timeout::TimeoutLayer;

/// How many handlers run at once now, and the most seen.
#[derive(Clone, Default)]
struct Gauge {
    now: Arc<AtomicUsize>,
    max: Arc<AtomicUsize>,
}

/// Resizes an image; `slow` ones take longer than the timeout allows.
#[subscriber(queue = "example.images", prefetch = 20, retry = ["100ms"], max_attempts = 2)]
async fn resize(Body(body): Body, State(g): State<Gauge>) -> Result<(), BoxError> {
    let running = g.now.fetch_add(1, Ordering::SeqCst) + 1;
    g.max.fetch_max(running, Ordering::SeqCst);
    let work = if body.as_ref() == b"slow" { 2_000 } else { 50 };
    tokio::time::sleep(Duration::from_millis(work)).await;
    g.now.fetch_sub(1, Ordering::SeqCst);
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    init_logging();
    let gauge = Gauge::default();
    // The last layer added runs first: the limit admits two at a time, each gets 500 ms.
    let images = resize::subscriber()
        .layer(TimeoutLayer::new(Duration::from_millis(500)))
        .layer(ConcurrencyLimitLayer::new(2));
    let worker = Worker::new(ConnectionConfig::new(url()))
        .subscribe(images)
        .state(gauge.clone())
        .start()
        .await?;
    let parking = Parking::new(ConnectionConfig::new(url()), resize::QUEUE)?;
    match parking.purge().await {
        Ok(_) | Err(Error::Topology(_)) => {}
        Err(e) => return Err(e.into()),
    }
    for i in 0..8 {
        let body: &[u8] = if i == 3 { b"slow" } else { b"fast" };
        let msg = Envelope::new("", resize::QUEUE, body.to_vec());
        check(
            worker.publisher().publish(msg).await?.is_confirmed(),
            &format!("image {i} published"),
        )?;
    }
    let stats = wait_for(&worker, resize::NAME, Duration::from_secs(30), |s| {
        s.acked >= 8 && s.parked >= 1
    })
    .await?;
    println!(
        "counters: {stats:?}; most at once: {}",
        gauge.max.load(Ordering::SeqCst)
    );
    check(
        gauge.max.load(Ordering::SeqCst) <= 2,
        "never more than two handlers at once",
    )?;
    check(
        stats.retried == 1 && stats.parked == 1,
        "the slow image timed out, was retried once, then parked",
    )?;
    let parked = parking.peek(1).await?;
    let why = parked
        .first()
        .and_then(|m| m.error_message.clone())
        .unwrap_or_default();
    println!("parked with error: {why}");
    check(
        parked.len() == 1 && parked[0].body.as_ref() == b"slow",
        "the parked message is the slow one, body intact",
    )?;
    parking.close().await;
    worker.shutdown().await;
    Ok(())
}
