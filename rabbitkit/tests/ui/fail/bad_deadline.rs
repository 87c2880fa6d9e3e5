use rabbitkit::prelude::*;

#[subscriber(queue = "orders", deadline = "soon")]
async fn orders(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

fn main() {}
