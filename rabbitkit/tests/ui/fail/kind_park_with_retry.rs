use rabbitkit::prelude::*;

#[subscriber(queue = "orders", on_kind("validation", park = true, max_attempts = 3))]
async fn orders(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

fn main() {}
