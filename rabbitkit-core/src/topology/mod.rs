//! The queues and exchanges a subscriber needs, declared or checked, and refused when they
//! would lose messages.
//!
//! For work queue `orders` bound to exchange `shop`:
//!
//! ```text
//!  shop ──(bindings)──▶ orders ──(handler fails: confirmed copy)──▶ orders.retry ──▶ orders.retry.5s
//!                        ▲   │                                         (direct)        │ x-message-ttl
//!                        │   └──(broker dead-letters: reject,                          │
//!                        │       quorum delivery-limit)──▶ orders.parking              │
//!                        └──────────────── expired: x-dead-letter to "" / orders ◀─────┘
//! ```

use std::time::Duration;

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{Channel, ExchangeKind};
use serde::Deserialize;

mod check;

use crate::error::{Error, Result};
use crate::headers;
use crate::names;
use crate::retry;

pub use check::{CheckedObject, ObjectState, TopologyReport};

/// Classic or quorum work queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum QueueType {
    /// A durable classic queue.
    #[default]
    Classic,
    /// A quorum queue (replicated; delivery-limit; at-least-once dead-lettering).
    Quorum,
}

/// A binding of the work queue to an exchange.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Binding {
    /// The exchange (declared durable, of the topology's exchange kind).
    pub exchange: String,
    /// The routing key or pattern.
    pub routing_key: String,
}

/// Declare everything, or only check it exists (passive).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TopologyMode {
    /// Declare (idempotent when it already exists with the same arguments).
    #[default]
    Declare,
    /// Passive checks only: nothing is created.
    Validate,
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
    /// Quorum only: broker-side delivery limit (requeues) before the broker dead-letters to
    /// parking. RabbitMQ 4.x defaults to 20 and drops past it when no target is set.
    pub delivery_limit: u32,
    /// Extra arguments for the work queue (override rabbitkit's; checked for cycles).
    pub queue_arguments: FieldTable,
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
            delivery_limit: 20,
            queue_arguments: FieldTable::default(),
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
        self.tiers
            .iter()
            .map(|t| retry::tier_queue(&self.queue, *t))
            .collect()
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
        let mut a = FieldTable::default();
        // LongInt: AMQPValue::from(u64) is a Timestamp and the broker refuses it (406).
        let ms = i32::try_from(delay.as_millis()).unwrap_or(i32::MAX);
        a.insert("x-message-ttl".into(), AMQPValue::LongInt(ms));
        a.insert("x-dead-letter-exchange".into(), ls(""));
        a.insert("x-dead-letter-routing-key".into(), ls(&self.queue));
        a
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

    /// Declares everything on `channel` (or only checks it, in `Validate` mode).
    pub async fn apply(&self, channel: &Channel, mode: TopologyMode) -> Result<()> {
        self.validate()?;
        let passive = mode == TopologyMode::Validate;
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
        let parking = self.parking_queue();
        channel
            .queue_declare(parking.as_str().into(), qopts, FieldTable::default())
            .await
            .map_err(|e| declare_err(format!("parking queue {parking:?}"), e))?;
        let work_args = if passive {
            FieldTable::default()
        } else {
            self.work_arguments()
        };
        channel
            .queue_declare(self.queue.as_str().into(), qopts, work_args)
            .await
            .map_err(|e| declare_err(format!("work queue {:?}", self.queue), e))?;
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
                let name = retry::tier_queue(&self.queue, t);
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
        Ok(())
    }
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
            .insert("x-dead-letter-routing-key".into(), ls("orders.retry.5s"));
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
            .insert("x-dead-letter-routing-key".into(), ls("orders.retry.30s"));
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
    fn tier_ttl_is_an_integer_not_a_timestamp() {
        let a = topo().tier_arguments(Duration::from_secs(5));
        assert_eq!(
            a.inner().get("x-message-ttl"),
            Some(&AMQPValue::LongInt(5000))
        );
    }
}
