//! Deliveries built by hand, as the broker would hand them to a consumer.

use bytes::Bytes;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString};
use serde::Serialize;

use crate::headers;

/// A delivery for the [`TestKit`](super::TestKit), built without a broker.
///
/// The queue is the subscriber's; everything else is what the broker would report: the
/// body, the exchange and routing key it was received with, the redelivered flag, the
/// properties and headers. The attempt number is derived from the headers exactly as the
/// runtime derives it ([`Attempt::from_headers`](crate::headers::Attempt::from_headers)), so
/// [`TestDelivery::attempt`] writes rabbitkit's attempt header, as a retry copy carries it.
///
/// ```
/// use rabbitkit_core::testing::TestDelivery;
///
/// let d = TestDelivery::json(&serde_json::json!({ "id": 7 }))?
///     .route("shop", "order.created")
///     .message_id("m-7")
///     .redelivered(true)
///     .attempt(2);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct TestDelivery {
    pub(crate) body: Bytes,
    pub(crate) exchange: String,
    pub(crate) routing_key: String,
    pub(crate) redelivered: bool,
    pub(crate) properties: BasicProperties,
    x_death: Vec<AMQPValue>,
}

impl TestDelivery {
    /// A delivery with this body, published to the default exchange with no properties.
    pub fn new(body: impl Into<Bytes>) -> Self {
        Self {
            body: body.into(),
            exchange: String::new(),
            routing_key: String::new(),
            redelivered: false,
            properties: BasicProperties::default(),
            x_death: Vec::new(),
        }
    }

    /// A delivery whose body is `value` as JSON, with `content_type` `application/json`.
    pub fn json<T: Serialize + ?Sized>(value: &T) -> Result<Self, serde_json::Error> {
        Ok(Self::new(serde_json::to_vec(value)?).content_type("application/json"))
    }

    /// The exchange and routing key the delivery was received with.
    pub fn route(mut self, exchange: impl Into<String>, routing_key: impl Into<String>) -> Self {
        self.exchange = exchange.into();
        self.routing_key = routing_key.into();
        self
    }

    /// The exchange the delivery was received from (default: `""`).
    pub fn exchange(mut self, exchange: impl Into<String>) -> Self {
        self.exchange = exchange.into();
        self
    }

    /// The routing key the delivery was received with (default: `""`).
    pub fn routing_key(mut self, routing_key: impl Into<String>) -> Self {
        self.routing_key = routing_key.into();
        self
    }

    /// The broker's redelivered flag.
    pub fn redelivered(mut self, on: bool) -> Self {
        self.redelivered = on;
        self
    }

    /// All the AMQP properties at once (headers included; replaces earlier headers).
    pub fn properties(mut self, properties: BasicProperties) -> Self {
        self.properties = properties;
        self
    }

    /// The message id.
    pub fn message_id(mut self, id: impl Into<String>) -> Self {
        self.properties = self.properties.with_message_id(id.into().into());
        self
    }

    /// The correlation id.
    pub fn correlation_id(mut self, id: impl Into<String>) -> Self {
        self.properties = self.properties.with_correlation_id(id.into().into());
        self
    }

    /// The content type.
    pub fn content_type(mut self, content_type: impl Into<String>) -> Self {
        self.properties = self
            .properties
            .with_content_type(content_type.into().into());
        self
    }

    /// Adds a header (a `&str` value becomes a long string, as other clients send it).
    pub fn header(mut self, name: &str, value: impl Into<HeaderValue>) -> Self {
        let mut t = self.properties.headers().clone().unwrap_or_default();
        t.insert(name.into(), value.into().0);
        self.properties = self.properties.with_headers(t);
        self
    }

    /// Sets rabbitkit's attempt header to `n`: the delivery is attempt `n`, as a retry copy
    /// that went through `n - 1` delay tiers.
    pub fn attempt(self, n: u32) -> Self {
        self.header(headers::ATTEMPT, AMQPValue::LongLongInt(i64::from(n)))
    }

    /// Adds an `x-death` entry as the broker writes it (`queue`, `reason`, `count`). Entries
    /// keep the order they are added in: add the newest first, like the broker.
    pub fn x_death(mut self, queue: &str, reason: &str, count: i64) -> Self {
        let mut t = FieldTable::default();
        t.insert("queue".into(), long_string(queue));
        t.insert("reason".into(), long_string(reason));
        t.insert("count".into(), AMQPValue::LongLongInt(count));
        t.insert("exchange".into(), long_string(""));
        self.x_death.push(AMQPValue::FieldTable(t));
        let entries = FieldArray::from(self.x_death.clone());
        self.header("x-death", AMQPValue::FieldArray(entries))
    }
}

fn long_string(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

/// A header value for [`TestDelivery::header`]: any [`AMQPValue`], or a string or integer
/// written the way rabbitkit and most clients write them (long string, 64-bit integer).
#[derive(Debug, Clone, PartialEq)]
pub struct HeaderValue(pub AMQPValue);

impl From<AMQPValue> for HeaderValue {
    fn from(v: AMQPValue) -> Self {
        HeaderValue(v)
    }
}

impl From<&str> for HeaderValue {
    fn from(v: &str) -> Self {
        HeaderValue(long_string(v))
    }
}

impl From<String> for HeaderValue {
    fn from(v: String) -> Self {
        HeaderValue(long_string(&v))
    }
}

impl From<i64> for HeaderValue {
    fn from(v: i64) -> Self {
        HeaderValue(AMQPValue::LongLongInt(v))
    }
}

impl From<bool> for HeaderValue {
    fn from(v: bool) -> Self {
        HeaderValue(AMQPValue::Boolean(v))
    }
}
