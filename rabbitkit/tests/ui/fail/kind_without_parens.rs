use rabbitkit::prelude::*;

#[subscriber(queue = "orders", on_kind = "inventory")]
async fn orders(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

fn main() {}
