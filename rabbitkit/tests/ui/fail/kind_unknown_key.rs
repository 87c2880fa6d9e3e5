use rabbitkit::prelude::*;

#[subscriber(queue = "orders", on_kind("inventory", tiers = ["30s"]))]
async fn orders(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

fn main() {}
