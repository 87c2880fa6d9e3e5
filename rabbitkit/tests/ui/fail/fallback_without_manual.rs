use rabbitkit::prelude::*;

#[subscriber(queue = "orders", manual_fallback = "ack")]
async fn orders(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

fn main() {}
