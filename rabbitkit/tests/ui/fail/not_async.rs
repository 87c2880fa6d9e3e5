use rabbitkit::prelude::*;

#[subscriber(queue = "orders")]
fn orders(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

fn main() {}
