use rabbitkit::prelude::*;

#[subscriber(queue = "orders", exchange = "shop", routing_key = "a", routing_keys = ["b"])]
async fn orders(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

fn main() {}
