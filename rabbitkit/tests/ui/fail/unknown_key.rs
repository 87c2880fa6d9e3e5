use rabbitkit::prelude::*;

#[subscriber(queue = "orders", prefech = 10)]
async fn orders(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

fn main() {
    // The function is still emitted: no second error here.
    let _f = orders;
}
