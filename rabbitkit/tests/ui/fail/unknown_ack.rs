use rabbitkit::prelude::*;

#[subscriber(queue = "orders", ack = "sometimes")]
async fn orders(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

fn main() {}
