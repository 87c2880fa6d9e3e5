//! Checking a topology against the broker without creating anything (`--check`).

use lapin::options::{ExchangeDeclareOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ExchangeKind};

use super::{Topology, exchange_kind, retry_dedup};
use crate::error::{Error, Result};
use crate::retry;

/// What a topology check found: the objects that are as the worker would declare them,
/// and the ones that are missing or differ.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopologyReport {
    /// Objects found as expected (`work queue "orders"`).
    pub ok: Vec<String>,
    /// Objects missing or different.
    pub problems: Vec<TopologyProblem>,
}

/// One object that is missing or differs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopologyProblem {
    /// The subscriber that needs it.
    pub subscriber: String,
    /// The object (`work queue "orders"`).
    pub object: String,
    /// What is wrong, with the broker's words (`missing: NOT_FOUND - no queue ...`).
    pub issue: String,
}

impl TopologyReport {
    /// True when nothing is missing or different.
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }
}

impl std::fmt::Display for TopologyReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "topology check: {} objects as expected, {} problems",
            self.ok.len(),
            self.problems.len()
        )?;
        for p in &self.problems {
            write!(f, "\n  {}: {}: {}", p.subscriber, p.object, p.issue)?;
        }
        Ok(())
    }
}

enum Expect {
    Exchange(String, ExchangeKind),
    Queue(String, FieldTable),
}

impl Topology {
    /// Checks every exchange and queue of this topology on `conn`, adding to `report`.
    /// Bindings are not checked: AMQP has no passive form of `queue.bind`.
    pub(crate) async fn check(
        &self,
        conn: &Connection,
        subscriber: &str,
        report: &mut TopologyReport,
    ) -> Result<()> {
        self.validate()?;
        let kind = exchange_kind(&self.exchange_kind)?;
        let mut expected = Vec::new();
        for b in &self.bindings {
            let named = format!("exchange {:?}", b.exchange);
            if b.exchange.is_empty()
                || b.exchange.starts_with("amq.")
                || expected.iter().any(|(n, _)| *n == named)
            {
                continue;
            }
            expected.push((named, Expect::Exchange(b.exchange.clone(), kind.clone())));
        }
        let parking = self.parking_queue();
        expected.push((
            format!("parking queue {parking:?}"),
            Expect::Queue(parking, FieldTable::default()),
        ));
        expected.push((
            format!("work queue {:?}", self.queue),
            Expect::Queue(self.queue.clone(), self.work_arguments()),
        ));
        if !self.tiers.is_empty() {
            let rx = self.retry_exchange();
            expected.push((
                format!("retry exchange {rx:?}"),
                Expect::Exchange(rx, ExchangeKind::Direct),
            ));
            for t in retry_dedup(&self.tiers) {
                let name = retry::tier_queue(&self.queue, t);
                expected.push((
                    format!("retry tier {name:?}"),
                    Expect::Queue(name, self.tier_arguments(t)),
                ));
            }
        }
        for (object, e) in expected {
            match probe(conn, &e).await? {
                None => report.ok.push(object),
                Some(issue) => report.problems.push(TopologyProblem {
                    subscriber: subscriber.to_owned(),
                    object,
                    issue,
                }),
            }
        }
        Ok(())
    }
}

/// `None` when the object exists as expected, else what is wrong. A failed declare closes
/// its channel, so each object gets a fresh one.
async fn probe(conn: &Connection, e: &Expect) -> Result<Option<String>> {
    let ch = conn.create_channel().await.map_err(Error::amqp)?;
    let declare = |passive: bool| {
        let ch = ch.clone();
        async move {
            match e {
                Expect::Exchange(name, kind) => ch
                    .exchange_declare(
                        name.as_str().into(),
                        kind.clone(),
                        ExchangeDeclareOptions {
                            passive,
                            durable: true,
                            ..Default::default()
                        },
                        FieldTable::default(),
                    )
                    .await
                    .map(|_| ()),
                Expect::Queue(name, args) => ch
                    .queue_declare(
                        name.as_str().into(),
                        QueueDeclareOptions {
                            passive,
                            durable: true,
                            ..Default::default()
                        },
                        if passive {
                            FieldTable::default()
                        } else {
                            args.clone()
                        },
                    )
                    .await
                    .map(|_| ()),
            }
        }
    };
    if let Err(err) = declare(true).await {
        let text = broker_words(&err);
        let verdict = if text.contains("NOT_FOUND") {
            "missing"
        } else {
            "cannot check"
        };
        return Ok(Some(format!("{verdict}: {text}")));
    }
    // A passive declare proves existence only: RabbitMQ compares kind, durability and
    // arguments (x-queue-type, TTL, dead-lettering) on a full declare alone, which
    // changes nothing when they are equal and is refused with 406 when they differ. It
    // runs only on an object the passive declare has just found, so nothing is created
    // unless someone deletes it in between.
    let issue = match declare(false).await {
        Ok(()) => None,
        // The broker names only the first argument that differs: say what was expected.
        Err(err) => Some(format!(
            "differs from the expected {}: {}",
            expected(e),
            broker_words(&err)
        )),
    };
    if ch.status().connected() {
        let _ = ch.close(200, "topology checked".into()).await;
    }
    Ok(issue)
}

/// The broker's reply text (`NOT_FOUND - no queue 'x' in vhost 'v'`) when there is one.
fn broker_words(err: &lapin::Error) -> String {
    let text = err.to_string();
    [
        "NOT_FOUND - ",
        "PRECONDITION_FAILED - ",
        "ACCESS_REFUSED - ",
    ]
    .iter()
    .find_map(|p| text.find(p).map(|i| text[i..].to_owned()))
    .unwrap_or(text)
}

/// `durable queue with x-queue-type = "quorum", x-delivery-limit = 20`.
fn expected(e: &Expect) -> String {
    match e {
        Expect::Exchange(_, kind) => format!("durable {kind:?} exchange").to_lowercase(),
        Expect::Queue(_, args) if args.inner().is_empty() => "durable queue, no arguments".into(),
        Expect::Queue(_, args) => {
            let mut pairs: Vec<String> = args
                .inner()
                .iter()
                .map(|(k, v)| match crate::headers::string(v) {
                    Some(s) => format!("{k} = {s:?}"),
                    None => match v {
                        lapin::types::AMQPValue::LongInt(n) => format!("{k} = {n}"),
                        other => format!("{k} = {other:?}"),
                    },
                })
                .collect();
            pairs.sort();
            if !args.inner().contains_key("x-queue-type") {
                pairs.insert(0, "classic type".into());
            }
            format!("durable queue with {}", pairs.join(", "))
        }
    }
}
