//! One mistake in the attribute is one error: uses of the function as the expansion defines
//! it (`Worker::subscribe`, `::subscriber()`, `::handler`, `::QUEUE`) still type-check.
use rabbitkit::prelude::*;

#[subscriber(queue = "orders", prefetch = 0)]
async fn orders(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

fn main() {
    let _worker = Worker::new(ConnectionConfig::new("amqp://localhost")).subscribe(orders);
    let _sub: Subscriber = orders::subscriber();
    let _future = orders::handler(Body(Default::default()));
    let _queue: &str = orders::QUEUE;
}
