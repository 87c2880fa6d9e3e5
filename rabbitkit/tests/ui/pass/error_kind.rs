//! `error_kind` registers the type whose kinds `on_kind` names, as `.error_kind::<T>()`
//! would; `kinds` declares kinds given ad hoc. Without them, the same policies are refused
//! at start.
use std::borrow::Cow;

use rabbitkit::kind::{ErrorKind, KindPolicy};
use rabbitkit::prelude::*;

#[derive(Debug)]
enum ChargeError {
    Declined,
}

impl std::fmt::Display for ChargeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("declined")
    }
}

impl std::error::Error for ChargeError {}

impl ErrorKind for ChargeError {
    const KINDS: &'static [&'static str] = &["card"];
    fn kind(&self) -> Cow<'static, str> {
        match self {
            ChargeError::Declined => "card".into(),
        }
    }
}

#[subscriber(
    queue = "payments",
    error_kind = ChargeError,
    kinds = ["validation"],
    on_kind("card", park = true),
    on_kind("validation", park = true)
)]
async fn charge(Body(_body): Body) -> Result<(), ChargeError> {
    Err(ChargeError::Declined)
}

#[subscriber(queue = "payments", on_kind("card", park = true))]
async fn unwired(Body(_body): Body) -> Result<(), ChargeError> {
    Err(ChargeError::Declined)
}

fn main() {
    assert!(charge::subscriber().validate().is_ok());
    let by_hand = Subscriber::new("payments", charge::handler)
        .name("charge")
        .retry(
            RetryPolicy::default()
                .on_kind("card", KindPolicy::park())
                .on_kind("validation", KindPolicy::park()),
        )
        .error_kind::<ChargeError>()
        .kinds(["validation"]);
    assert_eq!(format!("{:?}", charge::subscriber()), format!("{by_hand:?}"));
    assert!(by_hand.validate().is_ok());
    // The kind `card` is only ChargeError's: without `error_kind` the policy never applies.
    assert!(matches!(
        unwired::subscriber().validate(),
        Err(rabbitkit::Error::UnknownKind { kind, .. }) if kind == "card"
    ));
}
