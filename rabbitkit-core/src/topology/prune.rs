//! Delay tiers no subscriber uses any more (a delay dropped from the schedule, the classic
//! tiers of a schedule now on quorum tiers), and their removal while they are empty.
//!
//! AMQP cannot list queues: the names on the broker come from the caller (the operator CLI
//! reads them from the management API).

use std::collections::BTreeSet;
use std::time::Duration;

use lapin::options::QueueDeleteOptions;

use crate::connection::{ConnectionConfig, Connector};
use crate::error::Result;
use crate::retry::{is_tier_of, tier_queue_of};

use super::Topology;

const CONNECT_WAIT: Duration = Duration::from_secs(15);

/// The tier queues among `existing` (the queue names on the broker) that belong to a work
/// queue of `topologies` (`{queue}.delay.{d}` or `{queue}.retry.{d}`) but are none of the
/// tiers any of them declares. Sorted.
///
/// ```
/// # use rabbitkit_core::topology::{Topology, unused_tiers};
/// # use std::time::Duration;
/// let mut orders = Topology::new("orders");
/// orders.tiers = vec![Duration::from_secs(1)];
/// let on_broker = ["orders", "orders.delay.1s", "orders.delay.5s", "orders.retry.1s", "orders.parking"];
/// assert_eq!(unused_tiers(&[orders], on_broker), ["orders.delay.5s", "orders.retry.1s"]);
/// ```
pub fn unused_tiers<'a>(
    topologies: &[Topology],
    existing: impl IntoIterator<Item = &'a str>,
) -> Vec<String> {
    let used: BTreeSet<String> = topologies
        .iter()
        .flat_map(|t| {
            t.tiers
                .iter()
                .map(|d| tier_queue_of(&t.queue, *d, t.tier_queue_type))
        })
        .collect();
    let unused: BTreeSet<String> = existing
        .into_iter()
        .filter(|name| topologies.iter().any(|t| is_tier_of(name, &t.queue)))
        .filter(|name| !used.contains(*name))
        .map(str::to_owned)
        .collect();
    unused.into_iter().collect()
}

/// What became of one queue given to [`delete_if_empty`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PruneOutcome {
    /// Deleted (it was empty).
    Deleted,
    /// Not there any more.
    Gone,
    /// Kept: the broker refused to delete it (not empty), with its answer.
    Kept(String),
}

/// Deletes each of `queues` only if it is empty (`queue.delete` with `if-empty`: the broker
/// refuses a queue that holds a message, so none is ever lost here). One channel per queue,
/// since a refusal closes the channel.
pub async fn delete_if_empty(
    connection: &ConnectionConfig,
    queues: &[String],
) -> Result<Vec<(String, PruneOutcome)>> {
    let connector = Connector::new(connection.clone(), "rabbitkit-topology-prune")?;
    let conn = connector.get(CONNECT_WAIT).await?;
    let mut done = Vec::with_capacity(queues.len());
    let mut result = Ok(());
    for queue in queues {
        let ch = match conn.conn.create_channel().await {
            Ok(ch) => ch,
            Err(e) => {
                result = Err(crate::Error::amqp(e));
                break;
            }
        };
        let options = QueueDeleteOptions {
            if_empty: true,
            ..Default::default()
        };
        let outcome = match ch.queue_delete(queue.as_str().into(), options).await {
            Ok(_) => PruneOutcome::Deleted,
            Err(e) => match e.kind() {
                lapin::ErrorKind::ProtocolError(amqp) if amqp.get_id() == 404 => PruneOutcome::Gone,
                _ => PruneOutcome::Kept(e.to_string()),
            },
        };
        let _ = ch.close(200, "rabbitkit topology prune".into()).await;
        tracing::info!(queue = %queue, outcome = ?outcome, "prune");
        done.push((queue.clone(), outcome));
    }
    connector.close().await;
    result.map(|()| done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::QueueType;

    fn topology(queue: &str, tiers: &[u64], tier_type: QueueType) -> Topology {
        let mut t = Topology::new(queue);
        t.tiers = tiers.iter().map(|s| Duration::from_secs(*s)).collect();
        t.tier_queue_type = tier_type;
        t
    }

    #[test]
    fn only_tiers_of_configured_work_queues_outside_every_schedule_are_unused() {
        let orders = topology("orders", &[1, 30], QueueType::Quorum);
        let legacy = topology("billing", &[5], QueueType::Classic);
        let broker = [
            "orders",
            "orders.parking",
            "orders.delay.1s",
            "orders.delay.30s",
            "orders.delay.1m",
            "orders.retry.30s",
            "orders.delay.not-a-delay",
            "orders.v2.delay.5s",
            "billing.retry.5s",
            "billing.delay.5s",
            "shipping.delay.5s",
        ];
        assert_eq!(
            unused_tiers(&[orders.clone(), legacy], broker),
            ["billing.delay.5s", "orders.delay.1m", "orders.retry.30s"]
        );
        // Two subscribers of one work queue: a tier either uses is used.
        let other = topology("orders", &[60], QueueType::Quorum);
        assert_eq!(unused_tiers(&[orders, other], broker), ["orders.retry.30s"]);
        assert!(unused_tiers(&[], broker).is_empty());
    }
}
