use rabbitkit::prelude::*;

#[subscriber(queue = "orders", jitter)]
async fn orders(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

fn main() {}
