//! The type of a queue rabbitkit declares: vocabulary shared by the retry schedule (which
//! names its tiers by type) and the topology (which declares them).

use serde::Deserialize;

/// Classic or quorum: the type of a work queue, or of the delay tiers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum QueueType {
    /// A durable classic queue.
    #[default]
    Classic,
    /// A quorum queue (replicated; delivery-limit; at-least-once dead-lettering).
    Quorum,
}
