//! What is published: exchange, routing key, body and properties.

use bytes::Bytes;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::names;

/// A message to publish. Persistent and mandatory by default; a `message_id` is generated
/// when none is set, so every copy rabbitkit makes can be traced and deduplicated.
#[derive(Debug, Clone)]
pub struct Envelope {
    pub(crate) exchange: String,
    pub(crate) routing_key: String,
    pub(crate) body: Bytes,
    pub(crate) properties: BasicProperties,
    pub(crate) headers: Vec<(String, AMQPValue)>,
    pub(crate) mandatory: bool,
}

impl Envelope {
    /// A message for `exchange` (`""` is the default exchange) with `routing_key`.
    pub fn new(
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
        body: impl Into<Bytes>,
    ) -> Self {
        Self {
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            body: body.into(),
            properties: BasicProperties::default().with_delivery_mode(2),
            headers: Vec::new(),
            mandatory: true,
        }
    }

    /// A message whose body is `value` as JSON (`content_type: application/json`).
    pub fn json<T: Serialize + ?Sized>(
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
        value: &T,
    ) -> Result<Self> {
        let body = serde_json::to_vec(value)?;
        Ok(Self::new(exchange, routing_key, body).content_type("application/json"))
    }

    /// Sets the message id.
    #[must_use]
    pub fn message_id(mut self, id: impl Into<String>) -> Self {
        self.properties = self
            .properties
            .with_message_id(ShortString::from(clip(id.into())));
        self
    }

    /// Sets the correlation id.
    #[must_use]
    pub fn correlation_id(mut self, id: impl Into<String>) -> Self {
        self.properties = self
            .properties
            .with_correlation_id(ShortString::from(clip(id.into())));
        self
    }

    /// Sets the content type.
    #[must_use]
    pub fn content_type(mut self, ct: impl Into<String>) -> Self {
        self.properties = self
            .properties
            .with_content_type(ShortString::from(clip(ct.into())));
        self
    }

    /// Sets the timestamp (seconds since the Unix epoch).
    #[must_use]
    pub fn timestamp(mut self, secs: u64) -> Self {
        self.properties = self.properties.with_timestamp(secs);
        self
    }

    /// Adds a header. Names and values are checked when the envelope is published.
    #[must_use]
    pub fn header(mut self, name: impl Into<String>, value: impl Into<AMQPValue>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Persistent (`delivery_mode = 2`, the default) or transient.
    #[must_use]
    pub fn persistent(mut self, on: bool) -> Self {
        self.properties = self.properties.with_delivery_mode(if on { 2 } else { 1 });
        self
    }

    /// Mandatory (the default): an unroutable message comes back as `Returned`.
    #[must_use]
    pub fn mandatory(mut self, on: bool) -> Self {
        self.mandatory = on;
        self
    }

    /// Replaces all properties (headers set with [`Envelope::header`] are added on top).
    #[must_use]
    pub fn properties(mut self, p: BasicProperties) -> Self {
        self.properties = p;
        self
    }

    /// The exchange.
    pub fn exchange_name(&self) -> &str {
        &self.exchange
    }

    /// The routing key.
    pub fn routing_key(&self) -> &str {
        &self.routing_key
    }

    /// The body.
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// The properties, headers included, once the envelope was prepared for publishing.
    pub fn basic_properties(&self) -> &BasicProperties {
        &self.properties
    }

    /// The value of a header set on this envelope (before or after preparation).
    pub fn header_value(&self, name: &str) -> Option<&AMQPValue> {
        self.headers
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
            .or_else(|| self.properties.headers().as_ref()?.inner().get(name))
    }

    /// Whether the publish is mandatory.
    pub fn is_mandatory(&self) -> bool {
        self.mandatory
    }

    /// The verdict [`Envelope::prepare`] gives, without building anything when the headers
    /// are already in the properties (every copy rabbitkit makes): no table is cloned.
    pub(crate) fn check(&self, max_body: usize, max_properties: usize) -> Result<()> {
        if !self.headers.is_empty() {
            return self.clone().prepare(max_body, max_properties).map(|_| ());
        }
        names::check("exchange name", &self.exchange)?;
        names::check("routing key", &self.routing_key)?;
        check_body(&self.body, max_body)?;
        let mut size = properties_size(&self.properties);
        if self.properties.message_id().is_none() {
            // The id `prepare` generates: a short string of MESSAGE_ID_LEN bytes.
            size += MESSAGE_ID_LEN + 1;
        }
        check_size(size, max_properties)
    }

    /// Validates the envelope and merges the headers into the properties. Everything that
    /// would make lapin panic or the broker close the channel is refused here, typed.
    pub(crate) fn prepare(mut self, max_body: usize, max_properties: usize) -> Result<Prepared> {
        let exchange = names::short("exchange name", &self.exchange)?;
        let routing_key = names::short("routing key", &self.routing_key)?;
        check_body(&self.body, max_body)?;
        if !self.headers.is_empty() {
            let mut table = self.properties.headers().clone().unwrap_or_default();
            for (name, value) in std::mem::take(&mut self.headers) {
                if name.is_empty() || name.len() > names::MAX_SHORT {
                    return Err(Error::InvalidHeader {
                        name: names::truncate(&name, 64).to_owned(),
                        reason: "header names must be 1 to 255 bytes".into(),
                    });
                }
                check_value(&name, &value, 0)?;
                table.insert(ShortString::from(name), value);
            }
            self.properties = self.properties.with_headers(table);
        }
        if self.properties.message_id().is_none() {
            self.properties = self.properties.with_message_id(new_message_id());
        }
        let properties_size = properties_size(&self.properties);
        check_size(properties_size, max_properties)?;
        Ok(Prepared {
            exchange,
            routing_key,
            body: self.body,
            properties: self.properties,
            mandatory: self.mandatory,
            properties_size,
        })
    }

    /// How many bytes setting `headers` (each replacing a header of the same name, as
    /// [`Envelope::header`] does) adds to the estimate of the properties' encoded size:
    /// room the publisher keeps for the headers it writes itself at send time.
    #[cfg(feature = "otel")]
    pub(crate) fn growth(&self, headers: &[(&str, AMQPValue)]) -> usize {
        // No table yet: setting a header creates one (its 4-byte length).
        let table = if !headers.is_empty()
            && self.headers.is_empty()
            && self.properties.headers().is_none()
        {
            4
        } else {
            0
        };
        table
            + headers
                .iter()
                .map(|(name, value)| {
                    let entry = |v: &AMQPValue| 1 + name.len() + value_size(v);
                    let old = self.header_value(name).map_or(0, entry);
                    entry(value).saturating_sub(old)
                })
                .sum::<usize>()
    }
}

/// A validated envelope, ready for lapin.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub(crate) exchange: ShortString,
    pub(crate) routing_key: ShortString,
    pub(crate) body: Bytes,
    pub(crate) properties: BasicProperties,
    pub(crate) mandatory: bool,
    /// [`properties_size`] of `properties`, as checked against the frame budget.
    pub(crate) properties_size: usize,
}

/// The length of a generated message id (a hyphenated UUID).
const MESSAGE_ID_LEN: usize = 36;

fn check_body(body: &Bytes, max_body: usize) -> Result<()> {
    if body.len() > max_body {
        return Err(Error::BodyTooLarge {
            size: body.len(),
            max: max_body,
        });
    }
    Ok(())
}

fn check_size(size: usize, max_properties: usize) -> Result<()> {
    if size > max_properties {
        return Err(Error::InvalidHeader {
            name: "(all headers)".into(),
            reason: format!(
                "properties take about {size} bytes, over the {max_properties}-byte frame budget"
            ),
        });
    }
    Ok(())
}

fn clip(mut s: String) -> String {
    let keep = names::truncate(&s, names::MAX_SHORT).len();
    s.truncate(keep);
    s
}

const MAX_DEPTH: usize = 16;

fn check_value(name: &str, v: &AMQPValue, depth: usize) -> Result<()> {
    if depth > MAX_DEPTH {
        return Err(Error::InvalidHeader {
            name: name.to_owned(),
            reason: format!("nested deeper than {MAX_DEPTH} levels"),
        });
    }
    match v {
        AMQPValue::FieldTable(t) => {
            for inner in t.inner().values() {
                check_value(name, inner, depth + 1)?;
            }
        }
        AMQPValue::FieldArray(a) => {
            for inner in a.as_slice() {
                check_value(name, inner, depth + 1)?;
            }
        }
        AMQPValue::Float(f) if !f.is_finite() => return bad_float(name),
        AMQPValue::Double(f) if !f.is_finite() => return bad_float(name),
        _ => {}
    }
    Ok(())
}

fn bad_float(name: &str) -> Result<()> {
    Err(Error::InvalidHeader {
        name: name.to_owned(),
        reason: "NaN and infinite floats are not portable header values".into(),
    })
}

/// `p` without its `expiration`, every other property kept. A copy that is parked, or
/// replayed into a work queue, must not expire there: a retry copy carries its tier's delay
/// as its expiration, and the parking queue has no dead-letter target, so an expiring
/// parked copy would be dropped by the broker.
pub(crate) fn without_expiration(p: &BasicProperties) -> BasicProperties {
    let mut out = BasicProperties::default();
    if let Some(v) = p.content_type() {
        out = out.with_content_type(v.clone());
    }
    if let Some(v) = p.content_encoding() {
        out = out.with_content_encoding(v.clone());
    }
    if let Some(v) = p.headers() {
        out = out.with_headers(v.clone());
    }
    if let Some(v) = p.delivery_mode() {
        out = out.with_delivery_mode(*v);
    }
    if let Some(v) = p.priority() {
        out = out.with_priority(*v);
    }
    if let Some(v) = p.correlation_id() {
        out = out.with_correlation_id(v.clone());
    }
    if let Some(v) = p.reply_to() {
        out = out.with_reply_to(v.clone());
    }
    if let Some(v) = p.message_id() {
        out = out.with_message_id(v.clone());
    }
    if let Some(v) = p.timestamp() {
        out = out.with_timestamp(*v);
    }
    if let Some(v) = p.kind() {
        out = out.with_type(v.clone());
    }
    if let Some(v) = p.user_id() {
        out = out.with_user_id(v.clone());
    }
    if let Some(v) = p.app_id() {
        out = out.with_app_id(v.clone());
    }
    if let Some(v) = p.cluster_id() {
        out = out.with_cluster_id(v.clone());
    }
    out
}

/// An upper estimate of the encoded size of the properties, in bytes: the property list of
/// a content-header frame, its 2-byte flags included (the fixed 32 cover the flags, the
/// delivery mode, the priority and the timestamp; every short string counts its length
/// byte; every scalar header value is counted at 9 bytes, the largest).
pub(crate) fn properties_size(p: &BasicProperties) -> usize {
    let shorts = [
        p.content_type().as_ref().map(|s| s.as_str().len()),
        p.content_encoding().as_ref().map(|s| s.as_str().len()),
        p.correlation_id().as_ref().map(|s| s.as_str().len()),
        p.reply_to().as_ref().map(|s| s.as_str().len()),
        p.expiration().as_ref().map(|s| s.as_str().len()),
        p.message_id().as_ref().map(|s| s.as_str().len()),
        p.kind().as_ref().map(|s| s.as_str().len()),
        p.user_id().as_ref().map(|s| s.as_str().len()),
        p.app_id().as_ref().map(|s| s.as_str().len()),
        p.cluster_id().as_ref().map(|s| s.as_str().len()),
    ];
    let mut n = 32 + shorts.iter().flatten().map(|l| l + 1).sum::<usize>();
    if let Some(h) = p.headers() {
        n += table_size(h);
    }
    n
}

fn table_size(t: &FieldTable) -> usize {
    4 + t
        .inner()
        .iter()
        .map(|(k, v)| 1 + k.as_str().len() + value_size(v))
        .sum::<usize>()
}

fn value_size(v: &AMQPValue) -> usize {
    1 + match v {
        AMQPValue::LongString(s) => 4 + s.as_bytes().len(),
        AMQPValue::ShortString(s) => 1 + s.as_str().len(),
        AMQPValue::ByteArray(b) => 4 + b.as_slice().len(),
        AMQPValue::FieldTable(t) => table_size(t),
        AMQPValue::FieldArray(a) => 4 + a.as_slice().iter().map(value_size).sum::<usize>(),
        _ => 9,
    }
}

/// A globally unique, time-ordered message id: a UUIDv7 (`0190f1c2-…`), 48 bits of
/// milliseconds then 74 bits that are random (from the OS) or a counter seeded from them,
/// so ids from different hosts, containers and forked processes never collide (a pid-based
/// id would: every container is pid 1), and the ids of one process are ordered.
///
/// The OS random source costs a system call per id (about 1 µs). A faster generator seeded
/// once per thread would repeat its ids after a `fork` or in a cloned VM snapshot, and a
/// repeated id can make an idempotent handler skip a different message.
pub fn new_message_id() -> ShortString {
    ShortString::from(uuid::Uuid::now_v7().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_persistent_mandatory_with_an_id() {
        let p = Envelope::new("", "q", "x")
            .prepare(1024, 4096)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(*p.properties.delivery_mode(), Some(2));
        assert!(p.mandatory);
        assert!(p.properties.message_id().is_some());
    }

    #[test]
    fn message_ids_are_unique() {
        assert_ne!(new_message_id(), new_message_id());
    }

    #[test]
    fn generated_ids_are_uuid_v7() {
        // A pid in the id collides across containers (every one is pid 1): a UUIDv7 has
        // 74 random bits.
        let id = new_message_id();
        let parsed = uuid::Uuid::parse_str(id.as_str()).unwrap_or_else(|e| panic!("{id}: {e}"));
        assert_eq!(parsed.get_version_num(), 7, "{id}");
        assert_eq!(parsed.get_variant(), uuid::Variant::RFC4122, "{id}");
        // Its timestamp is now, to the millisecond.
        let (secs, _) = parsed
            .get_timestamp()
            .unwrap_or_else(|| panic!("{id}: no timestamp"))
            .to_unix();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        assert!(now.abs_diff(secs) <= 1, "{id}: {secs} vs now {now}");
    }

    #[test]
    fn ids_from_many_threads_at_once_are_unique_and_ordered() {
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| (0..20_000).map(|_| new_message_id()).collect::<Vec<_>>())
            })
            .collect();
        let mut all = std::collections::HashSet::new();
        for t in threads {
            let ids = t
                .join()
                .unwrap_or_else(|_| panic!("generator thread panicked"));
            // One thread's ids are ordered, within a millisecond too.
            assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids out of order");
            for id in ids {
                assert!(all.insert(id.clone()), "duplicate id {id}");
            }
        }
        assert_eq!(all.len(), 80_000);
    }

    #[test]
    fn bad_input_is_a_typed_error() {
        let long = "x".repeat(256);
        assert!(matches!(
            Envelope::new(long.clone(), "q", "x").prepare(1024, 4096),
            Err(Error::InvalidName { .. })
        ));
        assert!(matches!(
            Envelope::new("", long.clone(), "x").prepare(1024, 4096),
            Err(Error::InvalidName { .. })
        ));
        assert!(matches!(
            Envelope::new("", "q", vec![0u8; 2000]).prepare(1024, 4096),
            Err(Error::BodyTooLarge {
                size: 2000,
                max: 1024
            })
        ));
        assert!(matches!(
            Envelope::new("", "q", "x")
                .header(long, 1i32)
                .prepare(1024, 4096),
            Err(Error::InvalidHeader { .. })
        ));
        assert!(matches!(
            Envelope::new("", "q", "x")
                .header("f", AMQPValue::Double(f64::NAN))
                .prepare(1024, 4096),
            Err(Error::InvalidHeader { .. })
        ));
        assert!(matches!(
            Envelope::new("", "q", "x")
                .header("big", AMQPValue::LongString("y".repeat(10_000).into()))
                .prepare(1024, 4096),
            Err(Error::InvalidHeader { .. })
        ));
    }

    #[test]
    fn check_gives_the_verdict_of_prepare() {
        let verdict = |r: Result<()>| match r {
            Ok(()) => "ok",
            Err(Error::InvalidName { .. }) => "name",
            Err(Error::BodyTooLarge { .. }) => "body",
            Err(Error::InvalidHeader { .. }) => "header",
            Err(_) => "other",
        };
        let with_table = |len: usize, id: bool| {
            let mut t = FieldTable::default();
            t.insert("h".into(), AMQPValue::LongString("y".repeat(len).into()));
            let mut p = BasicProperties::default().with_headers(t);
            if id {
                p = p.with_message_id("m-1".into());
            }
            Envelope::new("x", "q", "b").properties(p)
        };
        let mut cases = vec![
            Envelope::new("x".repeat(256), "q", "b"),
            Envelope::new("", "q".repeat(256), "b"),
            Envelope::new("", "q", vec![0u8; 2000]),
            Envelope::new("", "q", "x").header("f", AMQPValue::Double(f64::NAN)),
            Envelope::new("", "q", "x").header("a", 1i32),
        ];
        // Around the properties budget, with and without an id to generate.
        for len in 3900..4100 {
            cases.push(with_table(len, true));
            cases.push(with_table(len, false));
        }
        let mut verdicts = std::collections::HashSet::new();
        for e in cases {
            let expected = verdict(e.clone().prepare(1024, 4096).map(|_| ()));
            assert_eq!(verdict(e.check(1024, 4096)), expected, "{e:?}");
            verdicts.insert(expected);
        }
        assert_eq!(verdicts.len(), 4, "{verdicts:?}");
    }

    #[test]
    fn json_sets_content_type() {
        let e =
            Envelope::json("", "q", &serde_json::json!({"a": 1})).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(e.body().as_ref(), br#"{"a":1}"#);
        assert_eq!(
            e.basic_properties()
                .content_type()
                .as_ref()
                .map(|s| s.as_str()),
            Some("application/json")
        );
    }
}
