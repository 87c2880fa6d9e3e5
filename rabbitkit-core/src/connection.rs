//! Connections: URL checks, redaction, a reconnecting connection slot, blocked tracking.

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use lapin::{Connection, ConnectionProperties, Event, uri::AMQPUri};
use serde::Deserialize;
use tokio::sync::Mutex;

use crate::error::{Error, Result};

/// How to reach the broker.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ConnectionConfig {
    /// `amqp://user:pass@host:port/vhost` (`amqps://` with the `tls` feature).
    pub url: String,
    /// Heartbeat interval; the lower of client and server values wins.
    #[serde(with = "humantime_serde", default = "default_heartbeat")]
    pub heartbeat: Duration,
    /// Time allowed for one TCP + AMQP handshake.
    #[serde(with = "humantime_serde", default = "default_connect_timeout")]
    pub connect_timeout: Duration,
    /// Longest pause between reconnect attempts (backoff doubles from 100 ms up to this).
    #[serde(with = "humantime_serde", default = "default_max_backoff")]
    pub max_backoff: Duration,
}

fn default_heartbeat() -> Duration {
    Duration::from_secs(10)
}
fn default_connect_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_max_backoff() -> Duration {
    Duration::from_secs(5)
}

impl ConnectionConfig {
    /// A config for `url` with the defaults.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            heartbeat: default_heartbeat(),
            connect_timeout: default_connect_timeout(),
            max_backoff: default_max_backoff(),
        }
    }

    /// Checks the URL without connecting. The error never contains the URL (passwords).
    pub fn validate(&self) -> Result<AMQPUri> {
        let uri = AMQPUri::from_str(&self.url).map_err(|e| Error::InvalidUrl { reason: e })?;
        if self.url.starts_with("amqps://") && !cfg!(feature = "tls") {
            return Err(Error::InvalidUrl {
                reason: "amqps:// needs rabbitkit's `tls` feature".into(),
            });
        }
        Ok(uri)
    }

    /// The URL with its password replaced by `***`, for logs.
    pub fn redacted_url(&self) -> String {
        redact(&self.url)
    }

    fn url_with_options(&self) -> String {
        let sep = if self.url.contains('?') { '&' } else { '?' };
        let mut url = self.url.clone();
        if !url.contains("heartbeat=") {
            url.push(sep);
            url.push_str(&format!(
                "heartbeat={}",
                self.heartbeat.as_secs().clamp(1, 600)
            ));
        }
        if !url.contains("connection_timeout=") {
            url.push(if url.contains('?') { '&' } else { '?' });
            url.push_str(&format!(
                "connection_timeout={}",
                self.connect_timeout.as_millis()
            ));
        }
        url
    }
}

/// Replaces the password of an AMQP URL with `***`.
pub fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let rest = &url[scheme_end + 3..];
    let Some(at) = rest.find('@') else {
        return url.to_owned();
    };
    let userinfo = &rest[..at];
    match userinfo.find(':') {
        Some(colon) => format!(
            "{}{}:***{}",
            &url[..scheme_end + 3],
            &userinfo[..colon],
            &rest[at..]
        ),
        None => url.to_owned(),
    }
}

/// A live connection with its blocked state, as seen through the one events listener
/// (lapin shares events *between* listeners, so exactly one is kept and read).
#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) conn: Connection,
    pub(crate) generation: u64,
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

/// One named connection that reconnects on demand with capped exponential backoff.
#[derive(Debug)]
pub(crate) struct Connector {
    cfg: ConnectionConfig,
    name: String,
    slot: Mutex<Slot>,
}

#[derive(Debug, Default)]
struct Slot {
    current: Option<Arc<Conn>>,
    generation: u64,
    failures: u32,
}

impl Connector {
    pub(crate) fn new(cfg: ConnectionConfig, name: impl Into<String>) -> Result<Self> {
        cfg.validate()?;
        Ok(Self {
            cfg,
            name: name.into(),
            slot: Mutex::new(Slot::default()),
        })
    }

    /// The settings this connector connects with.
    pub(crate) fn config(&self) -> &ConnectionConfig {
        &self.cfg
    }

    /// The current connection if it is usable, else a new one; retries with backoff until
    /// `wait` has passed.
    pub(crate) async fn get(&self, wait: Duration) -> Result<Arc<Conn>> {
        let deadline = tokio::time::Instant::now() + wait;
        let mut slot = self.slot.lock().await;
        if let Some(c) = slot.current.as_ref().filter(|c| c.is_usable()) {
            return Ok(c.clone());
        }
        if let Some(old) = slot.current.take() {
            tracing::warn!(connection = %self.name, generation = old.generation, "connection lost; reconnecting");
        }
        loop {
            let attempt =
                tokio::time::timeout_at(deadline, self.connect_once(slot.generation + 1)).await;
            match attempt {
                Ok(Ok(conn)) => {
                    slot.generation += 1;
                    slot.failures = 0;
                    let conn = Arc::new(conn);
                    slot.current = Some(conn.clone());
                    tracing::info!(connection = %self.name, generation = slot.generation, url = %self.cfg.redacted_url(), "connected");
                    return Ok(conn);
                }
                Ok(Err(e)) => {
                    slot.failures = slot.failures.saturating_add(1);
                    let pause = backoff(slot.failures, self.cfg.max_backoff);
                    tracing::warn!(connection = %self.name, error = %e, retry_in = ?pause, "connect failed");
                    if tokio::time::Instant::now() + pause >= deadline {
                        return Err(e);
                    }
                    tokio::time::sleep(pause).await;
                }
                Err(_) => return Err(Error::NotConnected(wait)),
            }
        }
    }

    /// Closes the current connection (if any).
    pub(crate) async fn close(&self) {
        let mut slot = self.slot.lock().await;
        if let Some(c) = slot.current.take() {
            let _ = c.conn.close(200, "rabbitkit shutdown".into()).await;
        }
    }

    async fn connect_once(&self, generation: u64) -> Result<Conn> {
        let props = ConnectionProperties::default().with_connection_name(self.name.clone().into());
        let conn = Connection::connect(&self.cfg.url_with_options(), props)
            .await
            .map_err(|e| Error::Connection(Box::new(e)))?;
        let blocked = Arc::new(AtomicBool::new(false));
        let block_events = Arc::new(AtomicU64::new(0));
        let mut events = conn.events_listener();
        let (b, n, name) = (blocked.clone(), block_events.clone(), self.name.clone());
        tokio::spawn(async move {
            while let Some(ev) = events.next().await {
                match ev {
                    Event::ConnectionBlocked(reason) => {
                        b.store(true, Ordering::Release);
                        n.fetch_add(1, Ordering::AcqRel);
                        tracing::warn!(connection = %name, %reason, "connection blocked by the broker (resource alarm)");
                    }
                    Event::ConnectionUnblocked => {
                        b.store(false, Ordering::Release);
                        tracing::info!(connection = %name, "connection unblocked");
                    }
                    Event::Error(e) => {
                        tracing::warn!(connection = %name, error = %e, "connection error");
                    }
                    _ => {}
                }
            }
        });
        Ok(Conn {
            conn,
            generation,
            blocked,
            block_events,
        })
    }
}

/// Capped exponential backoff: 100 ms, 200 ms, 400 ms ... up to `max`.
pub(crate) fn backoff(failures: u32, max: Duration) -> Duration {
    Duration::from_millis(100)
        .saturating_mul(1u32 << failures.saturating_sub(1).min(16))
        .min(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact("amqp://app:s3cret@host:5672/%2f"),
            "amqp://app:***@host:5672/%2f"
        );
        assert_eq!(redact("amqp://host/vh"), "amqp://host/vh");
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
    fn backoff_is_capped() {
        let max = Duration::from_secs(5);
        assert_eq!(backoff(1, max), Duration::from_millis(100));
        assert_eq!(backoff(3, max), Duration::from_millis(400));
        assert_eq!(backoff(30, max), max);
    }

    #[test]
    fn options_are_appended_once() {
        let c = ConnectionConfig::new("amqp://h/%2f?heartbeat=3");
        let u = c.url_with_options();
        assert_eq!(u.matches("heartbeat=").count(), 1);
        assert!(u.contains("connection_timeout=10000"));
    }
}
