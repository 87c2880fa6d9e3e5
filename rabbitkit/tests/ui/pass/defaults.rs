//! Only the queue: the name defaults to the function name, everything else to the builder's
//! defaults; the function stays callable as `orders::handler`.
use rabbitkit::prelude::*;

#[subscriber(queue = "orders")]
async fn orders(Body(body): Body) -> Result<(), BoxError> {
    let _ = body.len();
    Ok(())
}

fn main() {
    let by_hand = Subscriber::new("orders", orders::handler).name("orders");
    let generated = orders::subscriber();
    assert_eq!(format!("{generated:?}"), format!("{by_hand:?}"));
    assert_eq!(orders::NAME, "orders");
    let _future = orders::handler(Body(Default::default()));
}
