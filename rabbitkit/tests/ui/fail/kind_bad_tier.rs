use rabbitkit::prelude::*;

#[subscriber(queue = "orders", on_kind("inventory", retry = ["0s"], max_attempts = 0))]
async fn orders(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

fn main() {}
