use rabbitkit::prelude::*;

#[subscriber(queue = "orders", queue_type = "stream")]
async fn orders(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

fn main() {}
