use rabbitkit::prelude::*;

#[subscriber(queue = "orders")]
async fn orders(settle: Settle) -> Result<(), BoxError> {
    let _ = settle;
    Ok(())
}

fn main() {}
