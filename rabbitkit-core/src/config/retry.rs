//! `[subscribers.retry]`: overrides of the registered subscriber's retry policy, key by key.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use crate::kind::KindPolicy;
use crate::retry::RetryPolicy;

/// `[subscribers.retry]`: each key given replaces that part of the registered subscriber's
/// [`RetryPolicy`]; a key left out keeps the registered value (a `#[subscriber]`'s
/// `retry = [...]`, say), so `max-attempts = 8` alone keeps the registered tiers.
/// `kinds.NAME` entries are added to the registered kinds, replacing a registered entry of
/// the same name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RetrySection {
    /// Delay tiers in order, e.g. `["1s", "10s", "1m", "10m"]`; `[]` for no retries.
    #[serde(default, deserialize_with = "crate::kind::de_opt_durations")]
    pub tiers: Option<Vec<Duration>>,
    /// Handler runs allowed before the message is parked (the first delivery counts).
    pub max_attempts: Option<u32>,
    /// In-process re-runs before a failure goes to a tier.
    pub immediate_retries: Option<u32>,
    /// Pause between immediate retries.
    #[serde(default, with = "humantime_serde::option")]
    pub immediate_backoff: Option<Duration>,
    /// Randomise immediate-retry pauses by up to ±50 %.
    pub jitter: Option<bool>,
    /// Policies by error kind, added to the registered ones.
    #[serde(default)]
    pub kinds: BTreeMap<String, KindPolicy>,
}

impl RetrySection {
    /// `registered` with the keys this section gives.
    pub fn apply(&self, mut registered: RetryPolicy) -> RetryPolicy {
        if let Some(t) = &self.tiers {
            registered.tiers.clone_from(t);
        }
        if let Some(n) = self.max_attempts {
            registered.max_attempts = n;
        }
        if let Some(n) = self.immediate_retries {
            registered.immediate_retries = n;
        }
        if let Some(d) = self.immediate_backoff {
            registered.immediate_backoff = d;
        }
        if let Some(j) = self.jitter {
            registered.jitter = j;
        }
        registered
            .kinds
            .extend(self.kinds.iter().map(|(k, p)| (k.clone(), p.clone())));
        registered
    }
}
