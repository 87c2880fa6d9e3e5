//! A `#[subscriber]` function registered by name: the config's keys override what the
//! attribute set, and the attribute's values stay where the config says nothing.
#![allow(clippy::unwrap_used, missing_docs)]

use rabbitkit::config::{Handlers, WorkerConfig};
use rabbitkit::prelude::*;

#[subscriber(queue = "payments", retry = ["1s"], max_attempts = 3, prefetch = 7)]
async fn charge(Body(_body): Body) -> Result<(), BoxError> {
    Ok(())
}

#[test]
fn a_subscriber_function_registers_by_name_and_the_config_overrides_it() {
    let cfg = WorkerConfig::from_toml(
        r#"
        [connection]
        url = "amqp://app:s3cret@rabbit/%2f"
        [[subscribers]]
        handler = "charge"
        queue = "payments-eu"
        concurrency = 2
        "#,
    )
    .unwrap();
    let handlers = Handlers::new().subscriber("charge", charge);
    let worker = rabbitkit::worker::from_config(&cfg, &handlers).unwrap();
    // The worker's Debug is the one public view of a built subscriber's settings.
    let debug = format!("{worker:?}");
    for want in [
        r#"name: "payments-eu""#,
        r#"queue: "payments-eu""#,
        "max_attempts: 3",
        "prefetch: 7",
        "concurrency: 2",
        "app:***@rabbit",
    ] {
        assert!(debug.contains(want), "{want} missing in {debug}");
    }
    assert!(!debug.contains("s3cret"), "{debug}");
}
