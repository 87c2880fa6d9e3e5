use rabbitkit::prelude::*;

// A parameter that is no extractor: the error names the Handler bound, not macro internals.
#[subscriber(queue = "orders")]
async fn orders(n: u32) -> Result<(), BoxError> {
    let _ = n;
    Ok(())
}

fn main() {}
