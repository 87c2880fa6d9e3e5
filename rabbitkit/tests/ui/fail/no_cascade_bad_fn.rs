//! A function the attribute cannot take (not async) is one error too, uses included.
use rabbitkit::prelude::*;

#[subscriber(queue = "orders")]
fn orders(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

fn main() {
    let _worker = Worker::new(ConnectionConfig::new("amqp://localhost")).subscribe(orders);
}
