use rabbitkit::prelude::*;

#[subscriber(queue = "orders", concurrency = 0)]
async fn orders(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

fn main() {}
