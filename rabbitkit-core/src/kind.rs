//! Error kinds: a short name a handler error carries (`inventory`, `timeout`, `card`), written
//! to the evidence headers, counted, filtered on at replay, and routed by
//! [`RetryPolicy::on_kind`](crate::RetryPolicy::on_kind) to a policy of its own.
//!
//! Three ways for an error to get a kind:
//!
//! - ad hoc, with `?`: `charge(&p).await.kind("payments")?` ([`ResultExt::kind`]), or
//!   [`Kinded::new`];
//! - typed: implement [`ErrorKind`] for your error enum (a `thiserror` enum maps each
//!   variant) and register it with
//!   [`Subscriber::error_kind`](crate::Subscriber::error_kind);
//! - tower's own errors: a `tower::timeout` layer's `Elapsed` is kind `timeout` (and counted
//!   as a timeout); a `load_shed` layer's `Overloaded` is not a failure at all: the delivery
//!   is requeued with backoff and no attempt is spent.
//!
//! Anything else is kind `error`.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use serde::Deserialize;

use crate::error::BoxError;
use crate::outcome::{ErrorClass, Permanent};

/// The kind of errors that say nothing of their own.
pub const DEFAULT_KIND: &str = "error";

/// The kinds rabbitkit gives failures itself, whatever the handler's errors: `error` (an
/// error that says nothing of its own), `timeout` (a deadline or a tower `timeout` layer),
/// `panic`, `decode` (an extractor's rejection), `requeue-limit`, `wiring` (a missing
/// `State`) and `idempotency-store`. An [`on_kind`](crate::RetryPolicy::on_kind) policy for
/// one of them is always accepted.
pub const BUILTIN_KINDS: &[&str] = &[
    DEFAULT_KIND,
    "timeout",
    "panic",
    "decode",
    "requeue-limit",
    "wiring",
    "idempotency-store",
];

/// A handler error with a kind of its own. Displays as the error it wraps.
#[derive(Debug)]
pub struct Kinded {
    kind: Cow<'static, str>,
    error: BoxError,
}

impl Kinded {
    /// Gives `error` the kind `kind`.
    pub fn new(kind: impl Into<Cow<'static, str>>, error: impl Into<BoxError>) -> Self {
        Self {
            kind: kind.into(),
            error: error.into(),
        }
    }

    /// The kind.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The wrapped error.
    pub fn error(&self) -> &BoxError {
        &self.error
    }
}

impl fmt::Display for Kinded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl std::error::Error for Kinded {
    // Transparent like `Permanent`: the evidence message is the wrapped error's chain.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.source()
    }
}

/// `?`-friendly kinds and permanence on any `Result` whose error converts into a
/// [`BoxError`].
///
/// ```
/// use rabbitkit_core::kind::ResultExt;
/// # fn reserve() -> Result<(), std::io::Error> { Ok(()) }
/// # fn run() -> Result<(), rabbitkit_core::BoxError> {
/// reserve().kind("inventory")?;        // retried under the `inventory` policy
/// reserve().permanent()?;              // parked at once
/// # Ok(()) }
/// ```
pub trait ResultExt<T> {
    /// Gives the error the kind `kind`.
    fn kind(self, kind: impl Into<Cow<'static, str>>) -> Result<T, Kinded>;
    /// Marks the error permanent: parked without retries.
    fn permanent(self) -> Result<T, Permanent>;
}

impl<T, E: Into<BoxError>> ResultExt<T> for Result<T, E> {
    fn kind(self, kind: impl Into<Cow<'static, str>>) -> Result<T, Kinded> {
        self.map_err(|e| Kinded::new(kind, e))
    }

    fn permanent(self) -> Result<T, Permanent> {
        self.map_err(Permanent::new)
    }
}

/// An error type that knows its kinds, registered with
/// [`Subscriber::error_kind`](crate::Subscriber::error_kind).
///
/// ```
/// use std::borrow::Cow;
/// use rabbitkit_core::kind::ErrorKind;
///
/// #[derive(Debug, thiserror::Error)]
/// enum ChargeError {
///     #[error("out of stock")]
///     OutOfStock,
///     #[error("card declined")]
///     Declined,
/// }
///
/// impl ErrorKind for ChargeError {
///     const KINDS: &'static [&'static str] = &["inventory", "card"];
///     fn kind(&self) -> Cow<'static, str> {
///         match self {
///             ChargeError::OutOfStock => "inventory".into(),
///             ChargeError::Declined => "card".into(),
///         }
///     }
///     fn is_permanent(&self) -> bool {
///         matches!(self, ChargeError::Declined)
///     }
/// }
/// ```
pub trait ErrorKind: std::error::Error + Send + Sync + 'static {
    /// Every kind [`kind`](Self::kind) can return. A subscriber refuses to start when an
    /// `on_kind` policy names a kind that neither a registered type lists, nor
    /// [`Subscriber::kinds`](crate::Subscriber::kinds) declares, nor rabbitkit gives itself
    /// ([`BUILTIN_KINDS`]): the policy could never apply.
    const KINDS: &'static [&'static str];
    /// This error's kind: one of [`KINDS`](Self::KINDS).
    fn kind(&self) -> Cow<'static, str>;
    /// Park at once, without retries (default: no).
    fn is_permanent(&self) -> bool {
        false
    }
}

/// Decides whether a handler error is retryable or permanent.
///
/// The default ([`DefaultClassifier`]) treats every error as retryable except
/// [`Permanent`]-wrapped ones: an unknown error must not skip the retries. Closures
/// `Fn(&BoxError) -> ErrorClass` implement it too.
pub trait Classify: Send + Sync + 'static {
    /// Classifies `error`.
    fn classify(&self, error: &BoxError) -> ErrorClass;

    /// The kind recorded for `error` (evidence header, logs, replay filters) and used to
    /// pick a [`RetryPolicy::on_kind`](crate::RetryPolicy::on_kind) policy. The default:
    /// a [`Kinded`] in its chain, `timeout` for tower's `Elapsed`, else `error`.
    fn kind(&self, error: &BoxError) -> Cow<'static, str> {
        default_kind(error)
    }
}

impl<F> Classify for F
where
    F: Fn(&BoxError) -> ErrorClass + Send + Sync + 'static,
{
    fn classify(&self, error: &BoxError) -> ErrorClass {
        self(error)
    }
}

/// Retryable unless the error (or one of its sources) is [`Permanent`].
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultClassifier;

impl Classify for DefaultClassifier {
    fn classify(&self, error: &BoxError) -> ErrorClass {
        if chain(error.as_ref()).any(|e| e.is::<Permanent>()) {
            ErrorClass::Permanent
        } else {
            ErrorClass::Retryable
        }
    }
}

/// The errors of `error`'s chain, looking inside rabbitkit's transparent wrappers
/// ([`Permanent`], [`Kinded`]), whose `source` skips the wrapped error itself.
pub(crate) fn chain<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    let mut next = Some(error);
    // A chain is finite for every real error; the bound keeps a cyclic `source` from
    // looping (a classifier runs on every failure).
    std::iter::from_fn(move || {
        let cur = next?;
        next = if let Some(p) = cur.downcast_ref::<Permanent>() {
            Some(p.0.as_ref())
        } else if let Some(k) = cur.downcast_ref::<Kinded>() {
            Some(k.error.as_ref())
        } else {
            cur.source()
        };
        Some(cur)
    })
    .take(64)
}

/// The kind of `error` as the default classifier sees it: the first [`Kinded`] in its
/// chain, `timeout` for tower's `Elapsed`, else [`DEFAULT_KIND`].
pub(crate) fn default_kind(error: &BoxError) -> Cow<'static, str> {
    for e in chain(error.as_ref()) {
        if let Some(k) = e.downcast_ref::<Kinded>() {
            return k.kind.clone();
        }
        if e.is::<tower::timeout::error::Elapsed>() {
            return Cow::Borrowed("timeout");
        }
    }
    Cow::Borrowed(DEFAULT_KIND)
}

/// Whether `error` is tower's load-shedding refusal: the service had no capacity, the
/// handler never ran.
pub(crate) fn is_overloaded(error: &BoxError) -> bool {
    chain(error.as_ref()).any(|e| e.is::<tower::load_shed::error::Overloaded>())
}

/// Whether `error` is a tower `timeout` layer's `Elapsed`.
pub(crate) fn is_elapsed(error: &BoxError) -> bool {
    chain(error.as_ref()).any(|e| e.is::<tower::timeout::error::Elapsed>())
}

/// The kinds a subscriber's failures can carry, as far as its definition says: what
/// `on_kind` policies are checked against at start.
#[derive(Debug, Clone, Default)]
pub(crate) struct KnownKinds {
    /// Kinds listed by registered [`ErrorKind`] types or declared for ad-hoc errors.
    names: BTreeSet<Cow<'static, str>>,
    /// The registered [`ErrorKind`] types, for the refusal's message.
    types: Vec<&'static str>,
    /// A custom classifier decides kinds rabbitkit cannot see: nothing is refused.
    pub(crate) open: bool,
}

impl KnownKinds {
    /// Adds the kinds of a registered type.
    pub(crate) fn register<E: ErrorKind>(&mut self) {
        self.types.push(std::any::type_name::<E>());
        self.names
            .extend(E::KINDS.iter().map(|k| Cow::Borrowed(*k)));
    }

    /// Adds kinds given ad hoc ([`Kinded`], [`ResultExt::kind`], a `Failure` of one's own).
    pub(crate) fn declare(&mut self, kinds: impl IntoIterator<Item = Cow<'static, str>>) {
        self.names.extend(kinds);
    }

    /// The kinds `rabbitkit_failures_total` has a series of: rabbitkit's own
    /// ([`BUILTIN_KINDS`], and `bad-signature` for a forged delivery), the registered
    /// types', the declared ones. Never a custom classifier's: a label's values stay
    /// bounded whatever a handler puts in a kind; any other kind is counted as `other`.
    pub(crate) fn metric_kinds(&self) -> Vec<String> {
        let mut kinds: BTreeSet<&str> = BUILTIN_KINDS.iter().copied().collect();
        kinds.insert("bad-signature");
        kinds.extend(self.names.iter().map(|k| k.as_ref()));
        kinds.into_iter().map(str::to_owned).collect()
    }

    /// Whether a failure can carry `kind`.
    fn knows(&self, kind: &str) -> bool {
        self.open || BUILTIN_KINDS.contains(&kind) || self.names.contains(kind)
    }

    /// Refuses the first of `policies` no failure can carry.
    pub(crate) fn check<'a>(
        &self,
        subscriber: &str,
        mut policies: impl Iterator<Item = &'a String>,
    ) -> crate::Result<()> {
        let Some(kind) = policies.find(|k| !self.knows(k)) else {
            return Ok(());
        };
        let mut known: Vec<String> = BUILTIN_KINDS.iter().map(|k| (*k).to_owned()).collect();
        known.extend(self.names.iter().map(|k| k.to_string()));
        known.sort();
        known.dedup();
        Err(crate::Error::UnknownKind {
            subscriber: subscriber.to_owned(),
            kind: kind.clone(),
            registered: self.types.iter().map(|t| (*t).to_owned()).collect(),
            known,
        })
    }
}

/// A classifier that knows the kinds of `E` and defers to `inner` for everything else.
pub(crate) struct KindsOf<E> {
    pub(crate) inner: std::sync::Arc<dyn Classify>,
    pub(crate) _e: PhantomData<fn() -> E>,
}

impl<E: ErrorKind> KindsOf<E> {
    fn find(error: &BoxError) -> Option<&E> {
        chain(error.as_ref()).find_map(|e| e.downcast_ref::<E>())
    }
}

impl<E: ErrorKind> Classify for KindsOf<E> {
    fn classify(&self, error: &BoxError) -> ErrorClass {
        match Self::find(error) {
            Some(e) if e.is_permanent() => ErrorClass::Permanent,
            _ => self.inner.classify(error),
        }
    }

    fn kind(&self, error: &BoxError) -> Cow<'static, str> {
        match Self::find(error) {
            Some(e) => e.kind(),
            None => self.inner.kind(error),
        }
    }
}

/// What the [`RetryPolicy`](crate::RetryPolicy) does with failures of one kind.
///
/// In TOML, under a subscriber's retry table:
///
/// ```toml
/// [subscribers.retry.kinds.inventory]   # its own schedule and limit
/// tiers = ["30s", "5m"]
/// max-attempts = 10
///
/// [subscribers.retry.kinds.validation]  # straight to parking
/// park = true
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct KindPolicy {
    /// Park at once (reason `permanent`): no retry for this kind.
    #[serde(default)]
    pub park: bool,
    /// This kind's delay tiers (default: the policy's).
    #[serde(default, deserialize_with = "de_opt_durations")]
    pub tiers: Option<Vec<Duration>>,
    /// This kind's attempt limit (default: the policy's).
    #[serde(default)]
    pub max_attempts: Option<u32>,
}

impl KindPolicy {
    /// Failures of this kind are parked at once.
    pub fn park() -> Self {
        Self {
            park: true,
            ..Self::default()
        }
    }

    /// Failures of this kind are retried through these tiers.
    pub fn tiers(tiers: impl IntoIterator<Item = Duration>) -> Self {
        Self {
            tiers: Some(tiers.into_iter().collect()),
            ..Self::default()
        }
    }

    /// Failures of this kind are parked after `n` attempts.
    #[must_use]
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = Some(n);
        self
    }
}

pub(crate) fn de_opt_durations<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<Duration>>, D::Error> {
    let raw: Vec<String> = Vec::deserialize(d)?;
    raw.iter()
        .map(|s| humantime::parse_duration(s).map_err(serde::de::Error::custom))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// Checks the per-kind policies: a kind is a short name, `park` excludes a schedule, and
/// limits are at least 1.
pub(crate) fn validate(kinds: &BTreeMap<String, KindPolicy>) -> crate::Result<()> {
    for (kind, p) in kinds {
        let named = |what: &str| crate::Error::Config(format!("retry kind {kind:?}: {what}"));
        if kind.is_empty()
            || kind.len() > 64
            || !kind
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            return Err(named(
                "a kind is 1-64 characters of letters, digits, '-', '_' or '.'",
            ));
        }
        if p.park && (p.tiers.is_some() || p.max_attempts.is_some()) {
            return Err(named(
                "`park` parks at once: it takes no tiers or max-attempts",
            ));
        }
        if !p.park && p.tiers.is_none() && p.max_attempts.is_none() {
            return Err(named(
                "says nothing: give `park`, `tiers` or `max-attempts`",
            ));
        }
        if p.max_attempts == Some(0) {
            return Err(named("max-attempts must be at least 1"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct OuterPermanent(#[source] Permanent);

    #[test]
    fn unknown_errors_are_retryable_permanent_ones_park() {
        let c = DefaultClassifier;
        let e: BoxError = "db down".into();
        assert_eq!(c.classify(&e), ErrorClass::Retryable);
        let p: BoxError = Box::new(Permanent::new("bad order"));
        assert_eq!(c.classify(&p), ErrorClass::Permanent);
        let nested: BoxError = Box::new(OuterPermanent(Permanent::new("deep")));
        assert_eq!(c.classify(&nested), ErrorClass::Permanent);
    }

    #[test]
    fn closures_classify() {
        let c = |e: &BoxError| {
            if e.to_string().contains("400") {
                ErrorClass::Permanent
            } else {
                ErrorClass::Retryable
            }
        };
        assert_eq!(c.classify(&"http 400".into()), ErrorClass::Permanent);
    }

    #[derive(Debug, thiserror::Error)]
    enum Shop {
        #[error("out of stock")]
        Stock,
        #[error("declined")]
        Declined,
    }

    impl ErrorKind for Shop {
        const KINDS: &'static [&'static str] = &["inventory", "card"];
        fn kind(&self) -> Cow<'static, str> {
            match self {
                Shop::Stock => "inventory".into(),
                Shop::Declined => "card".into(),
            }
        }
        fn is_permanent(&self) -> bool {
            matches!(self, Shop::Declined)
        }
    }

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Kinded);

    fn kinds() -> KindsOf<Shop> {
        KindsOf {
            inner: std::sync::Arc::new(DefaultClassifier),
            _e: PhantomData,
        }
    }

    #[test]
    fn kinded_errors_and_tower_elapsed_have_their_kind() {
        let e: BoxError = Box::new(Kinded::new("inventory", "no stock"));
        assert_eq!(default_kind(&e), "inventory");
        assert_eq!(e.to_string(), "no stock");
        let nested: BoxError = Box::new(Outer(Kinded::new("deep", "x")));
        assert_eq!(default_kind(&nested), "deep");
        let inside_permanent: BoxError = Box::new(Permanent::new(Kinded::new("card", "no")));
        assert_eq!(default_kind(&inside_permanent), "card");
        let elapsed: BoxError = Box::new(tower::timeout::error::Elapsed::new());
        assert_eq!(default_kind(&elapsed), "timeout");
        assert!(is_elapsed(&elapsed));
        let plain: BoxError = "db down".into();
        assert_eq!(default_kind(&plain), DEFAULT_KIND);
        let shed: BoxError = Box::new(tower::load_shed::error::Overloaded::new());
        assert!(is_overloaded(&shed) && !is_overloaded(&plain));
    }

    #[test]
    fn result_ext_gives_kinds_and_permanence_with_the_question_mark() {
        let r: Result<(), std::io::Error> = Err(std::io::Error::other("boom"));
        let e: BoxError = r
            .kind("io")
            .err()
            .map(Into::into)
            .unwrap_or_else(|| "".into());
        assert_eq!(default_kind(&e), "io");
        let r: Result<(), &str> = Err("bad");
        let e: BoxError = r
            .permanent()
            .err()
            .map(Into::into)
            .unwrap_or_else(|| "".into());
        let c = DefaultClassifier;
        assert_eq!(c.classify(&e), ErrorClass::Permanent);
    }

    #[test]
    fn typed_kinds_name_each_variant_and_may_be_permanent() {
        let c = kinds();
        let stock: BoxError = Box::new(Shop::Stock);
        assert_eq!(c.kind(&stock), "inventory");
        assert_eq!(c.classify(&stock), ErrorClass::Retryable);
        let declined: BoxError = Box::new(Shop::Declined);
        assert_eq!(c.kind(&declined), "card");
        assert_eq!(c.classify(&declined), ErrorClass::Permanent);
        let other: BoxError = Box::new(Kinded::new("net", "reset"));
        assert_eq!(
            c.kind(&other),
            "net",
            "others keep the inner classifier's kind"
        );
    }

    #[test]
    fn on_kind_naming_a_kind_nothing_produces_is_refused_with_what_is_known() {
        let policies = |ks: &[&str]| ks.iter().map(|k| (*k).to_owned()).collect::<Vec<_>>();
        let mut known = KnownKinds::default();
        // Built-in kinds need nothing registered.
        let builtin = policies(&["timeout", "panic", "decode", "error", "requeue-limit"]);
        assert!(known.check("charge", builtin.iter()).is_ok());
        // A kind only a type would produce, with the type not registered.
        let typed = policies(&["timeout", "card"]);
        match known.check("charge", typed.iter()) {
            Err(crate::Error::UnknownKind {
                subscriber,
                kind,
                registered,
                known,
            }) => {
                assert_eq!((subscriber.as_str(), kind.as_str()), ("charge", "card"));
                assert!(registered.is_empty());
                assert!(known.contains(&"timeout".to_owned()));
            }
            other => panic!("expected UnknownKind, got {other:?}"),
        }
        known.register::<Shop>();
        assert!(
            known.check("charge", typed.iter()).is_ok(),
            "Shop lists `card`"
        );
        let err = known
            .check("charge", policies(&["validation"]).iter())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("\"validation\"") && err.contains("Shop") && err.contains("inventory"),
            "{err}"
        );
        // Ad-hoc kinds are declared; a custom classifier is not second-guessed.
        known.declare([Cow::Borrowed("validation")]);
        assert!(
            known
                .check("charge", policies(&["validation"]).iter())
                .is_ok()
        );
        let open = KnownKinds {
            open: true,
            ..KnownKinds::default()
        };
        assert!(open.check("charge", policies(&["anything"]).iter()).is_ok());
    }

    #[test]
    fn kind_policies_are_checked() {
        let one = |k: &str, p: KindPolicy| BTreeMap::from([(k.to_owned(), p)]);
        assert!(validate(&one("inventory", KindPolicy::park())).is_ok());
        assert!(
            validate(&one(
                "inventory",
                KindPolicy::tiers([Duration::from_secs(1)])
            ))
            .is_ok()
        );
        assert!(validate(&one("", KindPolicy::park())).is_err());
        assert!(validate(&one("a b", KindPolicy::park())).is_err());
        assert!(validate(&one("x", KindPolicy::default())).is_err());
        assert!(validate(&one("x", KindPolicy::park().max_attempts(2))).is_err());
        assert!(validate(&one("x", KindPolicy::default().max_attempts(0))).is_err());
    }
}
