use rabbitkit::prelude::*;

#[subscriber(queue = "orders", retry = [], max_attempts = 3)]
async fn orders(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

fn main() {}
