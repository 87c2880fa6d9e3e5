use rabbitkit::prelude::*;

#[subscriber(queue = "orders", retry = ["1s", "5 parsecs"])]
async fn orders(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

fn main() {}
