use rabbitkit::prelude::*;

#[subscriber(
    queue = "orders",
    on_kind("inventory", max_attempts = 3),
    on_kind("inventory", park = true)
)]
async fn orders(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

fn main() {}
