//! Extractors: typed arguments of handler functions.
//!
//! Each extractor has a rejection that converts into an [`Outcome`]; a payload that does not
//! decode is **parked at once** with the decode error, so poison never loops.

use std::convert::Infallible;

use bytes::Bytes;
use lapin::types::FieldTable;
use serde::de::DeserializeOwned;

use crate::delivery::Delivery;
use crate::headers::Attempt;
use crate::manual::Settle;
use crate::outcome::{Failure, Outcome};

/// Builds a handler argument from a delivery.
pub trait FromDelivery: Sized {
    /// What a failed extraction becomes.
    type Rejection: Into<Outcome>;

    /// Extracts the value.
    fn from_delivery(delivery: &Delivery) -> Result<Self, Self::Rejection>;

    /// What this extractor needs from the worker to ever succeed (shared state, manual
    /// mode). Recorded when the handler becomes a subscriber and checked by
    /// [`Worker::start`](crate::Worker::start), so a wiring mistake is refused at start
    /// instead of failing every delivery. Nothing by default.
    fn requirements(requirements: &mut Requirements) {
        let _ = requirements;
    }
}

/// What a handler's extractors need to succeed: the [`State`] types they read and whether
/// one takes a [`Settle`] handle (manual ack mode).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Requirements {
    states: Vec<(std::any::TypeId, &'static str)>,
    settle: bool,
}

impl Requirements {
    /// A state value of type `T` must be registered.
    pub fn state<T: 'static>(&mut self) {
        let id = std::any::TypeId::of::<T>();
        if !self.states.iter().any(|(t, _)| *t == id) {
            self.states.push((id, std::any::type_name::<T>()));
        }
    }

    /// The subscriber must be in manual ack mode.
    pub fn settle(&mut self) {
        self.settle = true;
    }

    /// Whether a `Settle` handle is taken.
    pub fn needs_settle(&self) -> bool {
        self.settle
    }

    /// The first required state type `present` does not have, by name.
    pub(crate) fn missing_state(
        &self,
        present: impl Fn(std::any::TypeId) -> bool,
    ) -> Option<&'static str> {
        self.states
            .iter()
            .find(|(id, _)| !present(*id))
            .map(|(_, name)| *name)
    }
}

/// Never happens.
impl From<Infallible> for Outcome {
    fn from(never: Infallible) -> Self {
        match never {}
    }
}

impl FromDelivery for Delivery {
    type Rejection = Infallible;
    fn from_delivery(d: &Delivery) -> Result<Self, Infallible> {
        Ok(d.clone())
    }
}

/// The raw body.
#[derive(Debug, Clone)]
pub struct Body(pub Bytes);

impl FromDelivery for Body {
    type Rejection = Infallible;
    fn from_delivery(d: &Delivery) -> Result<Self, Infallible> {
        Ok(Body(d.body().clone()))
    }
}

/// The body decoded as JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Json<T>(pub T);

/// The body was not valid JSON for the target type: parked with the decode error.
#[derive(Debug)]
pub struct JsonRejection(pub serde_json::Error);

impl From<JsonRejection> for Outcome {
    fn from(r: JsonRejection) -> Self {
        Outcome::Park(Failure::decode(format!("invalid JSON payload: {}", r.0)))
    }
}

impl<T: DeserializeOwned> FromDelivery for Json<T> {
    type Rejection = JsonRejection;
    fn from_delivery(d: &Delivery) -> Result<Self, JsonRejection> {
        serde_json::from_slice(d.body())
            .map(Json)
            .map_err(JsonRejection)
    }
}

/// The headers (empty when there are none).
#[derive(Debug, Clone, Default)]
pub struct Headers(pub FieldTable);

impl FromDelivery for Headers {
    type Rejection = Infallible;
    fn from_delivery(d: &Delivery) -> Result<Self, Infallible> {
        Ok(Headers(d.headers().cloned().unwrap_or_default()))
    }
}

/// The original routing key (restored across retries).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingKey(pub String);

impl FromDelivery for RoutingKey {
    type Rejection = Infallible;
    fn from_delivery(d: &Delivery) -> Result<Self, Infallible> {
        Ok(RoutingKey(d.routing_key().to_owned()))
    }
}

/// The message id (`None` when the publisher set none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageId(pub Option<String>);

impl FromDelivery for MessageId {
    type Rejection = Infallible;
    fn from_delivery(d: &Delivery) -> Result<Self, Infallible> {
        Ok(MessageId(d.message_id().map(str::to_owned)))
    }
}

/// The broker's redelivered flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Redelivered(pub bool);

impl FromDelivery for Redelivered {
    type Rejection = Infallible;
    fn from_delivery(d: &Delivery) -> Result<Self, Infallible> {
        Ok(Redelivered(d.redelivered()))
    }
}

impl FromDelivery for Attempt {
    type Rejection = Infallible;
    fn from_delivery(d: &Delivery) -> Result<Self, Infallible> {
        Ok(d.attempt().clone())
    }
}

/// Shared state registered with the worker or subscriber.
#[derive(Debug, Clone)]
pub struct State<T>(pub T);

/// The requested state type was never registered: a wiring bug, parked (nothing lost).
#[derive(Debug)]
pub struct MissingState(pub &'static str);

impl From<MissingState> for Outcome {
    fn from(m: MissingState) -> Self {
        Outcome::Park(Failure::new(
            "wiring",
            format!("no state of type {} registered", m.0),
        ))
    }
}

impl<T: Clone + Send + Sync + 'static> FromDelivery for State<T> {
    type Rejection = MissingState;
    fn from_delivery(d: &Delivery) -> Result<Self, MissingState> {
        d.extensions()
            .get::<T>()
            .cloned()
            .map(State)
            .ok_or(MissingState(std::any::type_name::<T>()))
    }

    fn requirements(r: &mut Requirements) {
        r.state::<T>();
    }
}

/// Asking for a settle handle outside manual ack mode: a wiring bug, requeued for a fixed
/// deployment (nothing lost, nothing parked wrongly).
#[derive(Debug)]
pub struct NotManual;

impl From<NotManual> for Outcome {
    fn from(_: NotManual) -> Self {
        tracing::error!(
            "handler takes a Settle handle but the subscriber is not in manual ack mode"
        );
        Outcome::Requeue
    }
}

impl FromDelivery for Settle {
    type Rejection = NotManual;
    fn from_delivery(d: &Delivery) -> Result<Self, NotManual> {
        d.settle_handle().cloned().ok_or(NotManual)
    }

    fn requirements(r: &mut Requirements) {
        r.settle();
    }
}

/// The extraction itself, so the handler decides what a rejection means: `Result<Json<T>,
/// JsonRejection>` receives a payload that does not decode instead of it being parked.
impl<T: FromDelivery> FromDelivery for Result<T, T::Rejection> {
    type Rejection = Infallible;
    fn from_delivery(d: &Delivery) -> Result<Self, Infallible> {
        Ok(T::from_delivery(d))
    }
}

impl<T: FromDelivery> FromDelivery for Option<T> {
    type Rejection = Infallible;
    fn from_delivery(d: &Delivery) -> Result<Self, Infallible> {
        Ok(T::from_delivery(d).ok())
    }
}
