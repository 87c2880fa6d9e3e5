//! `error_kind` names a type that does not implement `ErrorKind`: the error points at it.
use rabbitkit::prelude::*;

#[subscriber(queue = "orders", error_kind = std::io::Error)]
async fn orders(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

fn main() {}
