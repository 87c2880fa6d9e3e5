use rabbitkit::prelude::*;

#[subscriber(queue = "orders", delivery_limit = 5)]
async fn orders(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

fn main() {}
