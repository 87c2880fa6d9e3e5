use rabbitkit::prelude::*;

#[subscriber(queue = "orders", on_kind("out of stock", park = true))]
async fn orders(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

fn main() {}
