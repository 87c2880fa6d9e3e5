use rabbitkit::prelude::*;

#[subscriber(queue = "orders", prefetch = 0)]
async fn orders(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

fn main() {}
