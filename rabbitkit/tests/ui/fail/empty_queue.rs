use rabbitkit::prelude::*;

#[subscriber(queue = "")]
async fn orders(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

fn main() {}
