//! Delay tiers no subscriber uses any more (a delay dropped from the schedule, the classic
//! tiers of a schedule now on quorum tiers), and their removal while they are empty.
//!
//! AMQP cannot list queues: the names on the broker come from the caller (the operator CLI
//! reads them from the management API).

use std::collections::BTreeSet;
use std::time::Duration;

use lapin::options::{QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;

use crate::connection::{ConnectionConfig, Connector};
use crate::error::Result;
use crate::retry::{is_tier_of, retry_exchange, tier_queue_of, work_queue_of_quorum_tier};

use super::{Topology, is_not_found};

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

/// Deletes each of `queues` only if it is empty; none of their messages is ever lost here.
///
/// - A classic tier (`{q}.retry.{d}`) is deleted with `queue.delete` `if-empty`: the broker
///   refuses it while it holds a message.
/// - A quorum tier (`{q}.delay.{d}`): RabbitMQ refuses `if-empty` for quorum queues (540
///   NOT_IMPLEMENTED, which closes the connection). It is unbound from the retry exchange
///   `{q}.retry` first, so no copy can reach it any more (a copy still sent there is
///   returned, and its original requeued), then, a second later, counted: empty, it is
///   deleted; holding messages, it is bound again and kept (they expire into the work
///   queue as usual).
///
/// One channel per queue, since a refusal closes the channel.
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
        let outcome = match work_queue_of_quorum_tier(queue) {
            Some(work_queue) => {
                match delete_quorum_tier(&conn.conn, ch, queue, &retry_exchange(work_queue)).await {
                    Ok(outcome) => outcome,
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
            }
            None => {
                let options = QueueDeleteOptions {
                    if_empty: true,
                    ..Default::default()
                };
                let outcome = match ch.queue_delete(queue.as_str().into(), options).await {
                    Ok(_) => PruneOutcome::Deleted,
                    Err(e) if is_not_found(&e) => PruneOutcome::Gone,
                    Err(e) => PruneOutcome::Kept(e.to_string()),
                };
                let _ = ch.close(200, "rabbitkit topology prune".into()).await;
                outcome
            }
        };
        tracing::info!(queue = %queue, outcome = ?outcome, "prune");
        done.push((queue.clone(), outcome));
    }
    connector.close().await;
    result.map(|()| done)
}

/// Waited between unbinding a quorum tier and counting it: a copy routed just before the
/// unbind is enqueued by then.
const SETTLE: Duration = Duration::from_secs(1);

/// Unbind, count, then delete or bind again (see [`delete_if_empty`]). `Err` only when no
/// channel can be opened.
async fn delete_quorum_tier(
    conn: &lapin::Connection,
    ch: lapin::Channel,
    queue: &str,
    exchange: &str,
) -> Result<PruneOutcome> {
    // A missing exchange (404) means nothing routes there anyway; it closes the channel.
    let ch = match ch
        .queue_unbind(
            queue.into(),
            exchange.into(),
            queue.into(),
            FieldTable::default(),
        )
        .await
    {
        Ok(()) => ch,
        Err(e) if is_not_found(&e) => conn.create_channel().await.map_err(crate::Error::amqp)?,
        Err(e) => return Ok(PruneOutcome::Kept(e.to_string())),
    };
    tokio::time::sleep(SETTLE).await;
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let outcome = match ch
        .queue_declare(queue.into(), passive, FieldTable::default())
        .await
    {
        Err(e) if is_not_found(&e) => PruneOutcome::Gone,
        Err(e) => PruneOutcome::Kept(e.to_string()),
        Ok(q) if q.message_count() == 0 => {
            match ch
                .queue_delete(queue.into(), QueueDeleteOptions::default())
                .await
            {
                Ok(_) => PruneOutcome::Deleted,
                Err(e) if is_not_found(&e) => PruneOutcome::Gone,
                Err(e) => PruneOutcome::Kept(e.to_string()),
            }
        }
        Ok(q) => {
            let rebound = ch
                .queue_bind(
                    queue.into(),
                    exchange.into(),
                    queue.into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await;
            let n = q.message_count();
            PruneOutcome::Kept(match rebound {
                Ok(()) => format!(
                    "holds {n} messages (a quorum queue cannot be deleted only if empty: it \
                     was unbound, counted, and bound again)"
                ),
                Err(e) => format!("holds {n} messages; binding it again failed: {e}"),
            })
        }
    };
    let _ = ch.close(200, "rabbitkit topology prune".into()).await;
    Ok(outcome)
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
