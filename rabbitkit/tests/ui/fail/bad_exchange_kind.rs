use rabbitkit::prelude::*;

#[subscriber(queue = "orders", exchange = "shop", routing_key = "k", exchange_kind = "fan-out")]
async fn orders(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

fn main() {}
