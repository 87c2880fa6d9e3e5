//! The sections of a worker config file, as strict serde structs.

use std::num::{NonZeroU16, NonZeroUsize};
use std::time::Duration;

use serde::Deserialize;

use super::retry::RetrySection;
use crate::coalesce::AckCoalescing;
use crate::connection::{
    ConnectionConfig, NodeOrder, TlsConfig, de_urls, default_connect_timeout, default_heartbeat,
    default_max_backoff, redact,
};
use crate::policy::{AckPolicy, ManualFallback};
use crate::publisher::PublisherConfig;
use crate::retry::RetryPolicy;
use crate::topology::{Binding, QueueType, TopologyMode};

/// A whole worker config file. Unknown keys anywhere are refused.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct WorkerConfig {
    /// `[connection]`: the broker.
    pub connection: ConnectionSection,
    /// `[publisher]`: the publisher of retry and parking copies ([`PublisherConfig`]).
    #[serde(default)]
    pub publisher: PublisherConfig,
    /// `[topology]`: declare or only validate.
    #[serde(default)]
    pub topology: TopologySection,
    /// How long in-flight handlers may run after shutdown starts (default 30 s).
    #[serde(with = "humantime_serde", default = "default_shutdown_deadline")]
    pub shutdown_deadline: Duration,
    /// `[observability]`: logging.
    #[serde(default)]
    pub observability: Observability,
    /// `[[subscribers]]`: at least one.
    pub subscribers: Vec<SubscriberConfig>,
}

fn default_shutdown_deadline() -> Duration {
    Duration::from_secs(30)
}

/// `[connection]`: how to reach the broker ([`ConnectionConfig`] plus `tls`).
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ConnectionSection {
    /// `url = "amqp://user:pass@host:port/vhost"`, or a list of the nodes of one cluster
    /// (`url = ["amqp://…@rabbit-1/v", "amqp://…@rabbit-2/v"]`; `urls` is accepted too).
    /// Every node names the same vhost. [`URL_ENV`](super::URL_ENV) (comma-separated)
    /// overrides it.
    #[serde(rename = "url", alias = "urls", deserialize_with = "de_urls")]
    pub urls: Vec<String>,
    /// `in-order` (default) or `shuffled` ([`NodeOrder`]).
    #[serde(default)]
    pub order: NodeOrder,
    /// Heartbeat interval (default 10 s).
    #[serde(with = "humantime_serde", default = "default_heartbeat")]
    pub heartbeat: Duration,
    /// Time allowed for one TCP + AMQP handshake with one node (default 10 s).
    #[serde(with = "humantime_serde", default = "default_connect_timeout")]
    pub connect_timeout: Duration,
    /// Cap of the reconnect backoff (default 5 s).
    #[serde(with = "humantime_serde", default = "default_max_backoff")]
    pub max_backoff: Duration,
    /// TLS: `tls = true`, or a `[connection.tls]` table of [`TlsConfig`] settings
    /// (`ca-file`, `cert-file`, `key-file`, `server-name`), turns it on: every URL must
    /// be `amqps://` and rabbitkit built with its `tls` feature. Off (default, `None`):
    /// every URL must be `amqp://`. Also checked against an overriding URL, so an
    /// environment cannot turn TLS off by accident.
    #[serde(default, deserialize_with = "de_tls")]
    pub tls: Option<TlsConfig>,
}

/// `tls = true | false`, or a table of settings (which turns TLS on).
fn de_tls<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<TlsConfig>, D::Error> {
    struct OnOrSettings;
    impl<'de> serde::de::Visitor<'de> for OnOrSettings {
        type Value = Option<TlsConfig>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("true, false, or a table of TLS settings (ca-file, cert-file, key-file, server-name)")
        }
        fn visit_bool<E: serde::de::Error>(self, on: bool) -> Result<Self::Value, E> {
            Ok(on.then(TlsConfig::default))
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            TlsConfig::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(Some)
        }
    }
    d.deserialize_any(OnOrSettings)
}

impl std::fmt::Debug for ConnectionSection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionSection")
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

impl ConnectionSection {
    /// The [`ConnectionConfig`] this section describes.
    pub fn to_connection_config(&self) -> ConnectionConfig {
        ConnectionConfig {
            urls: self.urls.clone(),
            order: self.order,
            heartbeat: self.heartbeat,
            connect_timeout: self.connect_timeout,
            max_backoff: self.max_backoff,
            tls: self.tls.clone(),
        }
    }

    pub(crate) fn check_tls(&self) -> Result<(), String> {
        let amqps = self
            .urls
            .iter()
            .filter(|u| crate::connection::has_amqps_scheme(u))
            .count();
        match (&self.tls, amqps) {
            (Some(_), n) if n < self.urls.len() => Err("TLS needs amqps:// URLs".into()),
            (None, n) if n > 0 => Err("an amqps:// URL needs tls = true".into()),
            (Some(_), _) if !cfg!(feature = "tls") => {
                Err("TLS needs rabbitkit built with its `tls` cargo feature".into())
            }
            (Some(tls), _) => tls.check(),
            _ => Ok(()),
        }
    }
}

/// `[topology]`: what a worker does with its queues and exchanges at start.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct TopologySection {
    /// `declare` (default) everything; only `validate` it (nothing is created; the worker
    /// does not start when something is missing, or when a work queue lacks in effect an
    /// argument rabbitkit needs, its dead-letter target above all); or `adopt` work queues
    /// someone else declared (checked as in `validate`, then rabbitkit's exchanges,
    /// bindings, tiers and parking queue declared beside them). See [`TopologyMode`].
    #[serde(default)]
    pub mode: TopologyMode,
    /// The management API (`https://[user:password@]host:port`, or `http://` to a loopback
    /// host; user and password default
    /// to the broker URL's), read in the `validate` and `adopt` modes to see each work
    /// queue's effective policy: without it, a dead-letter exchange set by a policy cannot
    /// be seen and is refused as missing. Refused in `declare` mode, which never reads it.
    #[serde(default)]
    pub management_url: Option<String>,
    /// Allows a plain `http://` `management-url` whose host is not loopback, which sends
    /// the password in clear over the network (default `false`: such a URL is refused at
    /// start; [`ManagementUrl::allow_plain_http`](crate::topology::ManagementUrl::allow_plain_http)).
    /// Refused without `management-url`.
    #[serde(default)]
    pub allow_plain_http: bool,
}

/// `[observability]`: logging and the metrics endpoint. rabbitkit does not install a
/// global tracing subscriber: the binary applies the log keys (as
/// `examples/config_worker.rs` does); the worker serves `http-listen` itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Observability {
    /// Most verbose level logged (default `info`).
    #[serde(default)]
    pub log_level: LogLevel,
    /// Line format (default `full`).
    #[serde(default)]
    pub log_format: LogFormat,
    /// Where the worker serves `GET /metrics` (Prometheus), `/healthz` and `/readyz`
    /// ([`Worker::http`](crate::Worker::http)); none by default. Needs rabbitkit's `http`
    /// cargo feature: without it the key is refused rather than ignored.
    #[serde(default)]
    pub http_listen: Option<std::net::SocketAddr>,
    /// How often each subscriber's parking queue depth is polled into the
    /// `rabbitkit_parking_depth` gauge ([`Worker::parking_depth_interval`](crate::Worker::parking_depth_interval));
    /// off by default, at least `1s`.
    #[serde(default, with = "humantime_serde")]
    pub parking_depth_interval: Option<std::time::Duration>,
}

/// A log level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LogLevel {
    /// Errors only.
    Error,
    /// Warnings and errors.
    Warn,
    /// The default: connections, topology, shutdown.
    #[default]
    Info,
    /// Every settlement.
    Debug,
    /// Everything.
    Trace,
}

impl LogLevel {
    /// As a `tracing` level.
    pub fn as_tracing(self) -> tracing::Level {
        match self {
            LogLevel::Error => tracing::Level::ERROR,
            LogLevel::Warn => tracing::Level::WARN,
            LogLevel::Info => tracing::Level::INFO,
            LogLevel::Debug => tracing::Level::DEBUG,
            LogLevel::Trace => tracing::Level::TRACE,
        }
    }
}

/// A log line format (the formats of `tracing-subscriber`'s `fmt`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LogFormat {
    /// One line per event with its fields (the default).
    #[default]
    Full,
    /// Shorter lines.
    Compact,
    /// Multi-line, for a terminal.
    Pretty,
}

/// `[[subscribers]]`: one queue and the registered handler that consumes it. A key left
/// out keeps what the registered subscriber has (the builder defaults for a plain handler,
/// the attribute's values for a `#[subscriber]` function).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct SubscriberConfig {
    /// The registered handler's name ([`Handlers`](super::Handlers)).
    pub handler: String,
    /// Name in logs, stats and evidence headers (default: the queue). Unique per worker.
    pub name: Option<String>,
    /// The work queue.
    pub queue: String,
    /// `classic` or `quorum`.
    pub queue_type: Option<QueueType>,
    /// Quorum only: `x-delivery-limit`.
    pub delivery_limit: Option<u32>,
    /// Type of the delay tiers: `quorum` (default, at-least-once dead-lettering into the
    /// work queue) or `classic` (opt-in, at-most-once: see
    /// [`Topology::tier_queue_type`](crate::topology::Topology::tier_queue_type)).
    pub tier_queue_type: Option<QueueType>,
    /// Kind of the bound exchanges: `topic`, `direct`, `fanout`, `headers`.
    pub exchange_kind: Option<String>,
    /// Bindings (`{ exchange = "shop", routing-key = "order.*" }`); replace the registered
    /// subscriber's when given.
    pub bindings: Option<Vec<Binding>>,
    /// Unacked deliveries the broker may push (1..=65535; 0 is refused).
    pub prefetch: Option<NonZeroU16>,
    /// Handlers running at once (0 is refused); at most `prefetch` run.
    pub concurrency: Option<NonZeroUsize>,
    /// `auto`, `manual`, `nack-on-error` or `ack-first`.
    pub ack: Option<AckPolicy>,
    /// Manual mode: what a handler that returns without settling gets.
    pub manual_fallback: Option<ManualFallback>,
    /// Requeues allowed per message before the next one parks it (`requeue-limit`);
    /// at least 1.
    pub requeue_limit: Option<std::num::NonZeroU32>,
    /// Deadline of one handler run; past it the run fails with `timeout` (retried).
    #[serde(with = "humantime_serde::option", default)]
    pub deadline: Option<Duration>,
    /// `[subscribers.retry]`: tiers, max-attempts, immediate retries, kinds
    /// ([`RetrySection`]); each key given overrides the registered policy's, a key left
    /// out keeps it.
    pub retry: Option<RetrySection>,
    /// `ack-coalescing = { max-acks = 32, max-delay = "5ms" }`: a run of successes acked
    /// with one multiple ack ([`AckCoalescing`]); off unless given. `max-acks` 1..=prefetch,
    /// `max-delay` at most 1 s.
    pub ack_coalescing: Option<AckCoalescing>,
}

impl WorkerConfig {
    /// Checks what serde cannot: (key path, message) of the first problem.
    pub(crate) fn validate(&self) -> Result<(), (String, String)> {
        self.connection
            .check_tls()
            .map_err(|m| ("connection.tls".to_owned(), m))?;
        if self.observability.http_listen.is_some() && !cfg!(feature = "http") {
            return Err((
                "observability.http-listen".into(),
                "needs rabbitkit built with its `http` cargo feature".into(),
            ));
        }
        if self.publisher.max_in_flight == 0 {
            return Err((
                "publisher.max-in-flight".into(),
                "must be at least 1".into(),
            ));
        }
        if self.publisher.channels == 0 {
            return Err(("publisher.channels".into(), "must be at least 1".into()));
        }
        if self.publisher.confirm_timeout.is_zero() {
            return Err((
                "publisher.confirm-timeout".into(),
                "must be above 0 (every copy would time out)".into(),
            ));
        }
        if self.publisher.max_body == 0 {
            return Err(("publisher.max-body".into(), "must be at least 1".into()));
        }
        if self.connection.connect_timeout.is_zero() {
            return Err((
                "connection.connect-timeout".into(),
                "must be above 0".into(),
            ));
        }
        if self.connection.max_backoff.is_zero() {
            return Err((
                "connection.max-backoff".into(),
                "must be above 0 (reconnects would spin)".into(),
            ));
        }
        if self.subscribers.is_empty() {
            return Err((
                "subscribers".into(),
                "at least one [[subscribers]] table is needed".into(),
            ));
        }
        let mut names = std::collections::HashSet::new();
        for (i, s) in self.subscribers.iter().enumerate() {
            let at = |k: &str| format!("subscribers[{i}].{k}");
            if !names.insert(s.display_name()) {
                return Err((
                    at(if s.name.is_some() { "name" } else { "queue" }),
                    format!(
                        "two subscribers are named {:?} (the name defaults to the queue)",
                        s.display_name()
                    ),
                ));
            }
            if s.deadline.is_some_and(|d| d.is_zero()) {
                return Err((
                    at("deadline"),
                    "must be above 0 (every handler run would time out)".into(),
                ));
            }
            if let Some(c) = &s.ack_coalescing {
                // The registered subscriber's prefetch is checked when the worker is built.
                c.check(s.prefetch.map(|p| p.get()))
                    .map_err(|(k, m)| (at(&format!("ack-coalescing.{k}")), m))?;
            }
            if let Some(r) = &s.retry {
                if r.max_attempts == Some(0) {
                    return Err((at("retry.max-attempts"), "must be at least 1".into()));
                }
                crate::kind::validate(&r.kinds).map_err(|e| (at("retry.kinds"), e.to_string()))?;
                // The tiers this section gives (the registered ones are the code's to check).
                let mut given = RetryPolicy::new(r.tiers.iter().flatten().copied());
                given.kinds.clone_from(&r.kinds);
                given
                    .validate()
                    .map_err(|e| (at("retry.tiers"), e.to_string()))?;
            }
        }
        Ok(())
    }
}

impl SubscriberConfig {
    /// The subscriber's name: `name`, else the queue.
    pub fn display_name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.queue)
    }
}
