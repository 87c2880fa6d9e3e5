//! Connections: the broker's nodes, URL checks, a reconnecting connection slot that
//! rotates through the nodes, blocked tracking. Password redaction is in [`redact`], TLS
//! settings in [`TlsConfig`] (`connection/tls.rs`).

mod redact;
mod tls;

pub(crate) use redact::urls_in;
pub use redact::{redact, scrub};
pub(crate) use tls::HttpsConnector;
pub use tls::TlsConfig;

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use lapin::{Connection, ConnectionProperties, ErrorKind, Event, uri::AMQPUri};
use serde::Deserialize;
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::error::{Error, Result};

/// How to reach the broker: one or several nodes of a cluster, tried in turn.
///
/// `Debug` shows the URLs with their passwords replaced by `***`.
///
/// Every node must name the same vhost (a failover must not move the worker to another
/// set of queues); each URL carries its own user and password, which are used as given.
///
/// ```
/// # use rabbitkit_core::connection::{ConnectionConfig, NodeOrder};
/// let cfg = ConnectionConfig::nodes([
///     "amqp://app:secret@rabbit-1:5672/orders",
///     "amqp://app:secret@rabbit-2:5672/orders",
/// ])
/// .order(NodeOrder::Shuffled);
/// assert!(cfg.validate().is_ok());
/// ```
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ConnectionConfig {
    /// The nodes, `amqp://user:pass@host:port/vhost` each (`amqps://` with the `tls`
    /// feature, see [`ConnectionConfig::tls`]). In a file: `url = "…"` or
    /// `url = ["…", "…"]` (`urls` is accepted too).
    #[serde(rename = "url", alias = "urls", deserialize_with = "de_urls")]
    pub urls: Vec<String>,
    /// The order nodes are tried in (default: as listed).
    #[serde(default)]
    pub order: NodeOrder,
    /// Heartbeat interval; the lower of client and server values wins.
    #[serde(with = "humantime_serde", default = "default_heartbeat")]
    pub heartbeat: Duration,
    /// Time allowed for one TCP + AMQP handshake with one node; a node that takes longer
    /// counts as down and the next one is tried. `Worker::start` also waits this long in
    /// all (and at least one try of every node) for its connections.
    #[serde(with = "humantime_serde", default = "default_connect_timeout")]
    pub connect_timeout: Duration,
    /// Longest pause between reconnect rounds (backoff doubles from 100 ms up to this).
    #[serde(with = "humantime_serde", default = "default_max_backoff")]
    pub max_backoff: Duration,
    /// TLS settings of `amqps://` nodes (CA, client certificate, server name); none: the
    /// system's roots and each URL's host. Given, every URL must be `amqps://`.
    #[serde(default)]
    pub tls: Option<TlsConfig>,
}

/// The order in which a connection tries the nodes of a [`ConnectionConfig`].
///
/// Either way the nodes form a ring: a connection starts at the first node of its ring,
/// and after losing a node it tries the *next* one first, so the node that just failed is
/// tried last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NodeOrder {
    /// As listed (`in-order`, the default).
    #[default]
    InOrder,
    /// Each connection shuffles the list once (`shuffled`): workers spread over the
    /// cluster instead of all landing on the first node.
    Shuffled,
}

impl std::fmt::Debug for ConnectionConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionConfig")
            .field(
                "urls",
                &self.urls.iter().map(|u| redact(u)).collect::<Vec<_>>(),
            )
            .field("order", &self.order)
            .field("heartbeat", &self.heartbeat)
            .field("connect_timeout", &self.connect_timeout)
            .field("max_backoff", &self.max_backoff)
            .field("tls", &self.tls)
            .finish()
    }
}

pub(crate) fn default_heartbeat() -> Duration {
    Duration::from_secs(10)
}
pub(crate) fn default_connect_timeout() -> Duration {
    Duration::from_secs(10)
}
pub(crate) fn default_max_backoff() -> Duration {
    Duration::from_secs(5)
}

/// A string or a list of strings (a config file's `url`).
pub(crate) fn de_urls<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    let urls = match OneOrMany::deserialize(d)? {
        OneOrMany::One(url) => vec![url],
        OneOrMany::Many(urls) => urls,
    };
    check_urls(&urls)
        .map_err(|reason| serde::de::Error::custom(format!("invalid URL: {reason}")))?;
    Ok(urls)
}

/// Splits a comma-separated list of URLs (`RABBITKIT_URL`, `--url`). A comma inside a
/// password must be percent-encoded (`%2C`).
pub fn split_url_list(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect()
}

/// How long closing a connection may wait for the broker's close-ok.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// Whether a parsed URL is `amqps://` (in any case).
fn is_amqps(uri: &AMQPUri) -> bool {
    uri.scheme == lapin::uri::AMQPScheme::AMQPS
}

/// Whether `url` starts with the `amqps` scheme, in any case (`AMQPS://` too).
pub(crate) fn has_amqps_scheme(url: &str) -> bool {
    url.get(..8)
        .is_some_and(|s| s.eq_ignore_ascii_case("amqps://"))
}

/// Parses every URL and checks that they name one vhost; the reason never holds a URL.
fn check_urls(urls: &[String]) -> std::result::Result<Vec<AMQPUri>, String> {
    if urls.is_empty() {
        return Err("no broker URL given".into());
    }
    let many = urls.len() > 1;
    let mut parsed: Vec<AMQPUri> = Vec::with_capacity(urls.len());
    for (i, url) in urls.iter().enumerate() {
        let at = |reason: String| {
            let reason = scrub(&reason, [url.as_str()]);
            if many {
                format!("node {}: {reason}", i + 1)
            } else {
                reason
            }
        };
        let uri = AMQPUri::from_str(url).map_err(at)?;
        if let Some(first) = parsed.first()
            && first.vhost != uri.vhost
        {
            return Err(format!(
                "every node must name the same vhost: node 1 names {:?}, node {} names {:?}",
                first.vhost,
                i + 1,
                uri.vhost
            ));
        }
        parsed.push(uri);
    }
    Ok(parsed)
}

impl ConnectionConfig {
    /// A config for one node at `url`, with the defaults.
    pub fn new(url: impl Into<String>) -> Self {
        Self::nodes([url])
    }

    /// A config for several nodes of one cluster, tried in turn ([`NodeOrder`]).
    pub fn nodes<I, S>(urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            urls: urls.into_iter().map(Into::into).collect(),
            order: NodeOrder::default(),
            heartbeat: default_heartbeat(),
            connect_timeout: default_connect_timeout(),
            max_backoff: default_max_backoff(),
            tls: None,
        }
    }

    /// Sets the TLS settings (rabbitkit's `tls` feature; every URL `amqps://`). The files
    /// are read when a worker, publisher or tool using this config starts.
    #[must_use]
    pub fn tls(mut self, tls: TlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Sets the order the nodes are tried in.
    #[must_use]
    pub fn order(mut self, order: NodeOrder) -> Self {
        self.order = order;
        self
    }

    /// Checks every URL without connecting: each parses, `amqps://` only with the `tls`
    /// feature, and all name the same vhost; TLS settings only with the `tls` feature and
    /// `amqps://` URLs (their files are read at start, not here). Returns the first
    /// node's URL parsed. The error never contains a URL (passwords).
    pub fn validate(&self) -> Result<AMQPUri> {
        let mut parsed = check_urls(&self.urls).map_err(|reason| Error::InvalidUrl { reason })?;
        // The parsed scheme, not the text: `AMQPS://` is TLS too.
        let amqps: Vec<bool> = parsed.iter().map(is_amqps).collect();
        let any_tls = amqps.contains(&true);
        let first_plain = amqps.iter().position(|t| !*t);
        if !cfg!(feature = "tls") && any_tls {
            return Err(Error::InvalidUrl {
                reason: "amqps:// needs rabbitkit's `tls` feature".into(),
            });
        }
        if any_tls && let Some(i) = first_plain {
            return Err(Error::InvalidUrl {
                reason: format!(
                    "node {} is amqp:// among amqps:// nodes: a failover to it would send \
                     the password in clear",
                    i + 1
                ),
            });
        }
        if let Some(tls) = &self.tls {
            tls.check().map_err(Error::Config)?;
            if let Some(i) = first_plain {
                return Err(Error::Config(format!(
                    "TLS settings need amqps:// URLs; node {} is not",
                    i + 1
                )));
            }
        }
        if self.connect_timeout.is_zero() {
            return Err(Error::Config("connect-timeout must be above 0".into()));
        }
        if self.max_backoff.is_zero() {
            return Err(Error::Config(
                "max-backoff must be above 0 (reconnects would spin)".into(),
            ));
        }
        Ok(parsed.swap_remove(0))
    }

    /// The URLs with their passwords replaced by `***`, comma-separated, for logs.
    pub fn redacted_url(&self) -> String {
        self.urls
            .iter()
            .map(|u| redact(u))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `text` without any password of these URLs ([`scrub`]).
    pub fn scrub(&self, text: &str) -> String {
        scrub(text, self.urls.iter().map(String::as_str))
    }

    /// `url` with the heartbeat added unless it sets one. (`connection_timeout` in a URL
    /// only reaches lapin's blocking connect, not the async one rabbitkit uses: the
    /// handshake is bounded by `connect_timeout` here instead.)
    fn with_options(&self, url: &str) -> String {
        let mut url = url.to_owned();
        if !url.contains("heartbeat=") {
            url.push(if url.contains('?') { '&' } else { '?' });
            url.push_str(&format!(
                "heartbeat={}",
                self.heartbeat.as_secs().clamp(1, 600)
            ));
        }
        url
    }
}

/// One node as a connection sees it: the URL it connects with, the name logs show.
#[derive(Debug, Clone)]
struct Node {
    url: String,
    /// `host:port`, never the password.
    addr: Arc<str>,
    /// An `amqps://` node.
    tls: bool,
}

/// A live connection with the node it reached and its blocked state, as seen through the
/// one events listener (lapin shares events *between* listeners, so exactly one is kept).
#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) conn: Connection,
    pub(crate) generation: u64,
    /// `host:port` of the node, for logs.
    pub(crate) node: Arc<str>,
    index: usize,
    blocked: Arc<AtomicBool>,
    block_events: Arc<AtomicU64>,
}

impl Conn {
    pub(crate) fn is_usable(&self) -> bool {
        self.conn.status().connected()
    }
    /// Whether a resource alarm blocks the connection now.
    pub(crate) fn is_blocked(&self) -> bool {
        self.blocked.load(Ordering::Acquire)
    }
    /// How many times the connection has been blocked so far.
    pub(crate) fn block_count(&self) -> u64 {
        self.block_events.load(Ordering::Acquire)
    }
}

/// One named connection that reconnects on demand, rotating through the nodes, with
/// capped exponential backoff between rounds.
#[derive(Debug)]
pub(crate) struct Connector {
    cfg: ConnectionConfig,
    name: String,
    /// The ring, in the order it is walked (shuffled once for [`NodeOrder::Shuffled`]).
    nodes: Vec<Node>,
    slot: Mutex<Slot>,
    metrics: ConnMetrics,
    /// Set by [`Connector::close`]: no connection is opened after it, and a reconnect in
    /// progress gives up at once (a shutdown must not wait for a broker that is down).
    closed: tokio::sync::watch::Sender<bool>,
    /// The TLS settings, loaded when the connector is built, when a node is `amqps://`.
    tls: Option<tls::Loaded>,
}

/// The connection's series (labels `connection` and `vhost`), taken from the recorder
/// installed when the connector is built.
#[derive(Debug)]
struct ConnMetrics {
    up: metrics::Gauge,
    connects: metrics::Counter,
    lost: metrics::Counter,
    failures: metrics::Counter,
}

impl ConnMetrics {
    fn new(name: &str, vhost: &str) -> Self {
        use crate::stats::{CONNECT_FAILURES, CONNECTION_LOST, CONNECTION_UP, CONNECTS};
        let label = || [("connection", name.to_owned()), ("vhost", vhost.to_owned())];
        Self {
            up: metrics::gauge!(CONNECTION_UP, &label()),
            connects: metrics::counter!(CONNECTS, &label()),
            lost: metrics::counter!(CONNECTION_LOST, &label()),
            failures: metrics::counter!(CONNECT_FAILURES, &label()),
        }
    }
}

#[derive(Debug, Default)]
struct Slot {
    current: Option<Arc<Conn>>,
    generation: u64,
    /// Index of the node tried first next time.
    next: usize,
}

impl Connector {
    pub(crate) fn new(cfg: ConnectionConfig, name: impl Into<String>) -> Result<Self> {
        let parsed = check_urls(&cfg.urls).map_err(|reason| Error::InvalidUrl { reason })?;
        let vhost = cfg.validate()?.vhost;
        let mut nodes: Vec<Node> = cfg
            .urls
            .iter()
            .zip(parsed)
            .map(|(url, uri)| Node {
                url: cfg.with_options(url),
                addr: format!("{}:{}", uri.authority.host, uri.authority.port).into(),
                tls: is_amqps(&uri),
            })
            .collect();
        // Read once, here: a bad file stops the start with its name, and no reconnect
        // reads it again.
        let tls = if nodes.iter().any(|n| n.tls) {
            Some(cfg.tls.clone().unwrap_or_default().load()?)
        } else {
            None
        };
        if cfg.order == NodeOrder::Shuffled {
            shuffle(&mut nodes);
        }
        let name = name.into();
        Ok(Self {
            cfg,
            metrics: ConnMetrics::new(&name, &vhost),
            name,
            nodes,
            slot: Mutex::new(Slot::default()),
            closed: tokio::sync::watch::Sender::new(false),
            tls,
        })
    }

    /// The settings this connector connects with.
    pub(crate) fn config(&self) -> &ConnectionConfig {
        &self.cfg
    }

    /// The current connection if it is usable, else a new one.
    ///
    /// A reconnect walks the ring from the node after the one that was lost; each
    /// handshake gets `connect_timeout`. The first round tries every node whatever `wait`
    /// is; more rounds follow, with backoff, until one node answers or `wait` has passed.
    /// An authentication or authorization refusal ends it at once
    /// ([`Error::AccessRefused`]): users and permissions are cluster-wide, another node
    /// would refuse too.
    pub(crate) async fn get(&self, wait: Duration) -> Result<Arc<Conn>> {
        let mut closed = self.closed.subscribe();
        tokio::select! {
            biased;
            _ = closed.wait_for(|c| *c) => Err(Error::Closed { what: "connection" }),
            r = self.get_open(wait) => r,
        }
    }

    async fn get_open(&self, wait: Duration) -> Result<Arc<Conn>> {
        let deadline = Instant::now().checked_add(wait).unwrap_or_else(far_future);
        let mut slot = self.slot.lock().await;
        if let Some(c) = slot.current.as_ref().filter(|c| c.is_usable()) {
            return Ok(c.clone());
        }
        let n = self.nodes.len();
        if let Some(old) = slot.current.take() {
            slot.next = (old.index + 1) % n;
            self.metrics.up.set(0.0);
            self.metrics.lost.increment(1);
            tracing::warn!(connection = %self.name, node = %old.node, generation = old.generation, "connection lost; reconnecting");
        }
        let started = Instant::now();
        let mut failures: Vec<(Arc<str>, String)> = Vec::new();
        let mut round = 0u32;
        loop {
            for k in 0..n {
                let i = (slot.next + k) % n;
                let node = &self.nodes[i];
                let budget = if round == 0 {
                    self.cfg.connect_timeout
                } else {
                    self.cfg
                        .connect_timeout
                        .min(deadline.saturating_duration_since(Instant::now()))
                };
                if budget.is_zero() {
                    break;
                }
                let attempt =
                    tokio::time::timeout(budget, self.connect_once(i, slot.generation + 1)).await;
                let reason = match attempt {
                    Ok(Ok(conn)) => {
                        slot.generation += 1;
                        slot.next = i;
                        let conn = Arc::new(conn);
                        slot.current = Some(conn.clone());
                        self.metrics.up.set(1.0);
                        self.metrics.connects.increment(1);
                        tracing::info!(connection = %self.name, node = %node.addr, generation = slot.generation, "connected");
                        return Ok(conn);
                    }
                    Ok(Err(e)) => match self.not_retried(&e, &node.addr) {
                        Some(fatal) => return Err(fatal),
                        None => self.cfg.scrub(&e.to_string()),
                    },
                    Err(_) => format!("no AMQP handshake within {budget:?}"),
                };
                tracing::warn!(connection = %self.name, node = %node.addr, error = %reason, "connect failed");
                failures.retain(|(a, _)| *a != node.addr);
                self.metrics.failures.increment(1);
                failures.push((node.addr.clone(), reason));
            }
            round = round.saturating_add(1);
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Unreachable {
                    after: started.elapsed(),
                    nodes: failures
                        .iter()
                        .map(|(a, r)| format!("{a}: {r}"))
                        .collect::<Vec<_>>()
                        .join("; "),
                });
            }
            let pause = backoff(round, self.cfg.max_backoff).min(left);
            tracing::debug!(connection = %self.name, retry_in = ?pause, "no node reachable; retrying");
            tokio::time::sleep(pause).await;
        }
    }

    /// The error that ends a connect at once, when `e` is one that no retry and no other
    /// node can fix: an access refusal, or a TLS certificate refused by either side.
    fn not_retried(&self, e: &lapin::Error, node: &str) -> Option<Error> {
        let (error, what) = if let Some(reason) = access_refused(e) {
            let reason = self.cfg.scrub(&reason);
            let node = node.to_owned();
            (Error::AccessRefused { node, reason }, "access refused")
        } else {
            let reason = self.cfg.scrub(&tls::refused(e)?);
            let node = node.to_owned();
            (Error::Tls { node, reason }, "TLS certificate refused")
        };
        tracing::error!(connection = %self.name, %node, error = %error, "{what}; not retrying");
        Some(error)
    }

    /// Closes the current connection (if any); for good: later `get`s fail with
    /// [`Error::Closed`].
    pub(crate) async fn close(&self) {
        self.closed.send_replace(true);
        let mut slot = self.slot.lock().await;
        if let Some(c) = slot.current.take() {
            // Bounded: a connection blocked by a resource alarm is not read by the broker,
            // which never answers the close while heartbeats keep it alive. Past the bound
            // the connection is dropped; the broker requeues whatever it still held.
            let closing = c.conn.close(200, "rabbitkit shutdown".into());
            if tokio::time::timeout(CLOSE_WAIT, closing).await.is_err() {
                tracing::warn!(connection = %self.name, "the broker did not answer connection.close within {CLOSE_WAIT:?}; dropping the connection");
            }
            // Only a connector that had a connection says it is down: another one with
            // the same name and vhost (a check, a parking tool) must not flip the gauge.
            self.metrics.up.set(0.0);
        }
    }

    async fn connect_once(&self, index: usize, generation: u64) -> Result<Conn, lapin::Error> {
        let node = &self.nodes[index];
        let props = ConnectionProperties::default().with_connection_name(self.name.clone().into());
        let conn = match (&self.tls, node.tls) {
            (Some(tls), true) => tls::connect(&node.url, props, tls).await?,
            _ => Connection::connect(&node.url, props).await?,
        };
        let blocked = Arc::new(AtomicBool::new(false));
        let block_events = Arc::new(AtomicU64::new(0));
        let mut events = conn.events_listener();
        let (b, n) = (blocked.clone(), block_events.clone());
        let (name, addr) = (self.name.clone(), node.addr.clone());
        let up = self.metrics.up.clone();
        let status = conn.status().clone();
        tokio::spawn(async move {
            while let Some(ev) = events.next().await {
                match ev {
                    Event::ConnectionBlocked(reason) => {
                        b.store(true, Ordering::Release);
                        n.fetch_add(1, Ordering::AcqRel);
                        tracing::warn!(connection = %name, node = %addr, %reason, "connection blocked by the broker (resource alarm)");
                    }
                    Event::ConnectionUnblocked => {
                        b.store(false, Ordering::Release);
                        tracing::info!(connection = %name, node = %addr, "connection unblocked");
                    }
                    Event::Error(e) => {
                        // lapin reports a channel closed by the broker (a passive declare's
                        // 404) here too: only a connection in error is down. lapin marks the
                        // connection errored before it sends the event. `lost` is counted
                        // when the next user of the connection finds it gone and reconnects.
                        if !status.connected() {
                            up.set(0.0);
                            tracing::warn!(connection = %name, node = %addr, error = %e, "connection error");
                        } else {
                            // A channel the broker closed (a passive declare's 404, a
                            // 406): its operation returned the error to its caller, who
                            // says what it means; the connection is fine.
                            tracing::debug!(connection = %name, node = %addr, error = %e, "channel closed by the broker");
                        }
                    }
                    _ => {}
                }
            }
        });
        Ok(Conn {
            conn,
            generation,
            node: node.addr.clone(),
            index,
            blocked,
            block_events,
        })
    }
}

/// The broker's reason when it refused the login or the vhost: 403 ACCESS_REFUSED (user
/// or password) or 530 NOT_ALLOWED (no access to the vhost, or no such vhost), sent as
/// `connection.close` during the handshake (lapin announces `authentication_failure_close`).
fn access_refused(e: &lapin::Error) -> Option<String> {
    match e.kind() {
        ErrorKind::ProtocolError(amqp) if matches!(amqp.get_id(), 403 | 530) => {
            Some(amqp.to_string())
        }
        _ => None,
    }
}

/// A fresh random order (`fastrand`, already the jitter's source).
fn shuffle<T>(items: &mut [T]) {
    fastrand::shuffle(items);
}

/// About thirty years from now: the deadline of a wait that is, in practice, unbounded.
pub(crate) fn far_future() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(86_400 * 365 * 30)
}

/// Capped exponential backoff: 100 ms, 200 ms, 400 ms ... up to `max`.
pub(crate) fn backoff(failures: u32, max: Duration) -> Duration {
    crate::retry::doubled(Duration::from_millis(100), failures.saturating_sub(1), max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_a_password() {
        let debug = format!(
            "{:?}",
            ConnectionConfig::nodes(["amqp://app:s3cret@host/vh", "amqp://app:p@ss@two/vh"])
        );
        assert!(
            debug.contains("app:***@host") && debug.contains("app:***@two"),
            "{debug}"
        );
        assert!(
            !debug.contains("s3cret") && !debug.contains("p@ss"),
            "{debug}"
        );
    }

    #[test]
    fn bad_urls_are_typed_and_do_not_echo_the_url() {
        let err = ConnectionConfig::new("http://app:s3cret@host").validate();
        let Err(Error::InvalidUrl { reason }) = err else {
            panic!("expected InvalidUrl");
        };
        assert!(!reason.contains("s3cret"));
        assert!(
            ConnectionConfig::new("amqp://guest:guest@127.0.0.1:5672/%2f")
                .validate()
                .is_ok()
        );
    }

    #[test]
    fn plaintext_nodes_among_tls_nodes_and_zero_timings_are_refused() {
        // With the `tls` feature the mix is refused for what it is; without it, any
        // amqps:// node is refused first. Either way, no start.
        let mixed = ConnectionConfig::nodes(["amqps://a:pw@h1/v", "AMQP://a:pw@h2/v"]).validate();
        let Err(Error::InvalidUrl { reason }) = mixed else {
            panic!("expected InvalidUrl, got {mixed:?}");
        };
        assert!(!reason.contains("pw"), "{reason}");
        if cfg!(feature = "tls") {
            assert!(reason.contains("node 2"), "{reason}");
        }
        // The scheme is case-insensitive: `AMQPS://` is TLS too.
        if !cfg!(feature = "tls") {
            let upper = ConnectionConfig::new("AMQPS://a:pw@h1/v").validate();
            assert!(matches!(upper, Err(Error::InvalidUrl { .. })), "{upper:?}");
        }
        let mut c = ConnectionConfig::new("amqp://a:pw@h1/v");
        c.max_backoff = Duration::ZERO;
        assert!(matches!(c.validate(), Err(Error::Config(_))));
        let mut c = ConnectionConfig::new("amqp://a:pw@h1/v");
        c.connect_timeout = Duration::ZERO;
        assert!(matches!(c.validate(), Err(Error::Config(_))));
    }

    #[test]
    fn every_node_is_checked_and_named_by_position() {
        let err = ConnectionConfig::nodes(["amqp://a:pw@h1/v", "amqp://a:pw@h2:notaport/v"])
            .validate()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("node 2") && !err.contains("pw"), "{err}");
        let err = ConnectionConfig::nodes(Vec::<String>::new()).validate();
        assert!(matches!(err, Err(Error::InvalidUrl { .. })), "{err:?}");
    }

    #[test]
    fn nodes_must_share_the_vhost() {
        let err = ConnectionConfig::nodes(["amqp://a:pw@h1/orders", "amqp://a:pw@h2/billing"])
            .validate()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("same vhost") && err.contains("billing") && !err.contains("pw"),
            "{err}"
        );
        let ok = ConnectionConfig::nodes(["amqp://a:x@h1/orders", "amqp://b:y@h2:5673/orders"]);
        assert_eq!(
            ok.validate().map(|u| u.vhost).ok().as_deref(),
            Some("orders")
        );
    }

    #[test]
    fn a_url_list_splits_on_commas() {
        assert_eq!(
            split_url_list(" amqp://a@h1/v , amqp://a@h2/v,"),
            ["amqp://a@h1/v", "amqp://a@h2/v"]
        );
    }

    #[test]
    fn nodes_are_named_host_port_in_ring_order() {
        let c = Connector::new(
            ConnectionConfig::nodes(["amqp://a:pw@h1/v", "amqp://a:pw@h2:5673/v"]),
            "t",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let addrs: Vec<&str> = c.nodes.iter().map(|n| &*n.addr).collect();
        assert_eq!(addrs, ["h1:5672", "h2:5673"]);
    }

    #[test]
    fn shuffled_order_is_a_permutation_and_varies() {
        let urls: Vec<String> = (0..8).map(|i| format!("amqp://h{i}/v")).collect();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..20 {
            let c = Connector::new(
                ConnectionConfig::nodes(urls.clone()).order(NodeOrder::Shuffled),
                "t",
            )
            .unwrap_or_else(|e| panic!("{e}"));
            let mut order: Vec<String> = c.nodes.iter().map(|n| n.addr.to_string()).collect();
            seen.insert(order.clone());
            order.sort();
            let mut want: Vec<String> = (0..8).map(|i| format!("h{i}:5672")).collect();
            want.sort();
            assert_eq!(order, want);
        }
        assert!(seen.len() > 1, "20 shuffles of 8 nodes were all the same");
    }

    #[test]
    fn backoff_is_capped() {
        let max = Duration::from_secs(5);
        assert_eq!(backoff(1, max), Duration::from_millis(100));
        assert_eq!(backoff(3, max), Duration::from_millis(400));
        assert_eq!(backoff(30, max), max);
    }

    #[test]
    fn the_heartbeat_is_appended_once() {
        let c = ConnectionConfig::new("amqp://h/%2f?heartbeat=3");
        assert_eq!(c.with_options(&c.urls[0]).matches("heartbeat=").count(), 1);
        let c = ConnectionConfig::new("amqp://h/%2f");
        assert_eq!(c.with_options(&c.urls[0]), "amqp://h/%2f?heartbeat=10");
    }
}
