//! A received message as handlers see it.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};

use crate::headers::{self, Attempt};
use crate::manual::Settle;

/// Shared values handlers extract with [`State`](crate::extract::State), keyed by type.
#[derive(Clone, Default)]
pub struct Extensions {
    map: HashMap<TypeId, Arc<dyn Any + Send + Sync>>,
}

impl std::fmt::Debug for Extensions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Extensions")
            .field("len", &self.map.len())
            .finish()
    }
}

impl Extensions {
    /// Stores `value`, replacing any value of the same type.
    pub fn insert<T: Clone + Send + Sync + 'static>(&mut self, value: T) {
        self.map.insert(TypeId::of::<T>(), Arc::new(value));
    }

    /// Adds every value of `other`, replacing values of the same type (subscriber state
    /// over worker state).
    pub(crate) fn extend(&mut self, other: Extensions) {
        self.map.extend(other.map);
    }

    /// Whether a value of the type `id` is stored.
    pub(crate) fn contains(&self, id: TypeId) -> bool {
        self.map.contains_key(&id)
    }

    /// The value of type `T`, if stored.
    pub fn get<T: Clone + Send + Sync + 'static>(&self) -> Option<&T> {
        self.map.get(&TypeId::of::<T>())?.downcast_ref::<T>()
    }
}

/// One delivery. Cheap to clone (shared).
#[derive(Debug, Clone)]
pub struct Delivery {
    inner: Arc<Inner>,
}

#[derive(Debug, Clone)]
struct Inner {
    body: Bytes,
    exchange: String,
    routing_key: String,
    received_exchange: String,
    received_routing_key: String,
    redelivered: bool,
    properties: BasicProperties,
    queue: Arc<str>,
    attempt: Attempt,
    requeues: u32,
    extensions: Arc<Extensions>,
    settle: Option<Settle>,
}

impl Delivery {
    /// Builds a delivery by hand (tests, custom transports).
    pub fn builder(queue: impl Into<Arc<str>>, body: impl Into<Bytes>) -> DeliveryBuilder {
        DeliveryBuilder {
            queue: queue.into(),
            body: body.into(),
            exchange: String::new(),
            routing_key: String::new(),
            redelivered: false,
            properties: BasicProperties::default(),
            extensions: Arc::new(Extensions::default()),
            settle: None,
            attempt: None,
            requeues: 0,
            ignore_own_headers: None,
            x_death_floor: true,
        }
    }

    /// The body.
    pub fn body(&self) -> &Bytes {
        &self.inner.body
    }

    /// The exchange the message was first published to (restored on retries).
    pub fn exchange(&self) -> &str {
        &self.inner.exchange
    }

    /// The routing key the message was first published with. Retries travel through delay
    /// tiers that rewrite it; rabbitkit restores the original from its header.
    pub fn routing_key(&self) -> &str {
        &self.inner.routing_key
    }

    /// The exchange and routing key of this very delivery, as the broker reported them.
    pub fn received_route(&self) -> (&str, &str) {
        (
            &self.inner.received_exchange,
            &self.inner.received_routing_key,
        )
    }

    /// Whether the broker flagged this as a redelivery (a duplicate may have been handled).
    pub fn redelivered(&self) -> bool {
        self.inner.redelivered
    }

    /// The AMQP properties.
    pub fn properties(&self) -> &BasicProperties {
        &self.inner.properties
    }

    /// The headers, if any.
    pub fn headers(&self) -> Option<&FieldTable> {
        self.inner.properties.headers().as_ref()
    }

    /// One header.
    pub fn header(&self, name: &str) -> Option<&AMQPValue> {
        headers::get(self.headers(), name)
    }

    /// The message id, if the publisher set one.
    pub fn message_id(&self) -> Option<&str> {
        self.inner
            .properties
            .message_id()
            .as_ref()
            .map(|s| s.as_str())
    }

    /// The work queue it was consumed from.
    pub fn queue(&self) -> &str {
        &self.inner.queue
    }

    /// Attempt number and broker evidence.
    pub fn attempt(&self) -> &Attempt {
        &self.inner.attempt
    }

    /// How many times this message was requeued before this delivery, as far as rabbitkit
    /// knows (its own count, or the broker's `x-delivery-count`/`x-acquired-count` when
    /// larger). Past the subscriber's requeue limit a requeue parks the message instead.
    pub fn requeues(&self) -> u32 {
        self.inner.requeues
    }

    /// The quorum queue's `x-delivery-count` of this message, whatever its integer type:
    /// failed deliveries (on RabbitMQ before 4.3, every requeue). `None` when absent
    /// (classic queues, first delivery). See [`Attempt::delivery_count`].
    pub fn delivery_count(&self) -> Option<i64> {
        self.inner.attempt.delivery_count
    }

    /// The quorum queue's `x-acquired-count` (RabbitMQ 4.3+): how often the message was
    /// handed to a consumer before this delivery. `None` when absent.
    pub fn acquired_count(&self) -> Option<i64> {
        self.inner.attempt.acquired_count
    }

    /// Shared state.
    pub fn extensions(&self) -> &Extensions {
        &self.inner.extensions
    }

    /// The settle handle (manual ack mode only).
    pub fn settle_handle(&self) -> Option<&Settle> {
        self.inner.settle.as_ref()
    }

    /// The same delivery with another settle handle (a layer that wraps the handle).
    pub(crate) fn with_settle(&self, settle: Settle) -> Delivery {
        let mut inner = Inner::clone(&self.inner);
        inner.settle = Some(settle);
        Delivery {
            inner: Arc::new(inner),
        }
    }
}

/// Builds a [`Delivery`].
#[derive(Debug)]
#[must_use]
pub struct DeliveryBuilder {
    queue: Arc<str>,
    body: Bytes,
    exchange: String,
    routing_key: String,
    redelivered: bool,
    properties: BasicProperties,
    extensions: Arc<Extensions>,
    settle: Option<Settle>,
    attempt: Option<u32>,
    requeues: u32,
    ignore_own_headers: Option<&'static str>,
    x_death_floor: bool,
}

impl DeliveryBuilder {
    /// Ignores the delivery's own attempt and original-route headers: they were not written
    /// by rabbitkit (see [`HeaderTrust`](crate::trust::HeaderTrust)); `why` is recorded in
    /// [`Attempt::forged_header`]. Without this call they are believed, as the runtime
    /// believes them once verified.
    pub fn ignore_own_headers(mut self, why: &'static str) -> Self {
        self.ignore_own_headers = Some(why);
        self
    }

    /// The own headers are signed: the attempt header is the authority, and `x-death`
    /// (which a producer can write on RabbitMQ 3.10-3.13, and which a copy carries on) is
    /// not read as a floor.
    pub fn signed_headers(mut self) -> Self {
        self.x_death_floor = false;
        self
    }

    /// Exchange and routing key as received.
    pub fn route(mut self, exchange: impl Into<String>, routing_key: impl Into<String>) -> Self {
        self.exchange = exchange.into();
        self.routing_key = routing_key.into();
        self
    }

    /// The redelivered flag.
    pub fn redelivered(mut self, on: bool) -> Self {
        self.redelivered = on;
        self
    }

    /// The properties (headers included).
    pub fn properties(mut self, p: BasicProperties) -> Self {
        self.properties = p;
        self
    }

    /// Adds a header.
    pub fn header(mut self, name: &str, value: impl Into<AMQPValue>) -> Self {
        let mut t = self.properties.headers().clone().unwrap_or_default();
        t.insert(name.into(), value.into());
        self.properties = self.properties.with_headers(t);
        self
    }

    /// Sets the attempt header to `n` (as a retry copy would carry it).
    pub fn attempt(mut self, n: u32) -> Self {
        self.attempt = Some(n);
        self
    }

    /// The requeues the message went through before this delivery (see
    /// [`Delivery::requeues`]).
    pub fn requeues(mut self, n: u32) -> Self {
        self.requeues = n;
        self
    }

    /// Shared state.
    pub fn extensions(mut self, ext: Arc<Extensions>) -> Self {
        self.extensions = ext;
        self
    }

    pub(crate) fn settle(mut self, s: Option<Settle>) -> Self {
        self.settle = s;
        self
    }

    /// Builds it; the attempt is derived from the headers exactly as the runtime does.
    pub fn build(mut self) -> Delivery {
        if let Some(n) = self.attempt {
            self = self.header(headers::ATTEMPT, AMQPValue::LongLongInt(i64::from(n)));
        }
        let believed;
        let hdrs = if self.ignore_own_headers.is_none() && self.x_death_floor {
            self.properties.headers().as_ref()
        } else {
            let mut map = self
                .properties
                .headers()
                .as_ref()
                .map(|h| h.inner().clone())
                .unwrap_or_default();
            // `x-death` in both cases: a producer can write it on RabbitMQ 3.10-3.13, and
            // its expiries would count as attempts.
            map.remove("x-death");
            if self.ignore_own_headers.is_some() {
                for name in crate::trust::SIGNED {
                    map.remove(name);
                }
            }
            believed = FieldTable::from(map);
            Some(&believed)
        };
        let mut attempt = Attempt::from_headers(hdrs, &self.queue);
        if let Some(why) = self.ignore_own_headers {
            attempt.forged_header = Some(format!("own headers ignored: {why}"));
        }
        let original = |name: &str, received: &str| {
            headers::get(hdrs, name)
                .and_then(headers::string)
                .unwrap_or_else(|| received.to_owned())
        };
        let exchange = original(headers::ORIGINAL_EXCHANGE, &self.exchange);
        let routing_key = original(headers::ORIGINAL_ROUTING_KEY, &self.routing_key);
        Delivery {
            inner: Arc::new(Inner {
                body: self.body,
                exchange,
                routing_key,
                received_exchange: self.exchange,
                received_routing_key: self.routing_key,
                redelivered: self.redelivered,
                properties: self.properties,
                queue: self.queue,
                attempt,
                requeues: self.requeues,
                extensions: self.extensions,
                settle: self.settle,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn original_route_is_restored_from_headers() {
        let d = Delivery::builder("orders", "x")
            .route("", "orders")
            .header(
                headers::ORIGINAL_EXCHANGE,
                AMQPValue::LongString("shop".into()),
            )
            .header(
                headers::ORIGINAL_ROUTING_KEY,
                AMQPValue::LongString("order.created.eu".into()),
            )
            .attempt(3)
            .build();
        assert_eq!(d.routing_key(), "order.created.eu");
        assert_eq!(d.exchange(), "shop");
        assert_eq!(d.received_route(), ("", "orders"));
        assert_eq!(d.attempt().number, 3);
    }

    #[test]
    fn extensions_are_typed() {
        let mut e = Extensions::default();
        e.insert(42u32);
        e.insert(String::from("db"));
        assert_eq!(e.get::<u32>(), Some(&42));
        assert_eq!(e.get::<String>().map(String::as_str), Some("db"));
        assert_eq!(e.get::<u64>(), None);
    }
}
