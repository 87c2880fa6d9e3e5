use rabbitkit::prelude::*;

#[subscriber(queue = "orders", exchange = "shop")]
async fn orders(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

fn main() {}
