use rabbitkit::prelude::*;

#[subscriber(queue = "orders", tier_queue_type = "stream")]
async fn orders(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

fn main() {}
