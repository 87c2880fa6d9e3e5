use rabbitkit::prelude::*;

#[subscriber(queue = "orders", retry = ["100us"])]
async fn orders(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

fn main() {}
