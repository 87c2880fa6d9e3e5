use rabbitkit::prelude::*;

#[subscriber(queue = "orders")]
struct Orders;

fn main() {}
