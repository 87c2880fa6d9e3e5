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

#[subscriber(
    queue = "payments",
    retry = ["1s", "30s"],
    max_attempts = 4,
    on_kind("validation", park = true),
    on_kind("inventory", retry = ["30s", "5m"], max_attempts = 10),
    on_kind("card", max_attempts = 2),
)]
async fn pay(Body(_body): Body) -> Result<(), BoxError> {
    Ok(())
}

#[test]
fn on_kind_in_the_attribute_is_the_policy_of_the_config_file_and_the_builder() {
    use rabbitkit::kind::KindPolicy;
    use std::time::Duration;
    let cfg = WorkerConfig::from_toml(
        r#"
        [connection]
        url = "amqp://rabbit/%2f"
        [[subscribers]]
        handler = "pay"
        queue = "payments"
        [subscribers.retry]
        tiers = ["1s", "30s"]
        max-attempts = 4
        [subscribers.retry.kinds.validation]
        park = true
        [subscribers.retry.kinds.inventory]
        tiers = ["30s", "5m"]
        max-attempts = 10
        [subscribers.retry.kinds.card]
        max-attempts = 2
        "#,
    )
    .unwrap();
    // Every key given: the registered policy is replaced whole.
    let from_file = cfg.subscribers[0]
        .retry
        .clone()
        .unwrap()
        .apply(RetryPolicy::none());
    let by_hand = RetryPolicy::new([Duration::from_secs(1), Duration::from_secs(30)])
        .max_attempts(4)
        .on_kind("validation", KindPolicy::park())
        .on_kind(
            "inventory",
            KindPolicy::tiers([Duration::from_secs(30), Duration::from_secs(300)]).max_attempts(10),
        )
        .on_kind("card", KindPolicy::default().max_attempts(2));
    assert_eq!(from_file, by_hand);
    let with = |policy: RetryPolicy| {
        format!(
            "{:?}",
            Subscriber::new("payments", pay::handler)
                .name("pay")
                .retry(policy)
        )
    };
    assert_eq!(format!("{:?}", pay::subscriber()), with(from_file));
    // The comparison sees the kinds: a policy without one of them differs.
    let mut without_card = by_hand;
    without_card.kinds.remove("card");
    assert_ne!(format!("{:?}", pay::subscriber()), with(without_card));
}
