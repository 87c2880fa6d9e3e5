//! Which of rabbitkit's own headers a delivery is believed on.
//!
//! The attempt number and the original exchange and routing key travel in headers
//! (`x-rabbitkit-attempt`, `x-rabbitkit-original-*`) that any producer can also write: a
//! producer allowed to publish `order.created` could make a handler see
//! `order.refund.approve`, or have a first delivery parked as if it had failed five times.
//! The broker's `x-death` does not tell a real retry copy from a forged one (a client can set
//! it on RabbitMQ 3.10–3.13, and the delay tiers dead-letter through the default exchange,
//! to which any producer may publish). So rabbitkit signs what it writes: an HMAC-SHA256
//! over the attempt, the original route and the body (not the message id: the
//! publisher gives a copy without one an id of its own as it sends it), in
//! [`headers::SIGNATURE`], under a key only the workers (and the operator CLI that
//! replays) hold.
//!
//! A delivery's own headers are believed when:
//! - their signature verifies under the current or the previous key (rotation: deploy the
//!   new key as current with the old one as previous, then drop the previous one once the
//!   longest delay tier has emptied);
//! - they are unsigned, and unsigned copies are accepted (during a rolling upgrade, and
//!   always when no key is set: a loud warning at start says what that leaves open), and
//!   either the broker's `x-death` says the message expired out of one of this queue's
//!   delay tiers (a copy written by a release that did not sign, still waiting in a tier),
//!   or it is a replayed copy ([`headers::REPLAYED`]) that carries no attempt header (a
//!   replay starts again at attempt 1; only its original route is believed).
//!
//! Otherwise they are ignored (the delivery is attempt 1 on the route it arrived by), with a
//! warning and the `rabbitkit_untrusted_headers_total` counter.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use lapin::types::{AMQPValue, FieldTable};
use sha2::Sha256;

use crate::headers;

/// The environment variable [`HeaderKeys::from_env`] reads the current key from.
pub const KEY_ENV: &str = "RABBITKIT_HEADER_KEY";
/// The environment variable [`HeaderKeys::from_env`] reads the previous key from.
pub const PREVIOUS_KEY_ENV: &str = "RABBITKIT_HEADER_KEY_PREVIOUS";
/// The shortest key accepted, in bytes.
pub const MIN_KEY_LEN: usize = 16;

/// The signature's version prefix: a later scheme can be told apart and rolled out.
const VERSION: &str = "v1:";

/// A header-signing setting that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// A key too short to sign with.
    #[error("a header key must be at least {MIN_KEY_LEN} bytes ({source_name} has {len})")]
    TooShort {
        /// Where the key came from (an environment variable, or `key`).
        source_name: String,
        /// Its length in bytes.
        len: usize,
    },
    /// [`UNSIGNED_WINDOW_ENV`] is not a duration.
    #[error("{UNSIGNED_WINDOW_ENV} = {value:?} is not a duration ({reason})")]
    BadWindow {
        /// The value found.
        value: String,
        /// Why it does not parse.
        reason: String,
    },
}

/// The keys rabbitkit signs and verifies its own headers with: a current key, and
/// optionally the previous one, still accepted while copies it signed may wait in a tier.
#[derive(Clone)]
pub struct HeaderKeys {
    current: Arc<[u8]>,
    previous: Option<Arc<[u8]>>,
}

impl fmt::Debug for HeaderKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeaderKeys")
            .field("current", &"<redacted>")
            .field("previous", &self.previous.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl HeaderKeys {
    /// Signs with `key` (at least [`MIN_KEY_LEN`] bytes; 32 random bytes are best).
    pub fn new(key: impl AsRef<[u8]>) -> Result<Self, KeyError> {
        Ok(Self {
            current: checked(key.as_ref(), "key")?,
            previous: None,
        })
    }

    /// Also accepts signatures made with `key` (the key being rotated out).
    pub fn with_previous(mut self, key: impl AsRef<[u8]>) -> Result<Self, KeyError> {
        self.previous = Some(checked(key.as_ref(), "previous key")?);
        Ok(self)
    }

    /// The keys in [`KEY_ENV`] and [`PREVIOUS_KEY_ENV`]; `None` when [`KEY_ENV`] is unset
    /// or empty.
    pub fn from_env() -> Result<Option<Self>, KeyError> {
        let read = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let Some(current) = read(KEY_ENV) else {
            return Ok(None);
        };
        let mut keys = Self {
            current: checked(current.as_bytes(), KEY_ENV)?,
            previous: None,
        };
        if let Some(previous) = read(PREVIOUS_KEY_ENV) {
            keys.previous = Some(checked(previous.as_bytes(), PREVIOUS_KEY_ENV)?);
        }
        Ok(Some(keys))
    }

    /// The signature of `headers` (what rabbitkit wrote of its own) and `body`.
    pub(crate) fn sign(&self, headers: &FieldTable, body: &[u8]) -> String {
        let tag = mac(&self.current, headers, body);
        let mut out = String::with_capacity(VERSION.len() + tag.len() * 2);
        out.push_str(VERSION);
        for b in tag {
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        }
        out
    }

    /// Whether `signature` is a valid signature under the current or the previous key.
    fn verify(&self, signature: &str, headers: &FieldTable, body: &[u8]) -> bool {
        let Some(tag) = signature.strip_prefix(VERSION).and_then(unhex) else {
            return false;
        };
        std::iter::once(&self.current)
            .chain(self.previous.as_ref())
            .any(|key| mac_matches(key, headers, body, &tag))
    }
}

fn checked(key: &[u8], source_name: &str) -> Result<Arc<[u8]>, KeyError> {
    if key.len() < MIN_KEY_LEN {
        return Err(KeyError::TooShort {
            source_name: source_name.to_owned(),
            len: key.len(),
        });
    }
    Ok(Arc::from(key))
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    s.as_bytes()
        .chunks(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

/// The headers a signature covers: the ones that decide the attempt number and the route,
/// and the queue the copy was made for (a signed copy of one queue is not believed in
/// another, should two services share a key).
pub(crate) const SIGNED: [&str; 4] = [
    headers::ATTEMPT,
    headers::ORIGINAL_EXCHANGE,
    headers::ORIGINAL_ROUTING_KEY,
    headers::SOURCE_QUEUE,
];

fn keyed(key: &[u8], hdrs: &FieldTable, body: &[u8]) -> Hmac<Sha256> {
    // An HMAC takes a key of any length, so `new_from_slice` does not fail; were it to,
    // the all-zero key signs nothing a worker would accept.
    let mut m = Hmac::<Sha256>::new_from_slice(key)
        .unwrap_or_else(|_| <Hmac<Sha256> as hmac::digest::KeyInit>::new(&Default::default()));
    m.update(b"rabbitkit-headers-v1");
    // Each field length-prefixed (absent: a marker), so no two inputs share a byte string.
    let mut field = |present: Option<&[u8]>| match present {
        Some(bytes) => {
            m.update(&[1]);
            m.update(&(bytes.len() as u64).to_be_bytes());
            m.update(bytes);
        }
        None => m.update(&[0]),
    };
    for name in SIGNED {
        let text = headers::get(Some(hdrs), name).map(canonical);
        field(text.as_deref().map(str::as_bytes));
    }
    field(Some(body));
    m
}

/// A header value as signed: integers by value (whatever their AMQP width), strings as
/// they are, anything else by its debug form (never written by rabbitkit, so never valid).
fn canonical(v: &AMQPValue) -> String {
    match (headers::int(v), headers::string(v)) {
        (Some(n), _) => format!("i{n}"),
        (None, Some(s)) => format!("s{s}"),
        (None, None) => format!("?{v:?}"),
    }
}

fn mac(key: &[u8], hdrs: &FieldTable, body: &[u8]) -> Vec<u8> {
    keyed(key, hdrs, body).finalize().into_bytes().to_vec()
}

fn mac_matches(key: &[u8], hdrs: &FieldTable, body: &[u8], tag: &[u8]) -> bool {
    // Constant-time comparison.
    keyed(key, hdrs, body).verify_slice(tag).is_ok()
}

/// How long after [`HeaderTrust::signed`] unsigned tier copies and replays are still
/// believed by default: a rolling upgrade's copies written by the previous release (which
/// did not sign) wait at most the longest tier's delay once its last worker is gone.
pub const DEFAULT_UNSIGNED_WINDOW: Duration = Duration::from_secs(15 * 60);

/// The environment variable that sets the unsigned window of a key read from the
/// environment (a humantime duration, `0s` for none).
pub const UNSIGNED_WINDOW_ENV: &str = "RABBITKIT_HEADER_ACCEPT_UNSIGNED_FOR";

/// How a subscriber decides whether a delivery's own headers are rabbitkit's.
#[derive(Clone, Debug)]
pub struct HeaderTrust {
    keys: Option<HeaderKeys>,
    unsigned: Unsigned,
}

/// When unsigned tier copies and replays are believed.
#[derive(Clone, Copy, Debug)]
enum Unsigned {
    Always,
    Until(Instant),
    Never,
}

impl Default for HeaderTrust {
    /// No key: unsigned copies are believed when `x-death` says they left a delay tier, and
    /// unsigned replays.
    fn default() -> Self {
        Self {
            keys: None,
            unsigned: Unsigned::Always,
        }
    }
}

/// The verdict on one delivery's own headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// It carries none of the headers a signature covers.
    None,
    /// Signed with a key in use.
    Signed,
    /// Unsigned, from one of the queue's delay tiers (`x-death`), and such copies are
    /// accepted.
    TierCopy,
    /// Unsigned, a replayed copy without an attempt header, and such copies are accepted.
    Replay,
    /// Ignored: unsigned and not from a tier, or unsigned copies are refused.
    Unsigned,
    /// Ignored: a signature that does not verify (another key, altered headers or body),
    /// or a signed copy made for another queue. The runtime parks such a delivery without
    /// running the handler (reason `bad-signature`).
    BadSignature,
}

impl Verdict {
    /// Whether the headers are believed.
    pub fn trusted(self) -> bool {
        matches!(
            self,
            Verdict::None | Verdict::Signed | Verdict::TierCopy | Verdict::Replay
        )
    }

    /// `none`, `signed`, `tier-copy`, `replay`, `unsigned`, `bad-signature`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::None => "none",
            Verdict::Signed => "signed",
            Verdict::TierCopy => "tier-copy",
            Verdict::Replay => "replay",
            Verdict::Unsigned => "unsigned",
            Verdict::BadSignature => "bad-signature",
        }
    }
}

impl HeaderTrust {
    /// Signs with `keys` and believes signed headers; unsigned copies from the queue's own
    /// tiers, and unsigned replays, only during [`DEFAULT_UNSIGNED_WINDOW`] from now (for
    /// copies a previous release left in the tiers during a rolling upgrade, and replays
    /// made by its operator CLI). After the window only signed headers count.
    pub fn signed(keys: HeaderKeys) -> Self {
        Self {
            keys: Some(keys),
            unsigned: Unsigned::Until(Instant::now() + DEFAULT_UNSIGNED_WINDOW),
        }
    }

    /// Whether unsigned copies are believed when `x-death` says they left one of the
    /// queue's delay tiers, or when they are replays without an attempt header: always
    /// (`true`), or never (`false`: only signed headers count). Without a key, `false`
    /// ignores every own header (no retry keeps its attempt).
    pub fn accept_unsigned_copies(mut self, on: bool) -> Self {
        self.unsigned = if on {
            Unsigned::Always
        } else {
            Unsigned::Never
        };
        self
    }

    /// Believes unsigned tier copies and replays for `window` from now, then only signed
    /// headers: as long as a rolling upgrade from a release that did not sign takes, plus
    /// the longest tier's delay.
    pub fn accept_unsigned_for(mut self, window: Duration) -> Self {
        self.unsigned = match Instant::now().checked_add(window) {
            Some(until) => Unsigned::Until(until),
            None => Unsigned::Always,
        };
        self
    }

    /// The keys and window of the environment: [`KEY_ENV`], [`PREVIOUS_KEY_ENV`] and
    /// [`UNSIGNED_WINDOW_ENV`]; without a key, [`HeaderTrust::default`].
    pub fn from_env() -> Result<Self, KeyError> {
        let Some(keys) = HeaderKeys::from_env()? else {
            return Ok(Self::default());
        };
        let trust = Self::signed(keys);
        match std::env::var(UNSIGNED_WINDOW_ENV)
            .ok()
            .filter(|v| !v.is_empty())
        {
            None => Ok(trust),
            Some(v) => match humantime::parse_duration(&v) {
                Ok(window) => Ok(trust.accept_unsigned_for(window)),
                Err(e) => Err(KeyError::BadWindow {
                    value: v,
                    reason: e.to_string(),
                }),
            },
        }
    }

    pub(crate) fn accepts_unsigned(&self) -> bool {
        match self.unsigned {
            Unsigned::Always => true,
            Unsigned::Never => false,
            Unsigned::Until(t) => Instant::now() < t,
        }
    }

    /// The signing keys, if any.
    pub fn keys(&self) -> Option<&HeaderKeys> {
        self.keys.as_ref()
    }

    /// The verdict on a delivery of `work_queue` with these properties and body.
    pub fn judge(&self, hdrs: Option<&FieldTable>, body: &[u8], work_queue: &str) -> Verdict {
        let Some(h) = hdrs else {
            return Verdict::None;
        };
        // `x-death` naming one of this queue's tiers counts as an own header: its expiries
        // would count as attempts.
        if SIGNED.iter().all(|n| !h.inner().contains_key(*n)) && !names_own_tier(hdrs, work_queue) {
            return Verdict::None;
        }
        if let (Some(keys), Some(sig)) = (
            &self.keys,
            headers::get(hdrs, headers::SIGNATURE).and_then(headers::string),
        ) {
            let for_this_queue = headers::get(hdrs, headers::SOURCE_QUEUE)
                .and_then(headers::string)
                .is_none_or(|q| q == work_queue);
            return if keys.verify(&sig, h, body) && for_this_queue {
                Verdict::Signed
            } else {
                Verdict::BadSignature
            };
        }
        if !self.accepts_unsigned() {
            return Verdict::Unsigned;
        }
        if from_own_tier(hdrs, work_queue) {
            Verdict::TierCopy
        } else if h.inner().contains_key(headers::REPLAYED)
            && !h.inner().contains_key(headers::ATTEMPT)
        {
            Verdict::Replay
        } else {
            Verdict::Unsigned
        }
    }

    /// Signs `hdrs` as rabbitkit signs its own copies: adds the signature of their attempt
    /// and original-route headers and of `body` when a key is set, and drops a stale
    /// signature when none is (for tools that republish a message with rabbitkit's headers,
    /// and tests that publish what a retry copy would carry).
    pub fn sign(&self, hdrs: &mut FieldTable, body: &[u8]) {
        match &self.keys {
            Some(keys) => {
                let sig = keys.sign(hdrs, body);
                hdrs.insert(headers::SIGNATURE.into(), AMQPValue::LongString(sig.into()));
            }
            None => {
                let mut map = hdrs.inner().clone();
                if map.remove(headers::SIGNATURE).is_some() {
                    *hdrs = FieldTable::from(map);
                }
            }
        }
    }
}

/// Whether any `x-death` entry names one of `work_queue`'s delay tiers.
fn names_own_tier(hdrs: Option<&FieldTable>, work_queue: &str) -> bool {
    let Some(AMQPValue::FieldArray(arr)) = headers::get(hdrs, "x-death") else {
        return false;
    };
    arr.as_slice().iter().any(|v| {
        v.as_field_table()
            .and_then(|t| t.inner().get("queue").and_then(headers::string))
            .is_some_and(|q| crate::retry::is_tier_of(&q, work_queue))
    })
}

/// Whether the newest `x-death` entry says the message expired out of one of
/// `work_queue`'s delay tiers.
fn from_own_tier(hdrs: Option<&FieldTable>, work_queue: &str) -> bool {
    let Some(AMQPValue::FieldArray(arr)) = headers::get(hdrs, "x-death") else {
        return false;
    };
    arr.as_slice()
        .first()
        .and_then(|v| v.as_field_table())
        .is_some_and(|t| {
            let t = t.inner();
            let s = |k: &str| t.get(k).and_then(headers::string);
            s("reason").as_deref() == Some("expired")
                && s("queue").is_some_and(|q| crate::retry::is_tier_of(&q, work_queue))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own(attempt: i64, rk: &str) -> FieldTable {
        let mut h = FieldTable::default();
        h.insert(headers::ATTEMPT.into(), AMQPValue::LongLongInt(attempt));
        h.insert(
            headers::ORIGINAL_ROUTING_KEY.into(),
            AMQPValue::LongString(rk.into()),
        );
        h
    }

    fn keys(k: &str) -> HeaderKeys {
        HeaderKeys::new(k).unwrap_or_else(|e| panic!("{e}"))
    }

    fn x_death(h: &mut FieldTable, queue: &str, reason: &str) {
        let mut e = FieldTable::default();
        e.insert("queue".into(), AMQPValue::LongString(queue.into()));
        e.insert("reason".into(), AMQPValue::LongString(reason.into()));
        e.insert("count".into(), AMQPValue::LongLongInt(1));
        h.insert(
            "x-death".into(),
            AMQPValue::FieldArray(vec![AMQPValue::FieldTable(e)].into()),
        );
    }

    #[test]
    fn signed_headers_are_believed_and_any_change_is_not() {
        let trust = HeaderTrust::signed(keys("0123456789abcdef-current"));
        let mut h = own(3, "order.created");
        trust.sign(&mut h, b"{}");
        assert_eq!(trust.judge(Some(&h), b"{}", "orders"), Verdict::Signed);
        // Another body, attempt or route under the same signature: refused.
        assert_eq!(
            trust.judge(Some(&h), b"{ }", "orders"),
            Verdict::BadSignature
        );
        let mut forged = h.clone();
        forged.insert(headers::ATTEMPT.into(), AMQPValue::LongLongInt(5));
        assert_eq!(
            trust.judge(Some(&forged), b"{}", "orders"),
            Verdict::BadSignature
        );
        let mut rerouted = h.clone();
        rerouted.insert(
            headers::ORIGINAL_ROUTING_KEY.into(),
            AMQPValue::LongString("order.refund.approve".into()),
        );
        assert_eq!(
            trust.judge(Some(&rerouted), b"{}", "orders"),
            Verdict::BadSignature
        );
        // The integer width does not matter (a republisher may widen it).
        let mut wide = h.clone();
        wide.insert(headers::ATTEMPT.into(), AMQPValue::LongInt(3));
        assert_eq!(trust.judge(Some(&wide), b"{}", "orders"), Verdict::Signed);
    }

    #[test]
    fn another_key_is_refused_and_the_previous_key_still_verifies() {
        let old = HeaderTrust::signed(keys("old-key-0123456789"));
        let mut h = own(2, "k");
        old.sign(&mut h, b"x");
        let other = HeaderTrust::signed(keys("other-key-0123456789"));
        assert_eq!(other.judge(Some(&h), b"x", "q"), Verdict::BadSignature);
        let rotated = HeaderTrust::signed(
            keys("new-key-0123456789")
                .with_previous("old-key-0123456789")
                .unwrap_or_else(|e| panic!("{e}")),
        );
        assert_eq!(rotated.judge(Some(&h), b"x", "q"), Verdict::Signed);
    }

    #[test]
    fn unsigned_headers_count_only_from_the_queues_own_tiers() {
        let trust = HeaderTrust::signed(keys("0123456789abcdef"));
        let mut h = own(4, "order.created");
        assert_eq!(trust.judge(Some(&h), b"", "orders"), Verdict::Unsigned);
        x_death(&mut h, "payments.delay.5s", "expired");
        assert_eq!(trust.judge(Some(&h), b"", "orders"), Verdict::Unsigned);
        x_death(&mut h, "orders.delay.5s", "rejected");
        assert_eq!(trust.judge(Some(&h), b"", "orders"), Verdict::Unsigned);
        x_death(&mut h, "orders.delay.5s", "expired");
        assert_eq!(trust.judge(Some(&h), b"", "orders"), Verdict::TierCopy);
        let strict = trust.clone().accept_unsigned_copies(false);
        assert_eq!(strict.judge(Some(&h), b"", "orders"), Verdict::Unsigned);
        assert_eq!(
            HeaderTrust::default().judge(Some(&h), b"", "orders"),
            Verdict::TierCopy
        );
        assert_eq!(
            HeaderTrust::default().judge(Some(&own(4, "x")), b"", "orders"),
            Verdict::Unsigned
        );
    }

    #[test]
    fn unsigned_replays_keep_their_route_but_never_an_attempt() {
        let mut h = FieldTable::default();
        h.insert(
            headers::ORIGINAL_ROUTING_KEY.into(),
            AMQPValue::LongString("order.paid".into()),
        );
        h.insert(headers::REPLAYED.into(), AMQPValue::LongLongInt(1));
        let trust = HeaderTrust::default();
        assert_eq!(trust.judge(Some(&h), b"", "orders"), Verdict::Replay);
        h.insert(headers::ATTEMPT.into(), AMQPValue::LongLongInt(5));
        assert_eq!(trust.judge(Some(&h), b"", "orders"), Verdict::Unsigned);
        let mut map = h.inner().clone();
        map.remove(headers::ATTEMPT);
        let h = FieldTable::from(map);
        let strict = HeaderTrust::signed(keys("0123456789abcdef")).accept_unsigned_copies(false);
        assert_eq!(strict.judge(Some(&h), b"", "orders"), Verdict::Unsigned);
    }

    #[test]
    fn unsigned_copies_are_believed_only_within_the_window() {
        let mut h = own(2, "order.created");
        x_death(&mut h, "orders.delay.5s", "expired");
        let k = || keys("0123456789abcdef");
        assert_eq!(
            HeaderTrust::signed(k()).judge(Some(&h), b"", "orders"),
            Verdict::TierCopy,
            "within the default window"
        );
        let closed = HeaderTrust::signed(k()).accept_unsigned_for(Duration::ZERO);
        assert_eq!(closed.judge(Some(&h), b"", "orders"), Verdict::Unsigned);
    }

    #[test]
    fn a_forged_x_death_of_an_own_tier_needs_a_verdict() {
        let mut h = FieldTable::default();
        x_death(&mut h, "orders.delay.5s", "expired");
        let after_window =
            HeaderTrust::signed(keys("0123456789abcdef")).accept_unsigned_copies(false);
        assert_eq!(
            after_window.judge(Some(&h), b"", "orders"),
            Verdict::Unsigned
        );
        let mut other = FieldTable::default();
        x_death(&mut other, "payments.delay.5s", "expired");
        assert_eq!(
            after_window.judge(Some(&other), b"", "orders"),
            Verdict::None
        );
    }

    #[test]
    fn a_signed_copy_of_another_queue_is_refused() {
        let trust = HeaderTrust::signed(keys("0123456789abcdef"));
        let mut h = own(2, "k");
        h.insert(
            headers::SOURCE_QUEUE.into(),
            AMQPValue::LongString("payments".into()),
        );
        trust.sign(&mut h, b"x");
        assert_eq!(trust.judge(Some(&h), b"x", "payments"), Verdict::Signed);
        assert_eq!(trust.judge(Some(&h), b"x", "orders"), Verdict::BadSignature);
    }

    #[test]
    fn headers_without_own_fields_need_no_verdict() {
        let trust = HeaderTrust::signed(keys("0123456789abcdef"));
        assert_eq!(trust.judge(None, b"", "q"), Verdict::None);
        let mut h = FieldTable::default();
        h.insert("tenant".into(), AMQPValue::LongString("eu".into()));
        assert_eq!(trust.judge(Some(&h), b"", "q"), Verdict::None);
    }

    #[test]
    fn short_keys_are_refused_and_debug_redacts() {
        assert!(HeaderKeys::new("short").is_err());
        let k = keys("a-long-enough-secret");
        assert!(!format!("{k:?}").contains("secret"));
    }

    #[test]
    fn a_key_removed_drops_the_stale_signature() {
        let mut h = own(2, "k");
        HeaderTrust::signed(keys("0123456789abcdef")).sign(&mut h, b"");
        assert!(h.inner().contains_key(headers::SIGNATURE));
        HeaderTrust::default().sign(&mut h, b"");
        assert!(!h.inner().contains_key(headers::SIGNATURE));
    }
}
