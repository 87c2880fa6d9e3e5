//! Moving classic delay tiers (`{q}.retry.{delay}`, every tier of earlier releases) into
//! quorum tiers (`{q}.delay.{delay}`) without losing a copy, and spotting them at start.
//!
//! A classic tier cannot be redeclared as quorum (`406 PRECONDITION_FAILED`), so the quorum
//! tiers have names of their own and the classic ones are drained and deleted. Until they
//! are, they keep working: their copies still expire into the work queue, but at-most-once.

use std::time::Duration;

use lapin::Confirmation;
use lapin::options::{
    BasicAckOptions, BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions,
    ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ExchangeKind};

use super::{QueueType, Topology, declare_err, retry_dedup, tier_arguments};
use crate::connection::{ConnectionConfig, Connector};
use crate::error::{Error, Result};
use crate::retry;

/// How long a migration waits for a connection.
const CONNECT_WAIT: Duration = Duration::from_secs(15);
/// How long one moved copy waits for its confirm before the migration stops (the copy's
/// outcome is then unknown, so its original stays in the classic tier).
const CONFIRM_WAIT: Duration = Duration::from_secs(30);
/// Drain-and-delete rounds per tier: a copy published to the classic tier between the
/// drain and the delete (a worker of an earlier release still running) makes the delete
/// refuse, and the tier is drained again.
const ROUNDS: u32 = 3;

/// A classic delay tier found on the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LegacyTier {
    /// Its delay.
    pub delay: Duration,
    /// Its name, `{q}.retry.{delay}`.
    pub queue: String,
    /// Messages ready in it.
    pub messages: u32,
}

/// What became of one classic tier.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MigratedTier {
    /// There was no classic tier for this delay.
    Absent,
    /// Drained and deleted.
    Deleted,
    /// Still there, with what it holds; the migration did not finish for it.
    Kept {
        /// Messages ready in it afterwards.
        messages: u32,
        /// Why it was kept.
        why: String,
    },
}

/// One delay of a migration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierMigration {
    /// The delay, the same for both tiers.
    pub delay: Duration,
    /// The classic tier, `{q}.retry.{delay}`.
    pub old_queue: String,
    /// The quorum tier, `{q}.delay.{delay}`.
    pub new_queue: String,
    /// Copies confirmed in the quorum tier (each acked off the classic tier after that).
    pub moved: u64,
    /// What became of the classic tier.
    pub outcome: MigratedTier,
}

/// The result of [`Topology::migrate_tiers`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TierMigrationReport {
    /// One entry per delay looked at, shortest first.
    pub tiers: Vec<TierMigration>,
}

impl TierMigrationReport {
    /// Copies moved, over every tier.
    pub fn moved(&self) -> u64 {
        self.tiers.iter().map(|t| t.moved).sum()
    }

    /// True when no classic tier is left among the delays looked at.
    pub fn is_complete(&self) -> bool {
        self.tiers
            .iter()
            .all(|t| !matches!(t.outcome, MigratedTier::Kept { .. }))
    }
}

impl Topology {
    /// Moves every message of the classic delay tiers of this work queue into the quorum
    /// tiers of the same delays, then deletes each classic tier once it is empty.
    ///
    /// The delays looked at are this topology's [`tiers`](Topology::tiers) and `also` (delays
    /// dropped from the schedule whose classic tiers may still exist). For each classic
    /// tier `{q}.retry.{delay}` that exists:
    ///
    /// 1. the quorum tier `{q}.delay.{delay}` is declared and bound to the retry exchange;
    /// 2. the classic tier is unbound from the retry exchange, so nothing new lands in it (a
    ///    worker of an earlier release still running gets its retry copies returned, and
    ///    keeps their originals: nothing is lost, but upgrade the workers first);
    /// 3. its messages are taken one at a time and published, body and properties (headers
    ///    included) unchanged, to the retry exchange with the quorum tier's routing key, on a
    ///    confirm-mode channel with `mandatory`; each is acked off the classic tier **only
    ///    after its copy is confirmed** without a return. A copy that is returned, nacked or
    ///    not confirmed within 30 s stops that tier: its original stays in the classic tier;
    /// 4. the classic tier is deleted with `if_empty` (after the channel holding the
    ///    messages is closed, so none is held unacked), drained again if a message arrived
    ///    meanwhile.
    ///
    /// A moved copy waits its full delay again in the quorum tier before it reaches the work
    /// queue. An interrupted migration loses nothing (at worst a copy is both moved and still
    /// in the classic tier, and is processed twice) and can be run again.
    ///
    /// Fails with [`Error::Config`] for a topology with classic tiers (there is nothing to
    /// migrate to) and [`Error::Topology`] when the work queue does not exist (moved copies
    /// would have nowhere to expire to).
    pub async fn migrate_tiers(
        &self,
        connection: &ConnectionConfig,
        also: &[Duration],
    ) -> Result<TierMigrationReport> {
        self.validate()?;
        if self.tier_queue_type == QueueType::Classic {
            return Err(Error::Config(format!(
                "the tiers of {:?} are classic: migrating moves classic tiers into quorum tiers",
                self.queue
            )));
        }
        let mut delays = self.tiers.clone();
        delays.extend_from_slice(also);
        let delays = retry_dedup(&delays);
        for d in &delays {
            crate::names::check(
                "derived queue name",
                &retry::classic_tier_queue(&self.queue, *d),
            )?;
            crate::names::check("derived queue name", &retry::tier_queue(&self.queue, *d))?;
        }
        if delays
            .iter()
            .any(|t| t.is_zero() || t.as_millis() > i32::MAX as u128)
        {
            return Err(Error::Topology(
                "retry tiers must be between 1ms and about 24 days".into(),
            ));
        }
        let connector = Connector::new(
            connection.clone(),
            format!("rabbitkit-topology-migrate {}", self.queue),
        )?;
        let conn = connector.get(CONNECT_WAIT).await?;
        let result = self.migrate_on(&conn.conn, &delays).await;
        connector.close().await;
        result
    }

    async fn migrate_on(
        &self,
        conn: &Connection,
        delays: &[Duration],
    ) -> Result<TierMigrationReport> {
        if queue_messages(conn, &self.queue).await?.is_none() {
            return Err(Error::Topology(format!(
                "work queue {:?} does not exist: declare the topology first (start the worker, \
                 or `rabbitkit topology apply`), then migrate",
                self.queue
            )));
        }
        let rx = self.retry_exchange();
        let ch = channel(conn).await?;
        ch.exchange_declare(
            rx.as_str().into(),
            ExchangeKind::Direct,
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .map_err(|e| declare_err(format!("retry exchange {rx:?}"), e))?;
        let _ = ch.close(200, "rabbitkit topology migrate".into()).await;
        let mut report = TierMigrationReport::default();
        for &delay in delays {
            let old = retry::classic_tier_queue(&self.queue, delay);
            let new = retry::tier_queue(&self.queue, delay);
            let mut entry = TierMigration {
                delay,
                old_queue: old.clone(),
                new_queue: new.clone(),
                moved: 0,
                outcome: MigratedTier::Absent,
            };
            if queue_messages(conn, &old).await?.is_none() {
                report.tiers.push(entry);
                continue;
            }
            let ch = channel(conn).await?;
            ch.queue_declare(
                new.as_str().into(),
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                tier_arguments(&self.queue, delay, QueueType::Quorum),
            )
            .await
            .map_err(|e| declare_err(format!("retry tier {new:?}"), e))?;
            ch.queue_bind(
                new.as_str().into(),
                rx.as_str().into(),
                new.as_str().into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| declare_err(format!("binding of tier {new:?}"), e))?;
            // Unbinding a binding that is not there succeeds: a second run is fine.
            ch.queue_unbind(
                old.as_str().into(),
                rx.as_str().into(),
                old.as_str().into(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| declare_err(format!("binding of classic tier {old:?}"), e))?;
            let _ = ch.close(200, "rabbitkit topology migrate".into()).await;
            entry.outcome = self
                .drain_and_delete(conn, &rx, &old, &new, &mut entry.moved)
                .await?;
            match &entry.outcome {
                MigratedTier::Kept { messages, why } => tracing::warn!(
                    tier = %old, moved = entry.moved, left = messages, reason = %why,
                    "classic delay tier kept: migration incomplete"
                ),
                _ => tracing::info!(
                    tier = %old, into = %new, moved = entry.moved,
                    "classic delay tier migrated and deleted"
                ),
            }
            report.tiers.push(entry);
        }
        Ok(report)
    }

    async fn drain_and_delete(
        &self,
        conn: &Connection,
        rx: &str,
        old: &str,
        new: &str,
        moved: &mut u64,
    ) -> Result<MigratedTier> {
        let mut why = String::new();
        for _ in 0..ROUNDS {
            if let Err(stopped) = drain(conn, rx, old, new, &[], moved).await? {
                let messages = queue_messages(conn, old).await?.unwrap_or(0);
                return Ok(MigratedTier::Kept {
                    messages,
                    why: stopped,
                });
            }
            let ch = channel(conn).await?;
            let deleted = ch
                .queue_delete(
                    old.into(),
                    QueueDeleteOptions {
                        if_empty: true,
                        ..Default::default()
                    },
                )
                .await;
            match deleted {
                Ok(_) => {
                    let _ = ch.close(200, "rabbitkit topology migrate".into()).await;
                    return Ok(MigratedTier::Deleted);
                }
                // 406: not empty (a copy arrived after the drain); the channel is closed.
                Err(e) => why = format!("not empty when deleted: {e}"),
            }
        }
        let messages = queue_messages(conn, old).await?.unwrap_or(0);
        Ok(MigratedTier::Kept { messages, why })
    }

    /// The classic tiers (`{q}.retry.{delay}`) of this topology's delays that still exist,
    /// with what they hold: what [`Topology::migrate_tiers`] would move. Empty for a
    /// topology with classic tiers (they are its own). A worker logs a warning for each at
    /// start.
    pub async fn legacy_tiers(&self, connection: &ConnectionConfig) -> Result<Vec<LegacyTier>> {
        self.validate()?;
        let connector = Connector::new(
            connection.clone(),
            format!("rabbitkit-topology-check {}", self.queue),
        )?;
        let conn = connector.get(CONNECT_WAIT).await?;
        let found = self.legacy_tiers_on(&conn.conn).await;
        connector.close().await;
        found
    }

    /// [`Topology::legacy_tiers_on`] through the management API, which answers 404 for a
    /// queue that does not exist without closing any channel; `None` without a management
    /// URL.
    async fn legacy_tiers_via_management(
        &self,
        connection: &ConnectionConfig,
    ) -> Result<Option<Vec<LegacyTier>>> {
        if self.tier_queue_type == QueueType::Classic {
            return Ok(Some(Vec::new()));
        }
        let Some(api) = self.site(connection)?.management else {
            return Ok(None);
        };
        let mut out = Vec::new();
        for delay in retry_dedup(&self.tiers) {
            let queue = retry::classic_tier_queue(&self.queue, delay);
            if let Some(q) = api.queue(&queue).await? {
                // Statistics lag a queue's creation: an absent count is 0.
                let messages = q
                    .get("messages")
                    .and_then(serde_json::Value::as_u64)
                    .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX));
                out.push(LegacyTier {
                    delay,
                    queue,
                    messages,
                });
            }
        }
        Ok(Some(out))
    }

    /// The classic tiers of this topology's delays that exist, for a quorum-tier topology
    /// (empty for a classic-tier one, whose tiers they are).
    pub(crate) async fn legacy_tiers_on(&self, conn: &Connection) -> Result<Vec<LegacyTier>> {
        let mut out = Vec::new();
        if self.tier_queue_type == QueueType::Classic {
            return Ok(out);
        }
        for delay in retry_dedup(&self.tiers) {
            let queue = retry::classic_tier_queue(&self.queue, delay);
            if let Some(messages) = queue_messages(conn, &queue).await? {
                out.push(LegacyTier {
                    delay,
                    queue,
                    messages,
                });
            }
        }
        Ok(out)
    }

    /// Logs a warning for each classic tier of this topology's delays that still exists,
    /// and for a parking queue of another shape than this release declares (the classic
    /// parking queue of an earlier release): what a worker says once at start.
    ///
    /// The tiers are looked for through the management API only ([`Topology::management`]);
    /// without one they are not looked for at start (a debug line says so), since the one
    /// AMQP way to ask, a passive declare, makes the broker close the channel with 404 when
    /// the queue does not exist, the healthy case, and lapin logs every channel the broker
    /// closes at ERROR from its own target (`lapin::channel`, "Channel closed"), whatever
    /// rabbitkit makes of the answer. [`Topology::legacy_tiers`] and `rabbitkit topology
    /// migrate` still ask over AMQP when run on purpose.
    pub(crate) async fn warn_legacy_tiers(&self, conn: &Connection, connection: &ConnectionConfig) {
        self.warn_other_parking_queue(conn).await;
        let found = match self.legacy_tiers_via_management(connection).await {
            Ok(Some(found)) => found,
            Ok(None) => {
                tracing::debug!(queue = %self.queue, "classic delay tiers of an earlier release are not looked for without a management URL (rabbitkit topology migrate --help)");
                return;
            }
            Err(e) => {
                tracing::debug!(queue = %self.queue, error = %e, "could not look for classic delay tiers");
                return;
            }
        };
        if found.is_empty() {
            return;
        }
        let labels: Vec<String> = retry_dedup(&self.tiers)
            .into_iter()
            .map(retry::tier_label)
            .collect();
        let command = format!(
            "rabbitkit topology migrate {} --tiers {}",
            self.queue,
            labels.join(",")
        );
        for t in found {
            tracing::warn!(
                queue = %self.queue,
                tier = %t.queue,
                messages = t.messages,
                command = %command,
                "classic delay tier of an earlier release still exists: its copies expire into the work queue at-most-once (a broker restart or a work queue that cannot take them drops them); move them into the quorum tiers and delete it with the migrate command"
            );
        }
    }
}

/// Moves every message of `old` to `rx` / `new`, body and properties unchanged but for
/// the headers named in `strip` (a quorum queue's own delivery counts, which it adds to
/// what it delivers); `Ok(Err(why))` when a copy was not confirmed (its original is
/// requeued in `old` when the channel closes).
pub(super) async fn drain(
    conn: &Connection,
    rx: &str,
    old: &str,
    new: &str,
    strip: &[&str],
    moved: &mut u64,
) -> Result<std::result::Result<(), String>> {
    let ch = channel(conn).await?;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(Error::amqp)?;
    let result = drain_on(&ch, rx, old, new, strip, moved).await;
    // Closing requeues a message held after a refused copy, and settles every ack before
    // the delete looks at the queue: a classic queue deleted `if_empty` with messages held
    // unacked would drop them.
    let _ = ch.close(200, "rabbitkit topology migrate".into()).await;
    result
}

async fn drain_on(
    ch: &Channel,
    rx: &str,
    old: &str,
    new: &str,
    strip: &[&str],
    moved: &mut u64,
) -> Result<std::result::Result<(), String>> {
    loop {
        let got = ch
            .basic_get(old.into(), BasicGetOptions { no_ack: false })
            .await
            .map_err(Error::amqp)?;
        let Some(msg) = got else {
            return Ok(Ok(()));
        };
        let d = msg.delivery;
        // One publish in flight on this channel: returns and confirms cannot be attributed
        // to the wrong copy.
        let confirm = ch
            .basic_publish(
                rx.into(),
                new.into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..Default::default()
                },
                &d.data,
                without(&d.properties, strip),
            )
            .await
            .map_err(Error::amqp)?;
        let why = match tokio::time::timeout(CONFIRM_WAIT, confirm).await {
            Ok(Ok(Confirmation::Ack(None))) => {
                ch.basic_ack(d.delivery_tag, BasicAckOptions::default())
                    .await
                    .map_err(Error::amqp)?;
                *moved += 1;
                continue;
            }
            Ok(Ok(Confirmation::Ack(Some(_)))) => format!("copy returned by {rx:?} / {new:?}"),
            Ok(Ok(Confirmation::Nack(_))) => "copy nacked by the broker".to_owned(),
            Ok(Ok(Confirmation::NotRequested)) => "channel not in confirm mode".to_owned(),
            Ok(Err(e)) => format!("copy failed: {e}"),
            Err(_) => format!("copy not confirmed within {CONFIRM_WAIT:?}"),
        };
        return Ok(Err(why));
    }
}

/// `properties` without the headers named in `strip` (a clone when there are none).
fn without(properties: &BasicProperties, strip: &[&str]) -> BasicProperties {
    let Some(headers) = properties.headers() else {
        return properties.clone();
    };
    if !strip.iter().any(|k| headers.inner().contains_key(*k)) {
        return properties.clone();
    }
    let mut kept = FieldTable::default();
    for (k, v) in headers.inner() {
        if !strip.contains(&k.as_str()) {
            kept.insert(k.clone(), v.clone());
        }
    }
    properties.clone().with_headers(kept)
}

pub(super) async fn channel(conn: &Connection) -> Result<Channel> {
    conn.create_channel().await.map_err(Error::amqp)
}

/// Ready messages in `queue`, `None` when it does not exist (passive declare on a channel
/// of its own: a 404 closes it).
pub(super) async fn queue_messages(conn: &Connection, queue: &str) -> Result<Option<u32>> {
    let ch = channel(conn).await?;
    let r = ch
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await;
    match r {
        Ok(q) => {
            let _ = ch.close(200, "rabbitkit topology migrate".into()).await;
            Ok(Some(q.message_count()))
        }
        Err(e) if super::reply::reply_code(&e) == Some(404) => Ok(None),
        Err(e) => Err(Error::amqp(e)),
    }
}
