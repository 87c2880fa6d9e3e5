//! Manual acks with a fallback; several routing keys; no retries.
use rabbitkit::prelude::*;

#[subscriber(
    queue = "ledger",
    exchange = "bank",
    routing_keys = ["tx.created", "tx.reversed"],
    ack = "manual",
    manual_fallback = "reject",
    retry = [],
)]
async fn ledger(settle: Settle, MessageId(id): MessageId) -> Result<(), BoxError> {
    let _ = id;
    let report = settle.ack().await;
    let _ = report;
    Ok(())
}

fn main() {
    let by_hand = Subscriber::new("ledger", ledger::handler)
        .name("ledger")
        .bind("bank", "tx.created")
        .bind("bank", "tx.reversed")
        .ack_policy(AckPolicy::Manual)
        .manual_fallback(rabbitkit::ManualFallback::Reject)
        .retry(RetryPolicy::none());
    assert_eq!(format!("{:?}", ledger::subscriber()), format!("{by_hand:?}"));
    assert_eq!(ledger::subscriber().topology().bindings.len(), 2);
}
