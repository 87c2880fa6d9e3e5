//! Replacing a parking queue of another shape (the classic `{q}.parking` of earlier
//! releases) by the quorum one, without losing a parked message.
//!
//! The quorum queue must keep the name `{q}.parking`: the work queue dead-letters to it by
//! that name (`x-dead-letter-routing-key`), and changing the work queue's arguments would
//! make its declaration fail (406). A queue cannot change type, so the messages go through
//! a holding quorum queue, `{q}.parking.migrating`:
//!
//! ```text
//!  {q}.parking (classic) ──confirmed moves──▶ {q}.parking.migrating (quorum)
//!  delete {q}.parking if empty; declare {q}.parking (quorum)
//!  {q}.parking.migrating ──confirmed moves──▶ {q}.parking (quorum); delete the holding queue
//! ```
//!
//! Each move takes one message unacked, publishes it unchanged (body and properties,
//! headers included, so evidence and signatures stay valid) with `mandatory` on a
//! confirm-mode channel, and acks the original only after the copy is confirmed without a
//! return. At every moment a parked message is in the old queue, the holding queue or the
//! new queue; a crash between a confirm and its ack leaves it in two (a duplicate, never a
//! loss). An interrupted migration is run again: it finds the holding queue and goes on.

use lapin::Connection;
use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};

use super::migrate::{channel, drain, queue_messages};
use super::parking::parking_arguments;
use super::{QueueType, Topology, reply};
use crate::connection::{ConnectionConfig, Connector};
use crate::error::{Error, Result};

/// How long a migration waits for a connection.
const CONNECT_WAIT: std::time::Duration = std::time::Duration::from_secs(15);
/// Move-and-delete rounds: a message parked between the move and the delete (a worker
/// still running) makes the delete refuse, and the queue is moved again.
const ROUNDS: u32 = 5;
/// Closing reason of the migration's channels.
const CLOSING: &str = "rabbitkit parking migrate";

/// How a parking migration ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ParkingMigration {
    /// `{q}.parking` was already the quorum queue this release declares (or did not exist,
    /// and was declared so); nothing was moved but what an interrupted run had left in the
    /// holding queue.
    AlreadyQuorum,
    /// Every message moved into the quorum `{q}.parking`; the old queue and the holding
    /// queue are deleted.
    Migrated,
    /// Not finished; nothing was lost. Where the messages are is in the report's counts.
    Incomplete {
        /// Why, and what to do.
        why: String,
    },
}

/// The result of [`Topology::migrate_parking`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParkingMigrationReport {
    /// The parking queue, `{q}.parking`.
    pub queue: String,
    /// The holding quorum queue, `{q}.parking.migrating`.
    pub holding_queue: String,
    /// What the broker said of the old queue when it was declared as quorum (`None` when
    /// it already was).
    pub found: Option<String>,
    /// Messages moved from the old `{q}.parking` into the holding queue (each acked off the
    /// old queue after its copy was confirmed).
    pub moved_out: u64,
    /// Messages moved from the holding queue into the parking queue.
    pub moved_in: u64,
    /// Messages ready in `{q}.parking` at the end (`None` when it does not exist).
    pub parking_messages: Option<u32>,
    /// Messages ready in the holding queue at the end (`None` when it is deleted).
    pub holding_messages: Option<u32>,
    /// How it ended.
    pub outcome: ParkingMigration,
}

impl ParkingMigrationReport {
    /// True when `{q}.parking` is the quorum queue and the holding queue is gone.
    pub fn is_complete(&self) -> bool {
        !matches!(self.outcome, ParkingMigration::Incomplete { .. })
    }
}

/// The holding queue of `parking`.
fn holding_queue(parking: &str) -> String {
    format!("{parking}.migrating")
}

impl Topology {
    /// Replaces a parking queue of another shape (the classic `{q}.parking` that earlier
    /// releases declared) by the quorum parking queue this release declares
    /// ([`Topology::parking_arguments`]), moving every parked message, unchanged:
    ///
    /// 1. `{q}.parking` is declared as quorum: if the broker accepts, it already is (or did
    ///    not exist and now does), and only a holding queue left by an interrupted run is
    ///    emptied into it;
    /// 2. otherwise (406) every message of `{q}.parking` is moved into the holding quorum
    ///    queue `{q}.parking.migrating` (same delivery limit, never reached), each acked off
    ///    the old queue only after its copy is confirmed; the old queue is then deleted
    ///    with `if_empty`, and moved again when a message was parked meanwhile (5 rounds);
    /// 3. `{q}.parking` is declared as quorum, every held message is moved into it the same
    ///    way, and the holding queue, counted empty, is deleted.
    ///
    /// When step 3's declaration is refused (a worker of an earlier release declared a
    /// classic `{q}.parking` again in the gap), the held messages are moved into whatever
    /// `{q}.parking` now is, and the outcome is [`ParkingMigration::Incomplete`]: stop the
    /// workers of earlier releases, then run it again. Nothing is lost in any case; a crash
    /// mid-move can leave a message twice (in the queue it left and the one it reached).
    ///
    /// Between the delete and the declaration (one round trip) there is no parking queue:
    /// rabbitkit's own parking copies are then returned and their originals requeued, but
    /// a message the broker dead-letters out of a **classic** work queue at that instant
    /// (`Outcome::Reject`, `NackOnError`) is dropped by the broker (dead-lettering out of a
    /// classic queue is at-most-once). Run it with the workers stopped, or when nothing is
    /// rejected. Do not browse the parking queue meanwhile: a classic queue deleted with
    /// `if_empty` drops messages a browser holds unacked.
    ///
    /// Fails with [`Error::Config`] for an all-classic topology (its parking queue is
    /// classic: there is nothing to migrate to).
    pub async fn migrate_parking(
        &self,
        connection: &ConnectionConfig,
    ) -> Result<ParkingMigrationReport> {
        self.validate()?;
        if self.parking_queue_type() != QueueType::Quorum {
            return Err(Error::Config(format!(
                "the parking queue of {:?} is classic (an all-classic topology): migrating \
                 moves a classic parking queue into a quorum one",
                self.queue
            )));
        }
        let parking = self.parking_queue();
        crate::names::check("derived queue name", &holding_queue(&parking))?;
        let connector = Connector::new(
            connection.clone(),
            format!("rabbitkit-parking-migrate {}", self.queue),
        )?;
        let conn = connector.get(CONNECT_WAIT).await?;
        let result = migrate_on(&conn.conn, &parking).await;
        connector.close().await;
        let report = result?;
        match &report.outcome {
            ParkingMigration::Incomplete { why } => tracing::warn!(
                parking_queue = %report.queue, moved_out = report.moved_out,
                moved_in = report.moved_in, reason = %why,
                "parking queue migration incomplete (nothing was lost)"
            ),
            outcome => tracing::info!(
                parking_queue = %report.queue, moved_out = report.moved_out,
                moved_in = report.moved_in, outcome = ?outcome,
                "parking queue is the quorum queue"
            ),
        }
        Ok(report)
    }
}

async fn migrate_on(conn: &Connection, parking: &str) -> Result<ParkingMigrationReport> {
    let holding = holding_queue(parking);
    let mut report = ParkingMigrationReport {
        queue: parking.to_owned(),
        holding_queue: holding.clone(),
        found: None,
        moved_out: 0,
        moved_in: 0,
        parking_messages: None,
        holding_messages: None,
        outcome: ParkingMigration::AlreadyQuorum,
    };
    match declare_quorum(conn, parking).await? {
        Ok(()) => {}
        Err(broker) => {
            report.found = Some(broker);
            if let Err(why) = empty_old_queue(conn, parking, &holding, &mut report).await? {
                return finish(conn, report, why).await;
            }
            report.outcome = ParkingMigration::Migrated;
            if let Err(broker) = declare_quorum(conn, parking).await? {
                // Another parking queue came back in the gap: put the held messages there
                // (it is where the workers park) and say what to do.
                let why = format!(
                    "{parking:?} was declared again with another shape before the quorum one \
                     could be (a worker of an earlier release still running?); the broker \
                     says: {broker}. The held messages were moved back into it. Stop the \
                     workers of earlier releases, then migrate again"
                );
                let moved = move_held(conn, &holding, parking, &mut report.moved_in).await?;
                let why = match moved {
                    Ok(()) => why,
                    Err(stopped) => format!("{why}; moving them back stopped: {stopped}"),
                };
                delete_holding_if_empty(conn, &holding).await?;
                return finish(conn, report, why).await;
            }
        }
    }
    // The holding queue (of this run, or left by an interrupted one) into the quorum queue.
    if queue_messages(conn, &holding).await?.is_some() {
        if let Err(stopped) = move_held(conn, &holding, parking, &mut report.moved_in).await? {
            let why = format!(
                "moving the held messages into {parking:?} stopped: {stopped}; they stay in \
                 {holding:?} (run the migration again)"
            );
            return finish(conn, report, why).await;
        }
        if !delete_holding_if_empty(conn, &holding).await? {
            let why = format!("{holding:?} was not empty at the end: run the migration again");
            return finish(conn, report, why).await;
        }
    }
    report.parking_messages = queue_messages(conn, parking).await?;
    report.holding_messages = queue_messages(conn, &holding).await?;
    Ok(report)
}

/// Moves everything out of the old `parking` queue into `holding`, then deletes it (if
/// empty). `Ok(Err(why))` when it could not.
async fn empty_old_queue(
    conn: &Connection,
    parking: &str,
    holding: &str,
    report: &mut ParkingMigrationReport,
) -> Result<std::result::Result<(), String>> {
    if let Err(broker) = declare_quorum(conn, holding).await? {
        return Ok(Err(format!(
            "the holding queue {holding:?} exists with another shape ({broker}); delete it \
             (after moving what it holds) and migrate again"
        )));
    }
    let mut why = String::new();
    for _ in 0..ROUNDS {
        if let Err(stopped) = move_all(conn, parking, holding, &mut report.moved_out).await? {
            return Ok(Err(format!(
                "moving the parked messages into {holding:?} stopped: {stopped}; what was not \
                 moved is still in {parking:?}"
            )));
        }
        // The moving channel is closed: nothing is held unacked by it, and a classic queue
        // deleted with if_empty would drop what is held.
        let ch = channel(conn).await?;
        let options = QueueDeleteOptions {
            if_empty: true,
            ..Default::default()
        };
        match ch.queue_delete(parking.into(), options).await {
            Ok(_) => {
                let _ = ch.close(200, CLOSING.into()).await;
                return Ok(Ok(()));
            }
            // 406: a message was parked after the move; the channel is closed.
            Err(e) if reply::reply_code(&e) == Some(406) => {
                why = format!("not empty when deleted: {}", reply::reply_text(&e));
            }
            // A quorum queue of other arguments cannot be deleted only if empty (540).
            Err(e) => {
                return Ok(Err(format!(
                    "{parking:?} could not be deleted only if empty: {}; its messages are in \
                     {holding:?}",
                    reply::reply_text(&e)
                )));
            }
        }
    }
    Ok(Err(format!(
        "{parking:?} kept receiving messages ({why}); stop the workers or let them idle, then \
         migrate again"
    )))
}

/// Declares `queue` as a quorum parking queue on a channel of its own: `Ok(Err(broker's
/// words))` when it exists with another shape (406).
async fn declare_quorum(conn: &Connection, queue: &str) -> Result<std::result::Result<(), String>> {
    let ch = channel(conn).await?;
    let r = ch
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            parking_arguments(QueueType::Quorum),
        )
        .await;
    match r {
        Ok(_) => {
            let _ = ch.close(200, CLOSING.into()).await;
            Ok(Ok(()))
        }
        Err(e) if reply::reply_code(&e) == Some(406) => Ok(Err(reply::reply_text(&e))),
        Err(e) => Err(super::declare_err(format!("parking queue {queue:?}"), e)),
    }
}

/// Headers a quorum queue adds to what it delivers (its own delivery counts: RabbitMQ
/// 3.10 adds `x-delivery-count` to every delivery, 4.x once a message was returned, 4.3
/// also `x-acquired-count`). Moving a message out of the holding quorum queue drops them,
/// so that it reaches the parking queue as it was parked.
const QUORUM_DELIVERY_HEADERS: &[&str] = &["x-delivery-count", "x-acquired-count"];

/// Moves every message of `from` to the queue `to` (through the default exchange),
/// unchanged: the old parking queue's messages exactly as parked.
async fn move_all(
    conn: &Connection,
    from: &str,
    to: &str,
    moved: &mut u64,
) -> Result<std::result::Result<(), String>> {
    drain(conn, "", from, to, &[], moved).await
}

/// Moves every message of the holding queue to the queue `to`, without the delivery
/// counts the holding queue added.
async fn move_held(
    conn: &Connection,
    holding: &str,
    to: &str,
    moved: &mut u64,
) -> Result<std::result::Result<(), String>> {
    drain(conn, "", holding, to, QUORUM_DELIVERY_HEADERS, moved).await
}

/// Deletes the holding queue when it is counted empty (a quorum queue cannot be deleted
/// with `if_empty`; nothing but a migration publishes to it, and the moving channel is
/// closed, so nothing is held unacked). True when it is gone.
async fn delete_holding_if_empty(conn: &Connection, holding: &str) -> Result<bool> {
    match queue_messages(conn, holding).await? {
        None => Ok(true),
        Some(n) if n > 0 => Ok(false),
        Some(_) => {
            let ch = channel(conn).await?;
            match ch
                .queue_delete(holding.into(), QueueDeleteOptions::default())
                .await
            {
                Ok(_) => {
                    let _ = ch.close(200, CLOSING.into()).await;
                    Ok(true)
                }
                Err(e) => Err(super::declare_err(format!("holding queue {holding:?}"), e)),
            }
        }
    }
}

async fn finish(
    conn: &Connection,
    mut report: ParkingMigrationReport,
    why: String,
) -> Result<ParkingMigrationReport> {
    report.parking_messages = queue_messages(conn, &report.queue).await?;
    report.holding_messages = queue_messages(conn, &report.holding_queue).await?;
    report.outcome = ParkingMigration::Incomplete { why };
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_holding_queue_is_named_after_the_parking_queue() {
        assert_eq!(holding_queue("orders.parking"), "orders.parking.migrating");
    }

    #[test]
    fn an_all_classic_topology_has_nothing_to_migrate_to() {
        let mut t = Topology::new("orders");
        t.tier_queue_type = QueueType::Classic;
        let r = futures_util::FutureExt::now_or_never(
            t.migrate_parking(&ConnectionConfig::new("amqp://127.0.0.1:1/%2f")),
        );
        assert!(matches!(r, Some(Err(Error::Config(_)))), "{r:?}");
    }
}
