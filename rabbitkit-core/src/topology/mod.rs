//! The queues and exchanges a subscriber needs, declared or checked, and refused when they
//! would lose messages.
//!
//! For work queue `orders` bound to exchange `shop`:
//!
//! ```text
//!  shop ──(bindings)──▶ orders ──(handler fails: confirmed copy)──▶ orders.retry ──▶ orders.delay.5s
//!                        ▲   │                                         (direct)        │ x-message-ttl
//!                        │   └──(broker dead-letters: reject,                          │ (quorum,
//!                        │       quorum delivery-limit)──▶ orders.parking              │ at-least-once)
//!                        └──────────────── expired: x-dead-letter to "" / orders ◀─────┘
//! ```
//!
//! Delay tiers are quorum queues dead-lettering **at-least-once**
//! (`x-dead-letter-strategy = at-least-once`, `x-overflow = reject-publish`): a copy that
//! expires while the work queue cannot take it (a quorum work queue without a leader after a
//! restart, no majority, a length limit) stays in the tier and is dead-lettered again
//! later. Dead-lettering out of a classic queue is at-most-once, and such copies are
//! dropped; classic tiers (`{q}.retry.{delay}`) are an opt-in ([`Topology::tier_queue_type`])
//! and the shape of earlier releases, which [`Topology::migrate_tiers`] moves into quorum
//! tiers (`{q}.delay.{delay}`).

use std::time::Duration;

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{Channel, ExchangeKind};
use serde::Deserialize;

mod check;
mod mgmt;
mod migrate;
mod parking;
mod parking_migrate;
mod prune;
mod reply;
mod verify;

use crate::connection::ConnectionConfig;
use crate::error::{Error, Result};
use crate::headers;
use crate::names;
use crate::retry;

pub use check::{CheckedObject, ObjectState, TopologyReport};
pub use mgmt::{ListedQueue, ManagementUrl};
pub use migrate::{LegacyTier, MigratedTier, TierMigration, TierMigrationReport};
pub use parking_migrate::{ParkingMigration, ParkingMigrationReport};
pub use prune::{PruneOutcome, delete_if_empty, unused_tiers};
pub(crate) use verify::Site;

pub use crate::queue_type::QueueType;

/// A binding of the work queue to an exchange.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Binding {
    /// The exchange (declared durable, of the topology's exchange kind).
    pub exchange: String,
    /// The routing key or pattern.
    pub routing_key: String,
}

/// Declare everything, only check it, or declare rabbitkit's own queues beside a work queue
/// that someone else runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum TopologyMode {
    /// Declare (idempotent when it already exists with the same arguments).
    #[default]
    Declare,
    /// Nothing is created: every exchange and queue must exist, and the work queue must have
    /// in effect the type and arguments rabbitkit would declare, its dead-letter target
    /// above all (as an argument, or by a policy when [`Topology::management`] lets
    /// rabbitkit read it). Otherwise the start is refused with
    /// [`Error::WorkQueueMismatch`], naming the queue, the argument and the fix.
    Validate,
    /// For a work queue that exists and that rabbitkit did not declare: the work queue is
    /// checked as in `Validate` (it must exist; a missing dead-letter target is refused
    /// with the `rabbitmqctl set_policy` command that adds it,
    /// [`Topology::policy_command`]), then rabbitkit's own objects are declared: the bound
    /// exchanges and the bindings, the retry exchange, the delay tiers and the parking queue.
    Adopt,
}

/// A subscriber's topology.
#[derive(Debug, Clone, PartialEq)]
pub struct Topology {
    /// The work queue.
    pub queue: String,
    /// Its type.
    pub queue_type: QueueType,
    /// Its bindings.
    pub bindings: Vec<Binding>,
    /// The kind of the bound exchanges: `topic` (default), `direct`, `fanout`, `headers`.
    pub exchange_kind: String,
    /// Retry delays (one TTL queue each).
    pub tiers: Vec<Duration>,
    /// The type of the delay tiers: quorum by default (`{q}.delay.{delay}`, at-least-once
    /// dead-lettering into the work queue). Classic (`{q}.retry.{delay}`) is an opt-in:
    /// dead-lettering out of a classic queue is at-most-once, so a copy expiring while the
    /// work queue cannot take it (a quorum work queue electing its leader after a restart,
    /// no majority, a length limit) is dropped by the broker after the original was acked.
    pub tier_queue_type: QueueType,
    /// Quorum only: broker-side delivery limit (requeues) before the broker dead-letters to
    /// parking. RabbitMQ 4.x defaults to 20 and drops past it when no target is set.
    pub delivery_limit: u32,
    /// Extra arguments for the work queue (override rabbitkit's; checked for cycles).
    pub queue_arguments: FieldTable,
    /// The management API, read by the `validate` and `adopt` modes to see the work
    /// queue's type, arguments and effective policy (AMQP reports none of them). Without
    /// it a dead-letter exchange set by a policy cannot be seen, and is refused as missing.
    pub management: Option<ManagementUrl>,
}

impl Topology {
    /// The topology of `queue` with no bindings, no tiers and classic type.
    pub fn new(queue: impl Into<String>) -> Self {
        Self {
            queue: queue.into(),
            queue_type: QueueType::Classic,
            bindings: Vec::new(),
            exchange_kind: "topic".into(),
            tiers: Vec::new(),
            tier_queue_type: QueueType::Quorum,
            delivery_limit: 20,
            queue_arguments: FieldTable::default(),
            management: None,
        }
    }

    /// The retry exchange name.
    pub fn retry_exchange(&self) -> String {
        retry::retry_exchange(&self.queue)
    }

    /// The parking queue name.
    pub fn parking_queue(&self) -> String {
        retry::parking_queue(&self.queue)
    }

    /// The tier queue names.
    pub fn tier_queues(&self) -> Vec<String> {
        self.tiers.iter().map(|t| self.tier_queue(*t)).collect()
    }

    /// The tier queue name for `delay`, of this topology's tier type.
    pub fn tier_queue(&self, delay: Duration) -> String {
        retry::tier_queue_of(&self.queue, delay, self.tier_queue_type)
    }

    /// The work queue's arguments: rabbitkit's, then the user's on top.
    pub fn work_arguments(&self) -> FieldTable {
        let mut a = FieldTable::default();
        a.insert("x-dead-letter-exchange".into(), ls(""));
        a.insert(
            "x-dead-letter-routing-key".into(),
            ls(&self.parking_queue()),
        );
        if self.queue_type == QueueType::Quorum {
            a.insert("x-queue-type".into(), ls("quorum"));
            a.insert(
                "x-delivery-limit".into(),
                AMQPValue::LongInt(i32::try_from(self.delivery_limit).unwrap_or(i32::MAX)),
            );
            a.insert("x-dead-letter-strategy".into(), ls("at-least-once"));
            a.insert("x-overflow".into(), ls("reject-publish"));
        }
        for (k, v) in self.queue_arguments.inner() {
            a.insert(k.clone(), v.clone());
        }
        a
    }

    fn tier_arguments(&self, delay: Duration) -> FieldTable {
        tier_arguments(&self.queue, delay, self.tier_queue_type)
    }

    /// Refuses topologies that would lose messages or break on the wire, before anything is
    /// declared: bad names, dead-letter cycles without a rejection (the broker drops such
    /// messages silently), quorum dead-lettering with no target.
    pub fn validate(&self) -> Result<()> {
        names::check_queue(&self.queue)?;
        for n in self
            .tier_queues()
            .iter()
            .chain([&self.parking_queue(), &self.retry_exchange()])
        {
            names::check("derived queue name", n)?;
        }
        for b in &self.bindings {
            names::check("exchange name", &b.exchange)?;
            names::check("routing key", &b.routing_key)?;
        }
        if self
            .tiers
            .iter()
            .any(|t| t.is_zero() || t.as_millis() > i32::MAX as u128)
        {
            return Err(Error::Topology(
                "retry tiers must be between 1ms and about 24 days".into(),
            ));
        }
        exchange_kind(&self.exchange_kind)?;
        if let Some(m) = &self.management {
            m.check()?;
        }
        self.check_removed_arguments()?;
        let args = self.work_arguments();
        let arg = |k: &str| args.inner().get(k);
        let dlx = arg("x-dead-letter-exchange").and_then(headers::string);
        let dlk = arg("x-dead-letter-routing-key").and_then(headers::string);
        let quorum = matches!(
            arg("x-queue-type").and_then(headers::string).as_deref(),
            Some("quorum")
        );
        // Ways the broker dead-letters without a rejection.
        let mut silent = Vec::new();
        if quorum {
            silent.push("delivery_limit");
        }
        if arg("x-message-ttl").is_some() {
            silent.push("expired");
        }
        let overflow = arg("x-overflow").and_then(headers::string);
        if (arg("x-max-length").is_some() || arg("x-max-length-bytes").is_some())
            && overflow.as_deref().is_none_or(|o| o == "drop-head")
        {
            silent.push("maxlen");
        }
        let Some(dlx) = dlx else {
            if quorum {
                return Err(Error::Topology(format!(
                    "quorum queue {:?} has a delivery-limit (RabbitMQ 4.x defaults it to 20) but no \
                     dead-letter target: messages past the limit would be dropped",
                    self.queue
                )));
            }
            return Ok(());
        };
        if silent.is_empty() {
            return Ok(());
        }
        let tiers = self.tier_queues();
        let retry_x = self.retry_exchange();
        let cycles = if dlx.is_empty() {
            dlk.as_deref()
                .is_some_and(|k| k == self.queue || tiers.iter().any(|t| t == k))
        } else if dlx == retry_x {
            dlk.as_deref().is_none_or(|k| tiers.iter().any(|t| t == k))
        } else {
            self.bindings.iter().any(|b| b.exchange == dlx)
        };
        if cycles {
            return Err(Error::Topology(format!(
                "queue {:?} dead-letters ({}) back into its own retry loop with no rejection in the \
                 cycle; RabbitMQ drops such messages silently",
                self.queue,
                silent.join(", ")
            )));
        }
        Ok(())
    }

    /// Classic queue v1 is gone in RabbitMQ 4.3: a declare carrying `x-queue-mode` (lazy
    /// mode, ignored since 3.12) or `x-queue-version = 1` fails there with 406. Refused on
    /// every version so that a topology that starts on 3.10 or 4.0 also starts on 4.3.
    fn check_removed_arguments(&self) -> Result<()> {
        let refuse = |argument: &str, reason: &str| Error::QueueArgument {
            queue: self.queue.clone(),
            argument: argument.to_owned(),
            reason: reason.to_owned(),
        };
        let args = self.queue_arguments.inner();
        if args.contains_key("x-queue-mode") {
            return Err(refuse(
                "x-queue-mode",
                "lazy mode was removed with classic queue v1 (ignored since RabbitMQ 3.12, \
                 refused by 4.3); drop the argument",
            ));
        }
        if let Some(v) = args
            .get("x-queue-version")
            .filter(|v| headers::int(v) != Some(2))
        {
            return Err(refuse(
                "x-queue-version",
                &format!(
                    "only 2 is accepted (classic queue v1 was removed in RabbitMQ 4.3), got {v:?}"
                ),
            ));
        }
        Ok(())
    }

    /// Declares everything on `channel` (or only checks it, in `Validate` mode; see
    /// [`TopologyMode`]). Here the broker's vhost is not known, nor is the management API
    /// used: a `Validate` or `Adopt` check of the work queue compares declared arguments
    /// only. A worker applies its topologies with both.
    ///
    /// The parking queue is declared last, of [`Topology::parking_queue_type`]. When it
    /// exists but cannot be declared so, the result is [`Error::ParkingUnavailable`] with
    /// everything else declared and `channel` closed by the broker: it is down (404, or no
    /// answer within 10 s), or it has another shape (406: the classic parking queue of an
    /// earlier release), which works as it is until [`Topology::migrate_parking`]
    /// replaces it. A worker consumes in both cases, on another channel.
    pub async fn apply(&self, channel: &Channel, mode: TopologyMode) -> Result<()> {
        self.apply_in(channel, mode, &Site::default()).await
    }

    /// What [`Topology::apply_in`] knows of the broker `connection` reaches: its vhost and,
    /// when [`Topology::management`] is set, the management API.
    pub(crate) fn site(&self, connection: &ConnectionConfig) -> Result<Site> {
        let uri = connection.validate()?;
        let management = match &self.management {
            Some(url) => Some(mgmt::Management::new(url, connection)?),
            None => None,
        };
        Ok(Site {
            vhost: Some(uri.vhost),
            management,
        })
    }

    /// [`Topology::apply`] with what is known of the broker.
    pub(crate) async fn apply_in(
        &self,
        channel: &Channel,
        mode: TopologyMode,
        site: &Site,
    ) -> Result<()> {
        self.validate()?;
        let passive = mode == TopologyMode::Validate;
        // Validate and Adopt: the work queue is someone else's; it is only checked.
        let work_passive = mode != TopologyMode::Declare;
        let kind = exchange_kind(&self.exchange_kind)?;
        let xopts = ExchangeDeclareOptions {
            passive,
            durable: true,
            ..Default::default()
        };
        let qopts = QueueDeclareOptions {
            passive,
            durable: true,
            ..Default::default()
        };
        if work_passive {
            // First, so that a refused work queue leaves nothing declared.
            let wopts = QueueDeclareOptions {
                passive: true,
                ..qopts
            };
            channel
                .queue_declare(self.queue.as_str().into(), wopts, FieldTable::default())
                .await
                .map_err(|e| match mode {
                    TopologyMode::Adopt if reply::reply_code(&e) == Some(404) => {
                        Error::Topology(format!(
                            "adopt mode takes a work queue that exists, and {:?} does not \
                             (mode declare creates it)",
                            self.queue
                        ))
                    }
                    _ => declare_err(format!("work queue {:?}", self.queue), e),
                })?;
            self.verify_work_queue(channel, site).await?;
        }
        let mut seen = Vec::new();
        for b in &self.bindings {
            if b.exchange.is_empty()
                || b.exchange.starts_with("amq.")
                || seen.contains(&&b.exchange)
            {
                continue;
            }
            seen.push(&b.exchange);
            channel
                .exchange_declare(
                    b.exchange.as_str().into(),
                    kind.clone(),
                    xopts,
                    FieldTable::default(),
                )
                .await
                .map_err(|e| declare_err(format!("exchange {:?}", b.exchange), e))?;
        }
        if !work_passive {
            channel
                .queue_declare(self.queue.as_str().into(), qopts, self.work_arguments())
                .await
                .map_err(|e| declare_err(format!("work queue {:?}", self.queue), e))?;
        }
        if !self.tiers.is_empty() {
            let rx = self.retry_exchange();
            channel
                .exchange_declare(
                    rx.as_str().into(),
                    ExchangeKind::Direct,
                    xopts,
                    FieldTable::default(),
                )
                .await
                .map_err(|e| declare_err(format!("retry exchange {rx:?}"), e))?;
            for t in retry_dedup(&self.tiers) {
                let name = self.tier_queue(t);
                let args = if passive {
                    FieldTable::default()
                } else {
                    self.tier_arguments(t)
                };
                channel
                    .queue_declare(name.as_str().into(), qopts, args)
                    .await
                    .map_err(|e| declare_err(format!("retry tier {name:?}"), e))?;
                if !passive {
                    channel
                        .queue_bind(
                            name.as_str().into(),
                            rx.as_str().into(),
                            name.as_str().into(),
                            QueueBindOptions::default(),
                            FieldTable::default(),
                        )
                        .await
                        .map_err(|e| declare_err(format!("binding of tier {name:?}"), e))?;
                }
            }
        }
        if !passive {
            for b in &self.bindings {
                if b.exchange.is_empty() {
                    continue;
                }
                channel
                    .queue_bind(
                        self.queue.as_str().into(),
                        b.exchange.as_str().into(),
                        b.routing_key.as_str().into(),
                        QueueBindOptions::default(),
                        FieldTable::default(),
                    )
                    .await
                    .map_err(|e| {
                        declare_err(format!("binding {:?} → {:?}", b.exchange, self.queue), e)
                    })?;
            }
        }
        // Last: a parking queue that exists but is unavailable (a classic queue whose node
        // is down) closes the channel with 404 once everything else is declared, and is
        // told apart so the worker can consume anyway.
        // RabbitMQ 4.x answers only after its own timeout (75 s measured on 4.3.6): bounded
        // here, the channel is then given up (the caller opens another).
        // A parking queue of another shape (the classic one of an earlier release where a
        // quorum one is now declared) answers 406 and closes the channel too: it is used as
        // it is, through the same path (the caller opens another channel), and the worker
        // warns once at start with the command that migrates it.
        let parking = self.parking_queue();
        let args = if passive {
            FieldTable::default()
        } else {
            self.parking_arguments()
        };
        let declare = channel.queue_declare(parking.as_str().into(), qopts, args);
        let answer = if passive {
            Ok(declare.await)
        } else {
            tokio::time::timeout(PARKING_DECLARE_TIMEOUT, declare).await
        };
        match answer {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) if !passive && is_not_found(&e) => Err(Error::ParkingUnavailable {
                queue: parking,
                source: Box::new(e),
            }),
            Ok(Err(e)) if !passive && reply::reply_code(&e) == Some(406) => {
                Err(Error::ParkingUnavailable {
                    source: Box::new(parking::OtherParkingQueue {
                        queue: parking.clone(),
                        broker: reply::reply_text(&e),
                    }),
                    queue: parking,
                })
            }
            Ok(Err(e)) => Err(declare_err(format!("parking queue {parking:?}"), e)),
            Err(_) => Err(Error::ParkingUnavailable {
                source: format!(
                    "no answer to its declaration within {}",
                    humantime::format_duration(PARKING_DECLARE_TIMEOUT)
                )
                .into(),
                queue: parking,
            }),
        }
    }
}

/// How long the parking queue's declaration may take before the queue is taken for
/// unavailable (a classic queue whose node is down).
const PARKING_DECLARE_TIMEOUT: Duration = Duration::from_secs(10);

/// The log line of a worker that consumes while its parking queue is unavailable. A
/// parking queue of another shape (the classic one of an earlier release) is not
/// unavailable: it is used as it is, and the worker's start says so once
/// ([`Topology::warn_other_parking_queue`]); here it is only a debug line (every reconnect
/// comes through here).
pub(crate) fn warn_parking_unavailable(queue: &str, e: &Error) {
    if parking::is_other_parking_queue(e) {
        tracing::debug!(queue, error = %e, "parking queue of another shape: used as it is");
        return;
    }
    tracing::warn!(
        queue,
        error = %e,
        "the parking queue is unavailable (its node is down?); consuming anyway: the broker nacks parking copies until it is back and their originals are requeued"
    );
}

/// A 404 NOT_FOUND from the broker: on a non-passive declare of a durable queue, the queue
/// exists and is unavailable.
pub(super) fn is_not_found(e: &lapin::Error) -> bool {
    use lapin::ErrorKind;
    use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
    matches!(
        e.kind(),
        ErrorKind::ProtocolError(err) if matches!(err.kind(), AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND))
    )
}

/// The arguments of the tier of `work_queue` for `delay`.
fn tier_arguments(work_queue: &str, delay: Duration, tier_type: QueueType) -> FieldTable {
    let mut a = FieldTable::default();
    // LongInt: AMQPValue::from(u64) is a Timestamp and the broker refuses it (406).
    let ms = i32::try_from(delay.as_millis()).unwrap_or(i32::MAX);
    a.insert("x-message-ttl".into(), AMQPValue::LongInt(ms));
    a.insert("x-dead-letter-exchange".into(), ls(""));
    a.insert("x-dead-letter-routing-key".into(), ls(work_queue));
    if tier_type == QueueType::Quorum {
        a.insert("x-queue-type".into(), ls("quorum"));
        // At-least-once dead-lettering (RabbitMQ 3.10+): the tier keeps an expired copy
        // until the work queue has confirmed it, and retries when it could not. The broker
        // falls back to at-most-once unless the overflow is reject-publish. No
        // x-delivery-limit: a tier has no consumers, so 4.x's default limit of 20 never
        // applies to it (nothing is ever delivered from a tier).
        a.insert("x-dead-letter-strategy".into(), ls("at-least-once"));
        a.insert("x-overflow".into(), ls("reject-publish"));
    }
    a
}

fn retry_dedup(t: &[Duration]) -> Vec<Duration> {
    let mut v = t.to_vec();
    v.sort();
    v.dedup();
    v
}

fn exchange_kind(kind: &str) -> Result<ExchangeKind> {
    Ok(match kind {
        "topic" => ExchangeKind::Topic,
        "direct" => ExchangeKind::Direct,
        "fanout" => ExchangeKind::Fanout,
        "headers" => ExchangeKind::Headers,
        other => return Err(Error::Config(format!("unknown exchange kind {other:?}"))),
    })
}

fn declare_err(what: String, e: lapin::Error) -> Error {
    Error::Declare {
        what,
        source: Box::new(e),
    }
}

fn ls(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topo() -> Topology {
        let mut t = Topology::new("orders");
        t.tiers = vec![Duration::from_secs(5), Duration::from_secs(30)];
        t.bindings.push(Binding {
            exchange: "shop".into(),
            routing_key: "order.#".into(),
        });
        t
    }

    #[test]
    fn classic_queue_v1_arguments_are_refused_naming_the_argument() {
        for (k, v) in [
            ("x-queue-mode", ls("lazy")),
            ("x-queue-mode", ls("default")),
            ("x-queue-version", AMQPValue::LongInt(1)),
            ("x-queue-version", AMQPValue::ShortShortUInt(1)),
            ("x-queue-version", ls("2")),
        ] {
            let mut t = topo();
            t.queue_arguments.insert(k.into(), v.clone());
            match t.validate() {
                Err(Error::QueueArgument {
                    queue, argument, ..
                }) => {
                    assert_eq!((queue.as_str(), argument.as_str()), ("orders", k), "{v:?}");
                }
                other => panic!("{k} = {v:?}: expected QueueArgument, got {other:?}"),
            }
        }
        let mut t = topo();
        t.queue_arguments
            .insert("x-queue-version".into(), AMQPValue::LongInt(2));
        assert!(t.validate().is_ok());
    }

    #[test]
    fn default_topologies_are_accepted() {
        assert!(topo().validate().is_ok());
        let mut q = topo();
        q.queue_type = QueueType::Quorum;
        assert!(q.validate().is_ok());
    }

    #[test]
    fn quorum_delivery_limit_into_a_tier_is_a_refused_cycle() {
        let mut q = topo();
        q.queue_type = QueueType::Quorum;
        q.queue_arguments
            .insert("x-dead-letter-exchange".into(), ls("orders.retry"));
        q.queue_arguments
            .insert("x-dead-letter-routing-key".into(), ls("orders.delay.5s"));
        let err = q
            .validate()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("drops such messages silently"), "{err}");
    }

    #[test]
    fn ttl_dead_lettering_into_itself_is_refused_but_rejection_only_is_fine() {
        let mut t = topo();
        t.queue_arguments
            .insert("x-dead-letter-routing-key".into(), ls("orders.delay.30s"));
        // Classic queue without TTL or max-length: only rejections dead-letter, which the
        // broker lets cycle.
        assert!(t.validate().is_ok());
        t.queue_arguments
            .insert("x-message-ttl".into(), AMQPValue::LongInt(1000));
        assert!(t.validate().is_err());
    }

    #[test]
    fn quorum_without_dead_letter_target_is_refused() {
        let mut q = topo();
        q.queue_type = QueueType::Quorum;
        q.queue_arguments
            .insert("x-dead-letter-exchange".into(), AMQPValue::Void);
        let err = q
            .validate()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("delivery-limit"), "{err}");
    }

    #[test]
    fn bad_names_are_refused() {
        assert!(Topology::new("").validate().is_err());
        assert!(
            Topology::new("q".repeat(250)).validate().is_err(),
            "derived tier names overflow"
        );
        let mut t = topo();
        t.exchange_kind = "x-weird".into();
        assert!(t.validate().is_err());
    }

    #[test]
    fn tiers_are_quorum_with_at_least_once_dead_lettering_by_default() {
        let t = topo();
        assert_eq!(t.tier_queue_type, QueueType::Quorum);
        assert_eq!(t.tier_queues(), ["orders.delay.5s", "orders.delay.30s"]);
        let a = t.tier_arguments(Duration::from_secs(5));
        let get = |k: &str| a.inner().get(k).and_then(headers::string);
        assert_eq!(get("x-queue-type").as_deref(), Some("quorum"));
        assert_eq!(
            get("x-dead-letter-strategy").as_deref(),
            Some("at-least-once")
        );
        assert_eq!(get("x-overflow").as_deref(), Some("reject-publish"));
        assert_eq!(get("x-dead-letter-routing-key").as_deref(), Some("orders"));
        assert!(!a.inner().contains_key("x-delivery-limit"));
    }

    #[test]
    fn classic_tiers_are_an_opt_in_with_their_own_names() {
        let mut t = topo();
        t.tier_queue_type = QueueType::Classic;
        assert_eq!(t.tier_queues(), ["orders.retry.5s", "orders.retry.30s"]);
        let a = t.tier_arguments(Duration::from_secs(5));
        assert!(!a.inner().contains_key("x-queue-type"));
        assert!(!a.inner().contains_key("x-dead-letter-strategy"));
        assert!(t.validate().is_ok());
        // The classic names stay refused as a dead-letter target when they cycle.
        t.queue_type = QueueType::Quorum;
        t.queue_arguments
            .insert("x-dead-letter-exchange".into(), ls("orders.retry"));
        t.queue_arguments
            .insert("x-dead-letter-routing-key".into(), ls("orders.retry.5s"));
        assert!(t.validate().is_err());
    }

    #[test]
    fn tier_ttl_is_an_integer_not_a_timestamp() {
        let a = topo().tier_arguments(Duration::from_secs(5));
        assert_eq!(
            a.inner().get("x-message-ttl"),
            Some(&AMQPValue::LongInt(5000))
        );
    }
}
