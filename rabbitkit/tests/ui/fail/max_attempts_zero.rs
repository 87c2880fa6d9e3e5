use rabbitkit::prelude::*;

#[subscriber(queue = "orders", max_attempts = 0)]
async fn orders(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

fn main() {}
