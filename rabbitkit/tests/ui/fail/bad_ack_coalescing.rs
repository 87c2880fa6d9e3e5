use rabbitkit::prelude::*;

#[subscriber(queue = "orders", ack_coalescing = (0, "5ms"))]
async fn no_acks(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

#[subscriber(queue = "orders", ack_coalescing = (8, "2s"))]
async fn too_long(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

#[subscriber(queue = "orders", ack_coalescing = 8)]
async fn not_a_pair(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

#[subscriber(queue = "orders", prefetch = 4, ack_coalescing = (8, "5ms"))]
async fn over_prefetch(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

#[subscriber(queue = "orders", ack = "ack-first", ack_coalescing = (8, "5ms"))]
async fn ack_first(Body(_b): Body) -> Result<(), BoxError> {
    Ok(())
}

fn main() {}
