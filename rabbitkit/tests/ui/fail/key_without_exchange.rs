use rabbitkit::prelude::*;

#[subscriber(queue = "orders", routing_key = "order.*")]
async fn orders(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

fn main() {}
