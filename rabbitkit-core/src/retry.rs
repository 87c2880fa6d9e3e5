//! The retry schedule: delay tiers, attempt limit, in-process immediate retries.

use std::time::Duration;

use serde::Deserialize;

/// How a failing message is retried.
///
/// Each failed attempt `n` (1-based) is retried through the delay tier `tiers[n - 1]` (the
/// last tier repeats) until `max_attempts` handler runs have failed; then it is parked.
/// Tiers are TTL queues **named by delay** (`orders.retry.30s`), so changing the schedule
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
        }
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
        for t in &self.tiers {
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

    /// The distinct tiers, for topology.
    pub fn distinct_tiers(&self) -> Vec<Duration> {
        let mut t = self.tiers.clone();
        t.sort();
        t.dedup();
        t
    }

    /// Pause before immediate retry number `n` (0-based).
    pub fn immediate_pause(&self, n: u32, seed: u64) -> Duration {
        let base = self
            .immediate_backoff
            .saturating_mul(1u32 << n.min(16))
            .min(Duration::from_secs(5));
        if !self.jitter {
            return base;
        }
        // Cheap deterministic jitter from a per-delivery seed: ±50 %.
        let frac = (seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54) as f64 / 1024.0;
        base.mul_f64(0.5 + frac)
    }
}

/// The name of the delay tier queue for `queue` and `delay`: `orders.retry.30s`.
pub fn tier_queue(queue: &str, delay: Duration) -> String {
    format!("{queue}.retry.{}", tier_label(delay))
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
        assert_eq!(tier_queue("orders", secs(30)), "orders.retry.30s");
        assert_eq!(tier_queue("orders", secs(60)), "orders.retry.1m");
        assert_eq!(tier_queue("orders", secs(7200)), "orders.retry.2h");
        assert_eq!(tier_queue("orders", secs(90)), "orders.retry.90s");
        assert_eq!(
            tier_queue("orders", Duration::from_millis(1500)),
            "orders.retry.1500ms"
        );
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
        assert_eq!(p.immediate_pause(0, 1), Duration::from_millis(50));
        assert_eq!(p.immediate_pause(2, 1), Duration::from_millis(200));
        let j = p.clone().jitter(true);
        for seed in 0..100 {
            let d = j.immediate_pause(1, seed);
            assert!(d >= Duration::from_millis(50) && d <= Duration::from_millis(150));
        }
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
