//! `on_kind` alone sets the retry policy: the default schedule plus that kind, as by hand.
//! (The full form against a config file and the builder: `tests/config.rs`.)
use rabbitkit::kind::KindPolicy;
use rabbitkit::prelude::*;
use std::time::Duration;

#[subscriber(queue = "audit", on_kind("timeout", retry = ["5s"]), on_kind("bad.input", park = true))]
async fn audit(Body(_body): Body) -> Result<(), BoxError> {
    Ok(())
}

fn main() {
    let by_hand = Subscriber::new("audit", audit::handler).name("audit").retry(
        RetryPolicy::default()
            .on_kind("timeout", KindPolicy::tiers([Duration::from_secs(5)]))
            .on_kind("bad.input", KindPolicy::park()),
    );
    assert_eq!(format!("{:?}", audit::subscriber()), format!("{by_hand:?}"));
}
