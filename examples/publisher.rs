//! The confirmed publisher on its own: every publish ends in an outcome, and only
//! `Confirmed` means the broker has the message. Unroutable messages come back as
//! `Returned` (mandatory is the default), bad input is a typed error before anything is sent.
//!
//! Run with:
//!
//! ```sh
//! scripts/broker start --version 3
//! RABBITKIT_URL=$(scripts/broker url --version 3) cargo run -p rabbitkit-examples --bin publisher
//! ```

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use rabbitkit::prelude::*;
use rabbitkit::{Error, PublisherConfig};
use rabbitkit_examples::{check, init_logging, url};

/// The inbox the published messages land in (declared by subscribing to it).
#[subscriber(queue = "example.inbox")]
async fn inbox(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    init_logging();
    let worker = Worker::new(ConnectionConfig::new(url()))
        .subscribe(inbox)
        .start()
        .await?;

    let cfg = PublisherConfig {
        max_in_flight: 64,
        confirm_timeout: Duration::from_secs(10),
        ..PublisherConfig::default()
    };
    let publisher = Publisher::new(ConnectionConfig::new(url()), cfg)?;

    // Many at once: `publish_many` keeps up to `max_in_flight` unconfirmed and yields
    // `(index, outcome)` as confirms arrive.
    let start = Instant::now();
    let envelopes = (0..2_000).map(|i| Envelope::new("", inbox::QUEUE, format!("message {i}")));
    let outcomes: Vec<_> = publisher.publish_many(envelopes).collect().await;
    let confirmed = outcomes
        .iter()
        .filter(|(_, o)| matches!(o, Ok(o) if o.is_confirmed()))
        .count();
    println!(
        "2000 published in {:?}: {confirmed} confirmed",
        start.elapsed()
    );
    check(confirmed == 2_000, "all 2000 confirmed")?;

    // One with properties and headers (the README's publisher snippet).
    use rabbitkit::amqp::AMQPValue;
    let order = Envelope::json("", inbox::QUEUE, &serde_json::json!({ "id": 7 }))?
        .message_id("order-7")
        .correlation_id("checkout-42")
        .header("tenant", AMQPValue::LongString("acme".into()))
        .header("priority", AMQPValue::LongInt(2));
    match publisher.publish(order).await? {
        PublishOutcome::Confirmed { latency } => println!("order-7 confirmed in {latency:?}"),
        other => return Err(format!("order-7 not confirmed: {other:?}").into()),
    }
    let raw = Envelope::new("", inbox::QUEUE, "plain bytes");
    check(
        publisher.publish(raw).await?.is_confirmed(),
        "a raw envelope is confirmed",
    )?;

    // No queue is bound to this key: with mandatory=true the broker returns it.
    let lost = publisher
        .publish(Envelope::new("", "example.nobody-listens", "hello?"))
        .await?;
    println!("unroutable: {lost:?}");
    check(
        matches!(lost, PublishOutcome::Returned { .. }),
        "an unroutable message is Returned, not confirmed",
    )?;

    // Too big: refused before it reaches the wire, typed.
    let huge = Envelope::new("", inbox::QUEUE, vec![0u8; publisher.config().max_body + 1]);
    let refused = publisher.publish(huge).await;
    println!("oversized: {refused:?}");
    check(
        matches!(refused, Err(Error::BodyTooLarge { .. })),
        "an oversized body is a typed error",
    )?;

    println!("publisher stats: {:?}", publisher.stats());
    publisher.close(Duration::from_secs(5)).await;
    worker.shutdown().await;
    Ok(())
}
