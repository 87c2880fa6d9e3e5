//! The sections of a worker config file, as strict serde structs.

use std::num::{NonZeroU16, NonZeroUsize};
use std::str::FromStr;
use std::time::Duration;

use lapin::uri::AMQPUri;
use serde::Deserialize;

use crate::connection::{
    ConnectionConfig, default_connect_timeout, default_heartbeat, default_max_backoff, redact,
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
    /// `amqp://user:pass@host:port/vhost`; [`URL_ENV`](super::URL_ENV) overrides it.
    #[serde(deserialize_with = "de_url")]
    pub url: String,
    /// Heartbeat interval (default 10 s).
    #[serde(with = "humantime_serde", default = "default_heartbeat")]
    pub heartbeat: Duration,
    /// Time allowed for one TCP + AMQP handshake (default 10 s).
    #[serde(with = "humantime_serde", default = "default_connect_timeout")]
    pub connect_timeout: Duration,
    /// Cap of the reconnect backoff (default 5 s).
    #[serde(with = "humantime_serde", default = "default_max_backoff")]
    pub max_backoff: Duration,
    /// TLS on (the URL must be `amqps://` and rabbitkit built with its `tls` feature) or
    /// off (default; the URL must be `amqp://`). Also checked against an overriding URL, so
    /// an environment cannot turn TLS off by accident.
    #[serde(default)]
    pub tls: bool,
}

impl std::fmt::Debug for ConnectionSection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionSection")
            .field("url", &redact(&self.url))
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
            url: self.url.clone(),
            heartbeat: self.heartbeat,
            connect_timeout: self.connect_timeout,
            max_backoff: self.max_backoff,
        }
    }

    pub(crate) fn check_tls(&self) -> Result<(), String> {
        let amqps = self.url.starts_with("amqps://");
        match (self.tls, amqps) {
            (true, false) => Err("tls = true needs an amqps:// URL".into()),
            (false, true) => Err("an amqps:// URL needs tls = true".into()),
            (true, true) if !cfg!(feature = "tls") => {
                Err("tls = true needs rabbitkit built with its `tls` cargo feature".into())
            }
            _ => Ok(()),
        }
    }
}

/// Parses an AMQP URL; the reason never contains the URL.
pub(crate) fn check_url(url: &str) -> Result<(), String> {
    AMQPUri::from_str(url).map(|_| ()).map_err(|reason| {
        // lapin's reasons name the part that failed, not the URL; make sure of it.
        match url.split_once("://").and_then(|(_, r)| r.split_once('@')) {
            Some((userinfo, _)) if userinfo.contains(':') => {
                let password = userinfo.split_once(':').map_or("", |(_, p)| p);
                if password.is_empty() {
                    reason
                } else {
                    reason.replace(password, "***")
                }
            }
            _ => reason,
        }
    })
}

fn de_url<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let url = String::deserialize(d)?;
    check_url(&url).map_err(|reason| serde::de::Error::custom(format!("invalid URL: {reason}")))?;
    Ok(url)
}

/// `[topology]`: what a worker does with its queues and exchanges at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct TopologySection {
    /// `declare` (default) everything, or only `validate` it passively (nothing is
    /// created; the worker does not start when something is missing).
    #[serde(default)]
    pub mode: TopologyMode,
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
    /// Deadline of one handler run; past it the run fails with `timeout` (retried).
    #[serde(with = "humantime_serde::option", default)]
    pub deadline: Option<Duration>,
    /// `[subscribers.retry]`: tiers, max-attempts, immediate retries ([`RetryPolicy`]).
    pub retry: Option<RetryPolicy>,
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
            if let Some(r) = &s.retry {
                if r.max_attempts == 0 {
                    return Err((at("retry.max-attempts"), "must be at least 1".into()));
                }
                r.validate()
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
