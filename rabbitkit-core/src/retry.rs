//! The retry schedule: delay tiers, attempt limit, in-process immediate retries.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use crate::kind::KindPolicy;
use crate::queue_type::QueueType;

/// How a failing message is retried.
///
/// Each failed attempt `n` (1-based) is retried through the delay tier `tiers[n - 1]` (the
/// last tier repeats) until `max_attempts` handler runs have failed; then it is parked.
/// Tiers are TTL queues **named by delay** (`orders.delay.30s`), so changing the schedule
/// declares new queues instead of hitting `406 PRECONDITION_FAILED` on the old ones.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RetryPolicy {
    /// Delay tiers in order, e.g. `["1s", "10s", "1m", "10m"]`.
    #[serde(deserialize_with = "de_durations")]
    pub tiers: Vec<Duration>,
    /// Handler runs allowed before the message is parked (the first delivery counts).
    #[serde(default = "default_max_attempts")]
    pub max_attempts: u32,
    /// In-process re-runs before a failure goes to a tier; they do not count as attempts.
    #[serde(default)]
    pub immediate_retries: u32,
    /// Pause between immediate retries (doubles each time, with jitter when `jitter` is on).
    #[serde(with = "humantime_serde", default = "default_immediate_backoff")]
    pub immediate_backoff: Duration,
    /// Randomise immediate-retry pauses by up to ±50 %. Tier delays are queue TTLs and
    /// cannot be jittered per message (per-message expiry only fires at the queue head).
    #[serde(default)]
    pub jitter: bool,
    /// Policies by error kind ([`crate::kind`]): park at once, or own tiers and limit.
    /// Kinds not listed follow the policy above.
    #[serde(default)]
    pub kinds: BTreeMap<String, KindPolicy>,
}

fn default_max_attempts() -> u32 {
    5
}

fn default_immediate_backoff() -> Duration {
    Duration::from_millis(50)
}

fn de_durations<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Duration>, D::Error> {
    let raw: Vec<String> = Vec::deserialize(d)?;
    raw.iter()
        .map(|s| humantime::parse_duration(s).map_err(serde::de::Error::custom))
        .collect()
}

/// Where a failed attempt goes next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryStep {
    /// Publish a retry copy through this delay tier.
    Tier(Duration),
    /// No attempt left: park.
    Exhausted,
    /// The failure's kind parks at once ([`KindPolicy::park`]).
    ParkNow,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::new([
            Duration::from_secs(1),
            Duration::from_secs(10),
            Duration::from_secs(60),
            Duration::from_secs(600),
        ])
    }
}

impl RetryPolicy {
    /// A policy with these tiers and the default attempt limit (5).
    pub fn new(tiers: impl IntoIterator<Item = Duration>) -> Self {
        Self {
            tiers: tiers.into_iter().collect(),
            max_attempts: default_max_attempts(),
            immediate_retries: 0,
            immediate_backoff: default_immediate_backoff(),
            jitter: false,
            kinds: BTreeMap::new(),
        }
    }

    /// Failures of kind `kind` follow `policy` instead (parked at once, or their own tiers
    /// and attempt limit). Their tiers are declared with the others.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use rabbitkit_core::{RetryPolicy, kind::KindPolicy};
    /// let policy = RetryPolicy::default()
    ///     .on_kind("validation", KindPolicy::park())
    ///     .on_kind("inventory", KindPolicy::tiers([Duration::from_secs(30)]).max_attempts(10));
    /// # assert!(policy.validate().is_ok());
    /// ```
    #[must_use]
    pub fn on_kind(mut self, kind: impl Into<String>, policy: KindPolicy) -> Self {
        self.kinds.insert(kind.into(), policy);
        self
    }

    /// A policy from humantime tiers, as the `#[subscriber]` attribute and the TOML file
    /// take them (`["200ms", "30s", "5m"]`), for schedules read from the environment.
    ///
    /// ```
    /// # use rabbitkit_core::RetryPolicy;
    /// let tiers = std::env::var("ORDERS_RETRY").unwrap_or_else(|_| "1s,30s".into());
    /// let policy = RetryPolicy::from_humantime(tiers.split(','))?.max_attempts(4);
    /// # assert_eq!(policy.tiers.len(), 2);
    /// # Ok::<(), rabbitkit_core::Error>(())
    /// ```
    pub fn from_humantime<S: AsRef<str>>(
        tiers: impl IntoIterator<Item = S>,
    ) -> crate::Result<Self> {
        let tiers = tiers
            .into_iter()
            .map(|t| {
                let t = t.as_ref().trim();
                humantime::parse_duration(t)
                    .map_err(|e| crate::Error::Config(format!("retry tier {t:?}: {e}")))
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let policy = Self::new(tiers);
        policy.validate()?;
        Ok(policy)
    }

    /// No retries: the first failure parks.
    pub fn none() -> Self {
        Self::new([]).max_attempts(1)
    }

    /// Sets the attempt limit (at least 1).
    #[must_use]
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n.max(1);
        self
    }

    /// Sets the number of in-process immediate retries.
    #[must_use]
    pub fn immediate_retries(mut self, n: u32) -> Self {
        self.immediate_retries = n;
        self
    }

    /// Turns jitter of immediate-retry pauses on or off.
    #[must_use]
    pub fn jitter(mut self, on: bool) -> Self {
        self.jitter = on;
        self
    }

    /// Checks the policy: tiers must be at least 1 ms and fit a 32-bit TTL.
    pub fn validate(&self) -> crate::Result<()> {
        crate::kind::validate(&self.kinds)?;
        let kind_tiers = self
            .kinds
            .values()
            .filter_map(|k| k.tiers.as_ref())
            .flatten();
        for t in self.tiers.iter().chain(kind_tiers) {
            let ms = t.as_millis();
            if ms == 0 || ms > i32::MAX as u128 {
                return Err(crate::Error::Config(format!(
                    "retry tier {} must be between 1ms and {}ms",
                    humantime::format_duration(*t),
                    i32::MAX
                )));
            }
        }
        if self.max_attempts == 0 {
            return Err(crate::Error::Config(
                "max-attempts must be at least 1".into(),
            ));
        }
        Ok(())
    }

    /// Where attempt `attempt` (1-based) goes after failing. `requested` is a delay the
    /// handler asked for: the smallest tier at least that long is chosen (or the longest).
    pub fn next(&self, attempt: u32, requested: Option<Duration>) -> RetryStep {
        if attempt >= self.max_attempts || self.tiers.is_empty() {
            return RetryStep::Exhausted;
        }
        if let Some(want) = requested {
            let mut sorted = self.tiers.clone();
            sorted.sort();
            let pick = sorted
                .iter()
                .copied()
                .find(|t| *t >= want)
                .or_else(|| sorted.last().copied());
            return pick.map_or(RetryStep::Exhausted, RetryStep::Tier);
        }
        let i = (attempt as usize)
            .saturating_sub(1)
            .min(self.tiers.len() - 1);
        RetryStep::Tier(self.tiers[i])
    }

    /// Where a failure of kind `kind` at attempt `attempt` goes: the kind's own policy when
    /// [`RetryPolicy::on_kind`] names it, else [`RetryPolicy::next`].
    pub fn next_for(&self, kind: &str, attempt: u32, requested: Option<Duration>) -> RetryStep {
        let Some(k) = self.kinds.get(kind) else {
            return self.next(attempt, requested);
        };
        if k.park {
            return RetryStep::ParkNow;
        }
        let own = RetryPolicy {
            tiers: k.tiers.clone().unwrap_or_else(|| self.tiers.clone()),
            max_attempts: k.max_attempts.unwrap_or(self.max_attempts),
            ..RetryPolicy::new([])
        };
        own.next(attempt, requested)
    }

    /// The distinct tiers, for topology (the kinds' tiers included).
    pub fn distinct_tiers(&self) -> Vec<Duration> {
        let mut t = self.tiers.clone();
        t.extend(
            self.kinds
                .values()
                .filter_map(|k| k.tiers.clone())
                .flatten(),
        );
        t.sort();
        t.dedup();
        t
    }

    /// Pause before immediate retry number `n` (0-based): `immediate_backoff` doubled `n`
    /// times (capped at 5 s), then, with `jitter`, scaled by a random factor in 0.5–1.5.
    pub fn immediate_pause(&self, n: u32) -> Duration {
        let base = doubled(self.immediate_backoff, n, Duration::from_secs(5));
        if !self.jitter {
            return base;
        }
        // ±50 %, from a real random source: deliveries failing together must spread out.
        base.mul_f64(0.5 + fastrand::f64())
    }
}

/// `base` doubled `n` times (at most 16), capped at `cap`: every backoff in the crate
/// (immediate retries, reconnects, settlement pauses) grows this way.
pub(crate) fn doubled(base: Duration, n: u32, cap: Duration) -> Duration {
    base.saturating_mul(1u32 << n.min(16)).min(cap)
}

/// The name of the delay tier queue for `queue` and `delay`: `orders.delay.30s`.
///
/// This is the quorum tier (the default). Classic tiers, the opt-in and the shape of
/// earlier releases, are named [`classic_tier_queue`]: the two shapes never share a name, so
/// a classic tier is never redeclared as quorum (a `406`), and
/// [`Topology::migrate_tiers`](crate::topology::Topology::migrate_tiers) moves one into the
/// other.
pub fn tier_queue(queue: &str, delay: Duration) -> String {
    format!("{queue}{QUORUM_TIER}{}", tier_label(delay))
}

/// Between the work queue's name and the delay label: a quorum tier, a classic tier.
const QUORUM_TIER: &str = ".delay.";
const CLASSIC_TIER: &str = ".retry.";

/// The name of a classic delay tier: `orders.retry.30s` (the opt-in
/// `tier-queue-type = "classic"`, and every tier of earlier releases).
pub fn classic_tier_queue(queue: &str, delay: Duration) -> String {
    format!("{queue}{CLASSIC_TIER}{}", tier_label(delay))
}

/// The name of the tier for `delay` of the given type.
pub fn tier_queue_of(queue: &str, delay: Duration, tier_type: QueueType) -> String {
    match tier_type {
        QueueType::Quorum => tier_queue(queue, delay),
        QueueType::Classic => classic_tier_queue(queue, delay),
    }
}

/// True when `name` is one of `work_queue`'s delay tiers, of either type (`x-death`
/// evidence names the tier a copy expired from).
pub fn is_tier_of(name: &str, work_queue: &str) -> bool {
    name.strip_prefix(work_queue).is_some_and(|rest| {
        rest.strip_prefix(QUORUM_TIER)
            .or_else(|| rest.strip_prefix(CLASSIC_TIER))
            .and_then(parse_tier_label)
            .is_some()
    })
}

/// The work queue whose quorum tier `name` is (`orders.delay.30s` → `orders`); `None` for
/// any other name.
pub(crate) fn work_queue_of_quorum_tier(name: &str) -> Option<&str> {
    let (work_queue, label) = name.rsplit_once(QUORUM_TIER)?;
    parse_tier_label(label).map(|_| work_queue)
}

/// The delay a label written by [`tier_label`] stands for: `"1500ms"` → 1.5 s.
pub fn parse_tier_label(label: &str) -> Option<Duration> {
    let (digits, unit_ms) = if let Some(n) = label.strip_suffix("ms") {
        (n, 1)
    } else if let Some(n) = label.strip_suffix('s') {
        (n, 1000)
    } else if let Some(n) = label.strip_suffix('m') {
        (n, 60_000)
    } else if let Some(n) = label.strip_suffix('h') {
        (n, 3_600_000)
    } else {
        return None;
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(Duration::from_millis(n.checked_mul(unit_ms)?))
}

/// The compact label of a delay: `500ms`, `5s`, `1m`, `2h`.
pub fn tier_label(delay: Duration) -> String {
    let ms = delay.as_millis();
    if ms >= 3_600_000 && ms.is_multiple_of(3_600_000) {
        format!("{}h", ms / 3_600_000)
    } else if ms >= 60_000 && ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else if ms >= 1000 && ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// The name of the retry exchange of `queue` (direct; each tier is bound by its own name).
pub fn retry_exchange(queue: &str) -> String {
    format!("{queue}.retry")
}

/// The name of the parking queue of `queue`.
pub fn parking_queue(queue: &str) -> String {
    format!("{queue}.parking")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn tiers_follow_attempts_and_last_repeats() {
        let p = RetryPolicy::new([secs(1), secs(10)]).max_attempts(5);
        assert_eq!(p.next(1, None), RetryStep::Tier(secs(1)));
        assert_eq!(p.next(2, None), RetryStep::Tier(secs(10)));
        assert_eq!(p.next(4, None), RetryStep::Tier(secs(10)));
        assert_eq!(p.next(5, None), RetryStep::Exhausted);
    }

    #[test]
    fn requested_delay_picks_the_smallest_tier_that_covers_it() {
        let p = RetryPolicy::new([secs(30), secs(1), secs(10)]);
        assert_eq!(p.next(1, Some(secs(5))), RetryStep::Tier(secs(10)));
        assert_eq!(p.next(1, Some(secs(999))), RetryStep::Tier(secs(30)));
    }

    #[test]
    fn no_tiers_means_park() {
        assert_eq!(RetryPolicy::none().next(1, None), RetryStep::Exhausted);
        assert_eq!(
            RetryPolicy::new([]).max_attempts(9).next(1, None),
            RetryStep::Exhausted
        );
    }

    #[test]
    fn tier_names_are_by_delay() {
        assert_eq!(tier_queue("orders", secs(30)), "orders.delay.30s");
        assert_eq!(tier_queue("orders", secs(60)), "orders.delay.1m");
        assert_eq!(tier_queue("orders", secs(7200)), "orders.delay.2h");
        assert_eq!(tier_queue("orders", secs(90)), "orders.delay.90s");
        assert_eq!(
            tier_queue("orders", Duration::from_millis(1500)),
            "orders.delay.1500ms"
        );
        assert_eq!(classic_tier_queue("orders", secs(30)), "orders.retry.30s");
        assert_eq!(
            tier_queue_of("orders", secs(5), QueueType::Classic),
            "orders.retry.5s"
        );
        assert_eq!(
            tier_queue_of("orders", secs(5), QueueType::Quorum),
            "orders.delay.5s"
        );
    }

    #[test]
    fn tier_labels_parse_back_to_their_delay() {
        for d in [
            Duration::from_millis(1),
            Duration::from_millis(1500),
            secs(5),
            secs(90),
            secs(60),
            secs(7200),
            secs(86_400),
        ] {
            assert_eq!(parse_tier_label(&tier_label(d)), Some(d), "{d:?}");
        }
        for bad in ["", "s", "5", "5x", "-5s", "1.5s", "5 s", "ms"] {
            assert_eq!(parse_tier_label(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn tiers_of_either_type_are_recognised_by_name() {
        assert!(is_tier_of("orders.delay.5s", "orders"));
        assert!(is_tier_of("orders.retry.1500ms", "orders"));
        assert!(!is_tier_of("orders.retry", "orders"));
        assert!(!is_tier_of("orders.parking", "orders"));
        assert!(!is_tier_of("orders.delay.soon", "orders"));
        assert!(!is_tier_of("other.delay.5s", "orders"));
        assert!(!is_tier_of("ordersx.delay.5s", "orders"));
    }

    #[test]
    fn validate_rejects_zero_and_huge_tiers() {
        assert!(RetryPolicy::new([Duration::ZERO]).validate().is_err());
        assert!(RetryPolicy::new([secs(3_000_000)]).validate().is_err());
        assert!(RetryPolicy::default().validate().is_ok());
    }

    #[test]
    fn immediate_pause_doubles_and_jitters_within_bounds() {
        let p = RetryPolicy::new([]).immediate_retries(3);
        assert_eq!(p.immediate_pause(0), Duration::from_millis(50));
        assert_eq!(p.immediate_pause(2), Duration::from_millis(200));
        let j = p.clone().jitter(true);
        for _ in 0..100 {
            let d = j.immediate_pause(1);
            assert!(d >= Duration::from_millis(50) && d <= Duration::from_millis(150));
        }
    }

    #[test]
    fn jitter_is_random_not_derived_from_the_delivery() {
        // Every message with a UUID id used to get the same "random" pause (seeded from the
        // id's length): the herd of retries jittered nothing.
        let j = RetryPolicy::new([]).immediate_retries(3).jitter(true);
        let pauses: std::collections::HashSet<Duration> =
            (0..50).map(|_| j.immediate_pause(1)).collect();
        assert!(pauses.len() > 10, "{pauses:?}");
    }

    #[test]
    fn kinds_route_to_their_own_schedule_or_park() {
        let p = RetryPolicy::new([secs(1)])
            .max_attempts(3)
            .on_kind("validation", KindPolicy::park())
            .on_kind(
                "inventory",
                KindPolicy::tiers([secs(30), secs(60)]).max_attempts(5),
            )
            .on_kind("flaky", KindPolicy::default().max_attempts(2));
        assert!(p.validate().is_ok());
        assert_eq!(p.next_for("validation", 1, None), RetryStep::ParkNow);
        assert_eq!(p.next_for("inventory", 1, None), RetryStep::Tier(secs(30)));
        assert_eq!(p.next_for("inventory", 4, None), RetryStep::Tier(secs(60)));
        assert_eq!(p.next_for("inventory", 5, None), RetryStep::Exhausted);
        assert_eq!(p.next_for("flaky", 1, None), RetryStep::Tier(secs(1)));
        assert_eq!(p.next_for("flaky", 2, None), RetryStep::Exhausted);
        assert_eq!(p.next_for("error", 2, None), RetryStep::Tier(secs(1)));
        assert_eq!(p.next_for("error", 3, None), RetryStep::Exhausted);
        assert_eq!(p.distinct_tiers(), vec![secs(1), secs(30), secs(60)]);
        let bad = RetryPolicy::default().on_kind("x", KindPolicy::tiers([Duration::ZERO]));
        assert!(bad.validate().is_err());
    }

    #[test]
    fn tiers_parse_from_humantime_strings() {
        let p =
            RetryPolicy::from_humantime(["200ms", " 30s", "5m"]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            p.tiers,
            vec![Duration::from_millis(200), secs(30), secs(300)]
        );
        assert!(RetryPolicy::from_humantime(["soon"]).is_err());
        assert!(RetryPolicy::from_humantime(["0s"]).is_err());
    }

    #[test]
    fn kinds_deserialize_strictly() {
        let p: RetryPolicy = serde_json::from_str(
            r#"{"tiers":["1s"],"kinds":{"inventory":{"tiers":["30s"],"max-attempts":9},"validation":{"park":true}}}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            p.kinds["inventory"],
            KindPolicy::tiers([secs(30)]).max_attempts(9)
        );
        assert_eq!(p.kinds["validation"], KindPolicy::park());
        assert!(
            serde_json::from_str::<RetryPolicy>(r#"{"tiers":[],"kinds":{"x":{"prk":true}}}"#)
                .is_err()
        );
    }

    #[test]
    fn deserializes_strictly_from_toml_like_json() {
        let p: RetryPolicy = serde_json::from_str(r#"{"tiers":["1s","1m"],"max-attempts":3}"#)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p.tiers, vec![secs(1), secs(60)]);
        assert_eq!(p.max_attempts, 3);
        assert!(serde_json::from_str::<RetryPolicy>(r#"{"tiers":[],"max-attemps":3}"#).is_err());
        assert!(serde_json::from_str::<RetryPolicy>(r#"{"tiers":["soon"]}"#).is_err());
    }
}
