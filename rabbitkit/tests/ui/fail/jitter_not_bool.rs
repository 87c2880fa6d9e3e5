use rabbitkit::prelude::*;

#[subscriber(queue = "orders", jitter = 1)]
async fn orders(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

fn main() {}
