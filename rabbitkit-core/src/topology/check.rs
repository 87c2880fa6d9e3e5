//! Checking a topology against the broker without creating anything, and declaring it
//! from a connection config: what the operator CLI's `topology check` / `apply` and the
//! config worker's `--check` ([`Worker::check_topology`](crate::Worker::check_topology)) run.

use std::time::Duration;

use lapin::options::{ExchangeDeclareOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ExchangeKind};

use super::reply::{reply_code, reply_text};
use super::{QueueType, Topology, TopologyMode, exchange_kind};
use crate::connection::{ConnectionConfig, Connector};
use crate::error::{Error, Result};

/// How long a check or a declaration waits for a connection.
const CONNECT_WAIT: Duration = Duration::from_secs(15);

/// What the broker has for one object of a topology.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ObjectState {
    /// It exists with the expected kind and arguments.
    Present,
    /// It does not exist.
    Missing,
    /// It exists with another kind or other arguments; the broker's words.
    Different(String),
}

impl std::fmt::Display for ObjectState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ObjectState::Present => f.write_str("as expected"),
            ObjectState::Missing => f.write_str("missing"),
            ObjectState::Different(why) => write!(f, "differs: {why}"),
        }
    }
}

/// One queue or exchange and what the broker has for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedObject {
    /// Whose topology needs it: the subscriber's handler name in a worker check, the work
    /// queue in [`Topology::check`].
    pub subscriber: String,
    /// What it is, for example `work queue "orders"`.
    pub what: String,
    /// What the broker has.
    pub state: ObjectState,
}

/// The result of [`Topology::check`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopologyReport {
    /// Every queue and exchange of the topology, in declaration order.
    pub objects: Vec<CheckedObject>,
    /// Bindings the check could not look at: AMQP has no passive binding check, and
    /// binding to look would create the binding.
    pub unchecked_bindings: Vec<String>,
}

impl TopologyReport {
    /// True when every object is present as expected.
    pub fn is_ok(&self) -> bool {
        self.objects.iter().all(|o| o.state == ObjectState::Present)
    }

    /// The objects that are missing or different.
    pub fn problems(&self) -> impl Iterator<Item = &CheckedObject> {
        self.objects
            .iter()
            .filter(|o| o.state != ObjectState::Present)
    }

    /// The objects found as expected.
    pub fn present(&self) -> impl Iterator<Item = &CheckedObject> {
        self.objects
            .iter()
            .filter(|o| o.state == ObjectState::Present)
    }
}

impl std::fmt::Display for TopologyReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "topology check: {} objects as expected, {} problems",
            self.present().count(),
            self.problems().count()
        )?;
        for p in self.problems() {
            write!(f, "\n  {}: {}: {}", p.subscriber, p.what, p.state)?;
        }
        Ok(())
    }
}

/// A queue or an exchange to look for.
struct Object {
    what: String,
    name: String,
    /// `None` for a queue.
    exchange: Option<ExchangeKind>,
    arguments: FieldTable,
    /// Another shape accepted instead, and what the object is then called: the classic
    /// parking queue of an earlier release, used as it is until it is migrated.
    accepted: Option<(FieldTable, String)>,
}

impl Topology {
    /// Looks for every queue and exchange of this topology on the broker, creating nothing.
    ///
    /// Each object is first declared passively: `404 NOT_FOUND` is [`ObjectState::Missing`].
    /// An object that exists is declared again with the expected kind and arguments, which
    /// the broker answers with `406 PRECONDITION_FAILED` when they differ
    /// ([`ObjectState::Different`]) and otherwise leaves as it is. Bindings are listed in
    /// [`TopologyReport::unchecked_bindings`]. Refused topologies ([`Topology::validate`])
    /// and broker errors other than those two are an `Err`.
    pub async fn check(&self, connection: &ConnectionConfig) -> Result<TopologyReport> {
        self.validate()?;
        let connector = Connector::new(
            connection.clone(),
            format!("rabbitkit-topology-check {}", self.queue),
        )?;
        let conn = connector.get(CONNECT_WAIT).await?;
        let checked = self.check_on(&conn.conn, &self.queue).await;
        connector.close().await;
        Ok(TopologyReport {
            objects: checked?,
            unchecked_bindings: self.unchecked_bindings().collect(),
        })
    }

    /// The bindings a check cannot look at (AMQP has no passive binding check), described
    /// as `"shop" → "orders" ("order.*")`.
    pub(crate) fn unchecked_bindings(&self) -> impl Iterator<Item = String> + '_ {
        self.bindings
            .iter()
            .filter(|b| !b.exchange.is_empty())
            .map(|b| format!("{:?} → {:?} ({:?})", b.exchange, self.queue, b.routing_key))
    }

    /// Checks every exchange and queue on `conn` (see [`Topology::check`]), naming
    /// `subscriber` as the one that needs them.
    pub(crate) async fn check_on(
        &self,
        conn: &Connection,
        subscriber: &str,
    ) -> Result<Vec<CheckedObject>> {
        self.validate()?;
        let mut out = Vec::new();
        for o in self.objects()? {
            let mut state = probe(conn, &o).await?;
            let mut what = o.what.clone();
            if let (ObjectState::Different(_), Some((arguments, called))) = (&state, &o.accepted) {
                let other = Object {
                    arguments: arguments.clone(),
                    accepted: None,
                    what: String::new(),
                    name: o.name.clone(),
                    exchange: None,
                };
                if probe(conn, &other).await? == ObjectState::Present {
                    state = ObjectState::Present;
                    what = called.clone();
                }
            }
            out.push(CheckedObject {
                subscriber: subscriber.to_owned(),
                what,
                state,
            });
        }
        Ok(out)
    }

    /// Declares this topology ([`Topology::apply`] in `Declare` mode) on a connection of its
    /// own, closed afterwards. A parking queue of another shape (the classic one of an
    /// earlier release) is kept as it is, with a warning naming
    /// [`Topology::migrate_parking`]'s command: it is not an error here.
    pub async fn declare(&self, connection: &ConnectionConfig) -> Result<()> {
        self.apply_on_own_connection(connection, TopologyMode::Declare)
            .await
    }

    /// Declares rabbitkit's own objects beside a work queue that exists and that rabbitkit
    /// did not declare ([`TopologyMode::Adopt`]), on a connection of its own: the work queue
    /// is checked (through [`Topology::management`] when set, so that a dead-letter
    /// exchange set by a policy counts), then the bound exchanges and bindings, the retry
    /// exchange, the delay tiers and the parking queue are declared. A work queue without
    /// rabbitkit's dead-letter target is [`Error::WorkQueueMismatch`], whose fix is the
    /// [`Topology::policy_command`] to run; nothing is declared then.
    pub async fn adopt(&self, connection: &ConnectionConfig) -> Result<()> {
        self.apply_on_own_connection(connection, TopologyMode::Adopt)
            .await
    }

    async fn apply_on_own_connection(
        &self,
        connection: &ConnectionConfig,
        mode: TopologyMode,
    ) -> Result<()> {
        self.validate()?;
        let site = self.site(connection)?;
        let connector = Connector::new(
            connection.clone(),
            format!("rabbitkit-topology-apply {}", self.queue),
        )?;
        let conn = connector.get(CONNECT_WAIT).await?;
        let result = match conn.conn.create_channel().await {
            Ok(ch) => {
                let r = self.apply_in(&ch, mode, &site).await;
                let _ = ch.close(200, "rabbitkit topology apply".into()).await;
                match r {
                    // The classic parking queue of an earlier release: everything else is
                    // declared, and it works as it is (said once, with the migrate command).
                    Err(e) if super::parking::is_other_parking_queue(&e) => {
                        self.warn_other_parking_queue(&conn.conn).await;
                        Ok(())
                    }
                    r => r,
                }
            }
            Err(e) => Err(Error::amqp(e)),
        };
        connector.close().await;
        result
    }

    /// The objects [`Topology::apply`] declares, in its order.
    fn objects(&self) -> Result<Vec<Object>> {
        let kind = exchange_kind(&self.exchange_kind)?;
        let mut out: Vec<Object> = Vec::new();
        for b in &self.bindings {
            let skip = b.exchange.is_empty() || b.exchange.starts_with("amq.");
            if skip || out.iter().any(|o| o.name == b.exchange) {
                continue;
            }
            out.push(Object {
                what: format!("exchange {:?} ({})", b.exchange, self.exchange_kind),
                name: b.exchange.clone(),
                exchange: Some(kind.clone()),
                arguments: FieldTable::default(),
                accepted: None,
            });
        }
        let parking = self.parking_queue();
        // A classic parking queue of an earlier release works (it is used as it is) where
        // a quorum one is declared now: accepted, and named so. `x-queue-type = classic`
        // matches a classic queue declared without a type.
        let accepted = (self.parking_queue_type() == QueueType::Quorum).then(|| {
            let mut classic = FieldTable::default();
            classic.insert("x-queue-type".into(), super::ls("classic"));
            let called = format!(
                "parking queue {parking:?} (classic, of an earlier release: not replicated; `rabbitkit parking migrate {}` makes it quorum)",
                self.queue
            );
            (classic, called)
        });
        out.push(Object {
            what: format!("parking queue {parking:?}"),
            name: parking,
            exchange: None,
            arguments: self.parking_arguments(),
            accepted,
        });
        out.push(Object {
            what: format!("work queue {:?}", self.queue),
            name: self.queue.clone(),
            exchange: None,
            arguments: self.work_arguments(),
            accepted: None,
        });
        if !self.tiers.is_empty() {
            let rx = self.retry_exchange();
            out.push(Object {
                what: format!("retry exchange {rx:?} (direct)"),
                name: rx,
                exchange: Some(ExchangeKind::Direct),
                arguments: FieldTable::default(),
                accepted: None,
            });
            for t in super::retry_dedup(&self.tiers) {
                let name = self.tier_queue(t);
                out.push(Object {
                    what: format!("retry tier {name:?}"),
                    name,
                    exchange: None,
                    arguments: self.tier_arguments(t),
                    accepted: None,
                });
            }
        }
        Ok(out)
    }
}

/// What the broker has for `o`, on a channel of its own (a refused declare closes it).
async fn probe(conn: &Connection, o: &Object) -> Result<ObjectState> {
    let state = match declare(conn, o, true).await? {
        Err(e) if reply_code(&e) == Some(404) => ObjectState::Missing,
        Err(e) => return Err(Error::amqp(e)),
        // It exists, so declaring it again with the expected arguments creates nothing.
        Ok(()) => match declare(conn, o, false).await? {
            Ok(()) => ObjectState::Present,
            // The broker names only the first argument that differs: say what was expected.
            Err(e) if reply_code(&e) == Some(406) => ObjectState::Different(format!(
                "expected a {}; the broker says {}",
                expected(o),
                reply_text(&e)
            )),
            Err(e) => return Err(Error::amqp(e)),
        },
    };
    Ok(state)
}

/// Declares `o` on a fresh channel; the outer `Result` is about the channel itself.
async fn declare(
    conn: &Connection,
    o: &Object,
    passive: bool,
) -> Result<std::result::Result<(), lapin::Error>> {
    let ch = conn.create_channel().await.map_err(Error::amqp)?;
    let r = match &o.exchange {
        Some(kind) => {
            let opts = ExchangeDeclareOptions {
                passive,
                durable: true,
                ..Default::default()
            };
            ch.exchange_declare(
                o.name.as_str().into(),
                kind.clone(),
                opts,
                o.arguments.clone(),
            )
            .await
        }
        None => {
            let opts = QueueDeclareOptions {
                passive,
                durable: true,
                ..Default::default()
            };
            ch.queue_declare(o.name.as_str().into(), opts, o.arguments.clone())
                .await
                .map(|_| ())
        }
    };
    if r.is_ok() {
        let _ = ch.close(200, "rabbitkit topology check".into()).await;
    }
    Ok(r)
}

/// `durable queue with x-queue-type = "quorum", x-delivery-limit = 20`.
fn expected(o: &Object) -> String {
    if let Some(kind) = &o.exchange {
        return format!("durable {kind:?} exchange").to_lowercase();
    }
    if o.arguments.inner().is_empty() {
        return "durable queue, no arguments".into();
    }
    let mut pairs: Vec<String> = o
        .arguments
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
    if !o.arguments.inner().contains_key("x-queue-type") {
        pairs.insert(0, "classic type".into());
    }
    format!("durable queue with {}", pairs.join(", "))
}
