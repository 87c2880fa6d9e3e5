//! A copy the publisher refuses before sending (body over `max_body`, properties over the
//! frame budget once the evidence headers are added) can never be published: requeueing
//! the original would re-run the handler for ever. It is parked instead, as a trimmed copy
//! that fits, with reason `unpublishable`.
//!
//! What is kept: the body when it fits (else it is dropped, and its size and a digest say
//! what it was), the original headers when they fit (else only rabbitkit's own headers are
//! kept, and a header says how many were dropped), the identifying properties.

use lapin::types::{AMQPValue, FieldTable, LongString};

use crate::envelope::Envelope;
use crate::headers;
use crate::names;

/// A parking copy of `copy` (a retry or parking copy refused with `refusal`) that fits
/// `max_body` and `fits`; `None` when it has no source queue to be parked for, or nothing
/// trimmed fits.
pub(crate) fn parking_copy(
    copy: &Envelope,
    refusal: &crate::Error,
    max_body: usize,
    fits: impl Fn(&Envelope) -> bool,
) -> Option<Envelope> {
    let props = copy.basic_properties();
    let all = props.headers().clone().unwrap_or_default();
    let queue = headers::get(Some(&all), headers::SOURCE_QUEUE).and_then(headers::string)?;
    let body = copy.body();
    let keep_body = body.len() <= max_body;
    let own: FieldTable = all
        .inner()
        .iter()
        .filter(|(k, _)| k.as_str().starts_with("x-rabbitkit-"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect::<std::collections::BTreeMap<_, _>>()
        .into();
    let dropped_headers = all.inner().len() - own.inner().len();
    for (table, dropped) in [(all.clone(), 0), (own, dropped_headers)] {
        let mut map = table.inner().clone();
        map.remove(headers::RETRY_TIER);
        let mut h = FieldTable::from(map);
        h.insert(
            headers::PARK_REASON.into(),
            long_string(crate::decide::ParkReason::Unpublishable.as_str()),
        );
        h.insert(
            headers::UNPUBLISHABLE.into(),
            long_string(names::truncate(
                &refusal.to_string(),
                headers::MAX_ERROR_MESSAGE,
            )),
        );
        if dropped > 0 {
            h.insert(
                headers::HEADERS_DROPPED.into(),
                AMQPValue::LongLongInt(i64::try_from(dropped).unwrap_or(i64::MAX)),
            );
        }
        let body = if keep_body {
            body.clone()
        } else {
            h.insert(
                headers::BODY_DROPPED_SIZE.into(),
                AMQPValue::LongLongInt(i64::try_from(body.len()).unwrap_or(i64::MAX)),
            );
            h.insert(
                headers::BODY_DIGEST.into(),
                long_string(&format!("fnv1a64:{:016x}", fnv1a64(body))),
            );
            bytes::Bytes::new()
        };
        let trimmed = Envelope::new(String::new(), crate::retry::parking_queue(&queue), body)
            .properties(crate::envelope::without_expiration(props).with_headers(h));
        if fits(&trimmed) {
            return Some(trimmed);
        }
    }
    None
}

/// FNV-1a, 64 bits: a stable digest with no dependency, to tell a dropped body from others
/// (not a security digest).
fn fnv1a64(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn long_string(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::BasicProperties;

    fn refused_copy(body: usize, big_header: usize) -> Envelope {
        let mut h = FieldTable::default();
        h.insert(headers::SOURCE_QUEUE.into(), long_string("orders"));
        h.insert(headers::RETRY_TIER.into(), long_string("5s"));
        h.insert("user".into(), long_string(&"u".repeat(big_header)));
        // A retry copy: it carries its tier's delay as its expiration.
        Envelope::new("orders.retry", "orders.retry.5s", vec![7u8; body]).properties(
            BasicProperties::default()
                .with_message_id("m-1".into())
                .with_expiration("5000".into())
                .with_headers(h),
        )
    }

    fn size_ok(e: &Envelope) -> bool {
        e.clone().prepare(1000, 4096).is_ok()
    }

    fn h<'a>(e: &'a Envelope, name: &str) -> Option<&'a AMQPValue> {
        e.basic_properties().headers().as_ref()?.inner().get(name)
    }

    #[test]
    fn an_oversized_body_is_dropped_with_its_size_and_digest() {
        let err = crate::Error::BodyTooLarge {
            size: 2000,
            max: 1000,
        };
        let t = parking_copy(&refused_copy(2000, 10), &err, 1000, size_ok)
            .unwrap_or_else(|| panic!("no trimmed copy"));
        assert_eq!(t.routing_key(), "orders.parking");
        assert_eq!(t.exchange_name(), "");
        assert!(t.body().is_empty());
        assert_eq!(
            h(&t, headers::BODY_DROPPED_SIZE),
            Some(&AMQPValue::LongLongInt(2000))
        );
        assert!(h(&t, headers::BODY_DIGEST).is_some());
        assert!(h(&t, "user").is_some(), "headers that fit are kept");
        assert_eq!(h(&t, headers::RETRY_TIER), None);
        let p = t.basic_properties();
        assert!(
            p.expiration().is_none(),
            "a parked copy must not expire in the parking queue"
        );
        assert_eq!(p.message_id().as_ref().map(|s| s.as_str()), Some("m-1"));
        assert_eq!(
            h(&t, headers::PARK_REASON),
            Some(&long_string("unpublishable"))
        );
        assert_eq!(
            t.basic_properties()
                .message_id()
                .as_ref()
                .map(|s| s.as_str()),
            Some("m-1")
        );
    }

    #[test]
    fn oversized_headers_are_dropped_and_the_body_kept() {
        let err = crate::Error::InvalidHeader {
            name: "(all headers)".into(),
            reason: "over budget".into(),
        };
        let t = parking_copy(&refused_copy(10, 8000), &err, 1000, size_ok)
            .unwrap_or_else(|| panic!("no trimmed copy"));
        assert_eq!(t.body().len(), 10);
        assert_eq!(h(&t, "user"), None);
        assert_eq!(
            h(&t, headers::HEADERS_DROPPED),
            Some(&AMQPValue::LongLongInt(1))
        );
        assert!(size_ok(&t));
    }

    #[test]
    fn without_a_source_queue_there_is_nowhere_to_park() {
        let e = Envelope::new("", "q", "x");
        let err = crate::Error::Config("x".into());
        assert!(parking_copy(&e, &err, 1000, size_ok).is_none());
    }
}
