use rabbitkit::prelude::*;

#[subscriber(queue = "orders")]
async fn orders<T: Send>(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

fn main() {}
