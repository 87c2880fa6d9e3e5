//! Hello, subscriber: one `#[subscriber]` handler, the worker's confirmed publisher, and a
//! clean shutdown.
//!
//! Run with:
//!
//! ```sh
//! scripts/broker start --version 3
//! RABBITKIT_URL=$(scripts/broker url --version 3) cargo run -p rabbitkit-examples --bin hello
//! ```

use std::time::Duration;

use rabbitkit::prelude::*;
use rabbitkit_examples::{check, init_logging, url, wait_for};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct Greeting {
    name: String,
}

/// Greets whoever arrives on `greeting.*`.
#[subscriber(
    queue = "example.hello",
    exchange = "example",
    routing_key = "greeting.*",
    prefetch = 20
)]
async fn greet(Json(g): Json<Greeting>, RoutingKey(key): RoutingKey) -> Result<(), BoxError> {
    println!("hello, {} (routing key {key})", g.name);
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    init_logging();
    // `start` declares the topology (exchange, queue, retry tiers, parking) and consumes.
    let worker = Worker::new(ConnectionConfig::new(url()))
        .subscribe(greet)
        .start()
        .await?;
    for name in ["Ada", "Grace", "Barbara"] {
        let msg = Envelope::json("example", "greeting.new", &Greeting { name: name.into() })?;
        let outcome = worker.publisher().publish(msg).await?;
        check(
            outcome.is_confirmed(),
            &format!("greeting for {name} confirmed"),
        )?;
    }
    let stats = wait_for(&worker, greet::NAME, Duration::from_secs(30), |s| {
        s.acked >= 3
    })
    .await?;
    let report = worker.shutdown().await;
    check(stats.acked >= 3, "three greetings handled and acked")?;
    println!("shut down cleanly: {report:?}");
    Ok(())
}
