use rabbitkit::prelude::*;

#[subscriber(queue = "orders", error_kind = "ChargeError")]
async fn orders(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

fn main() {}
