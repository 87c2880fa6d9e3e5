//! The facade under another name, through `crate = "..."`; a worker registers the value.
extern crate rabbitkit as rk;

#[rk::subscriber(queue = "audit", crate = "rk", max_attempts = 3)]
async fn audit(rk::extract::Body(_b): rk::extract::Body) -> Result<(), rk::BoxError> {
    Ok(())
}

fn main() {
    let expected = rk::RetryPolicy::default().max_attempts(3);
    let by_hand = rk::Subscriber::new("audit", audit::handler).name("audit").retry(expected);
    assert_eq!(format!("{:?}", audit::subscriber()), format!("{by_hand:?}"));
    let _worker = rk::Worker::new(rk::ConnectionConfig::new("amqp://127.0.0.1:5672/%2f")).subscribe(audit);
}
