use rabbitkit::prelude::*;

#[subscriber(queue = "orders", prefetch = 10, prefetch = 20)]
async fn orders(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

fn main() {}
