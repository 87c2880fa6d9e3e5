//! Every key at once; the expansion equals the hand-written builder.
use rabbitkit::prelude::*;
use std::time::Duration;

/// Ships paid orders.
#[subscriber(
    queue = "shipping",
    name = "shipper",
    exchange = "shop",
    routing_key = "order.paid",
    exchange_kind = "direct",
    queue_type = "quorum",
    delivery_limit = 7,
    tier_queue_type = "classic",
    ack = "nack-on-error",
    requeue_limit = 9,
    retry = ["500ms", "30s", "5m"],
    max_attempts = 6,
    immediate_retries = 2,
    jitter = true,
    prefetch = 40,
    concurrency = 8,
    deadline = "20s",
    ack_coalescing = (16, "5ms"),
)]
async fn ship(Body(body): Body, RoutingKey(key): RoutingKey) -> Result<(), BoxError> {
    let _ = (body, key);
    Ok(())
}

fn main() {
    let by_hand = Subscriber::new("shipping", ship::handler)
        .name("shipper")
        .bind("shop", "order.paid")
        .exchange_kind("direct")
        .queue_type(QueueType::Quorum)
        .delivery_limit(7)
        .tier_queue_type(QueueType::Classic)
        .ack_policy(AckPolicy::NackOnError)
        .requeue_limit(9)
        .retry(
            RetryPolicy::new([
                Duration::from_millis(500),
                Duration::from_secs(30),
                Duration::from_secs(300),
            ])
            .max_attempts(6)
            .immediate_retries(2)
            .jitter(true),
        )
        .prefetch(40)
        .concurrency(8)
        .deadline(Duration::from_secs(20))
        .ack_coalescing(16, Duration::from_millis(5));
    let generated = rabbitkit::IntoSubscriber::into_subscriber(ship);
    assert_eq!(format!("{generated:?}"), format!("{by_hand:?}"));
    assert_eq!(ship::NAME, "shipper");
    assert_eq!(ship::QUEUE, "shipping");
    assert_eq!(generated.handler_name(), "shipper");
    assert_eq!(generated.topology().tier_queue_type, QueueType::Classic);
}
