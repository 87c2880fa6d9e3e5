//! The confirmed publisher.
//!
//! Design, from measured lapin 4.12 behaviour (see `docs/ARCHITECTURE.md`):
//! - its **own connection**: a resource alarm blocks a publishing connection entirely
//!   (acks included), so consumers never share it;
//! - a pool of confirm-mode channels with **one publish in flight per channel**: with several
//!   mandatory publishes in flight on one channel lapin can attach a `basic.return` to the
//!   wrong confirm (~12 % measured), and concurrent `basic_publish` calls on one channel get
//!   confirms attributed to the wrong publish. One in flight per channel makes attribution
//!   exact; the pool size is the bounded unconfirmed window;
//! - every confirm is awaited individually (`wait_for_confirms` only waits for the last one);
//! - `Ack(Some(returned))` is [`PublishOutcome::Returned`], never success.

mod outcome;

pub use outcome::PublishOutcome;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use lapin::Confirmation;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Channel};
use serde::Deserialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use tokio::time::Instant;

use crate::connection::{Conn, ConnectionConfig, Connector};
use crate::envelope::{Envelope, Prepared};
use crate::error::{Error, Result};

/// Publisher settings.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct PublisherConfig {
    /// Unconfirmed publishes allowed at once (= confirm channels in the pool). When all are
    /// in flight, `publish` waits: backpressure reaches the caller, memory stays bounded.
    #[serde(default = "default_window")]
    pub max_in_flight: usize,
    /// How long a publish may wait for its confirm (write included) before it is
    /// `TimedOut`. Generous: durable confirms wait for fsync, quorum ones for a majority.
    #[serde(with = "humantime_serde", default = "default_confirm_timeout")]
    pub confirm_timeout: Duration,
    /// Largest body accepted, in bytes (RabbitMQ 4.x refuses over 16 MiB by default).
    #[serde(default = "default_max_body")]
    pub max_body: usize,
}

fn default_window() -> usize {
    64
}
fn default_confirm_timeout() -> Duration {
    Duration::from_secs(30)
}
fn default_max_body() -> usize {
    16 * 1024 * 1024
}

impl Default for PublisherConfig {
    fn default() -> Self {
        Self {
            max_in_flight: default_window(),
            confirm_timeout: default_confirm_timeout(),
            max_body: default_max_body(),
        }
    }
}

/// Properties must fit one content-header frame (frame_max is 128 KiB by default).
const MAX_PROPERTIES: usize = 120 * 1024;

/// Counters kept by a publisher.
#[derive(Debug, Default)]
struct Counters {
    sent: AtomicU64,
    confirmed: AtomicU64,
    returned: AtomicU64,
    nacked: AtomicU64,
    timed_out: AtomicU64,
    failed: AtomicU64,
    latency_micros: AtomicU64,
}

/// A snapshot of a publisher's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PublisherStats {
    /// Publishes written (or attempted) so far.
    pub sent: u64,
    /// Confirmed publishes.
    pub confirmed: u64,
    /// Returned (unroutable) publishes.
    pub returned: u64,
    /// Nacked publishes.
    pub nacked: u64,
    /// Publishes without a confirm in time.
    pub timed_out: u64,
    /// Publishes whose channel or connection failed.
    pub failed: u64,
    /// Sum of confirm latencies of confirmed publishes.
    pub confirm_latency_total: Duration,
}

/// A publisher with broker confirms, mandatory routing and a bounded unconfirmed window.
///
/// Cheap to clone; clones share the connection and the window.
#[derive(Debug, Clone)]
pub struct Publisher {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    connector: Connector,
    cfg: PublisherConfig,
    permits: Arc<Semaphore>,
    idle: std::sync::Mutex<Vec<(u64, Channel)>>,
    counters: Counters,
}

impl Publisher {
    /// A publisher for `connection`. Connects lazily, on the first publish; reconnects
    /// with capped backoff after a loss.
    pub fn new(connection: ConnectionConfig, cfg: PublisherConfig) -> Result<Self> {
        if cfg.max_in_flight == 0 {
            return Err(Error::Config(
                "publisher max-in-flight must be at least 1".into(),
            ));
        }
        Ok(Self {
            inner: Arc::new(Inner {
                connector: Connector::new(connection, "rabbitkit-publisher")?,
                permits: Arc::new(Semaphore::new(cfg.max_in_flight)),
                idle: std::sync::Mutex::new(Vec::new()),
                cfg,
                counters: Counters::default(),
            }),
        })
    }

    /// Connects now (instead of on the first publish), waiting up to the confirm timeout.
    pub async fn connect(&self) -> Result<()> {
        self.inner
            .connector
            .get(self.inner.cfg.confirm_timeout)
            .await
            .map(|_| ())
    }

    /// The settings.
    pub fn config(&self) -> &PublisherConfig {
        &self.inner.cfg
    }

    /// Publishes and waits for the broker's verdict.
    ///
    /// One `publish` at a time is slow (each confirm waits for the broker's fsync batch:
    /// hundreds per second with persistent messages). Publish from many tasks, use
    /// [`Publisher::send`], or [`Publisher::publish_many`] to keep the window full.
    ///
    /// `Err` means the envelope was refused before anything was sent (bad name, oversized
    /// body, bad header): it was certainly not published.
    pub async fn publish(&self, envelope: Envelope) -> Result<PublishOutcome> {
        Ok(self.send(envelope).await?.await)
    }

    /// Writes the publish and returns once it is on the wire (waiting for a free slot in
    /// the window first); the returned [`PendingConfirm`] resolves to the outcome.
    pub async fn send(&self, envelope: Envelope) -> Result<PendingConfirm> {
        let prepared = envelope.prepare(self.inner.cfg.max_body, MAX_PROPERTIES)?;
        let permit = self
            .inner
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| Error::Config("publisher closed".into()))?;
        self.inner.counters.sent.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let deadline = started + self.inner.cfg.confirm_timeout;
        let (tx, rx) = oneshot::channel();
        match self.write(prepared, deadline).await {
            Ok((conn, gen_channel, confirm)) => {
                let inner = self.inner.clone();
                tokio::spawn(async move {
                    let outcome = inner
                        .await_confirm(conn, gen_channel, confirm, started, deadline, permit)
                        .await;
                    let _ = tx.send(outcome);
                });
            }
            Err(outcome) => {
                drop(permit);
                self.inner.count(&outcome);
                let _ = tx.send(outcome);
            }
        }
        Ok(PendingConfirm { rx })
    }

    /// Publishes every envelope with the window kept full; yields `(index, result)` in
    /// completion order.
    pub fn publish_many<I>(
        &self,
        envelopes: I,
    ) -> impl Stream<Item = (usize, Result<PublishOutcome>)> + Send + 'static
    where
        I: IntoIterator<Item = Envelope>,
        I::IntoIter: Send + 'static,
    {
        let this = self.clone();
        let window = self.inner.cfg.max_in_flight;
        futures_util::stream::iter(envelopes.into_iter().enumerate())
            .map(move |(i, env)| {
                let this = this.clone();
                async move { (i, this.publish(env).await) }
            })
            .buffer_unordered(window)
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> PublisherStats {
        let c = &self.inner.counters;
        PublisherStats {
            sent: c.sent.load(Ordering::Relaxed),
            confirmed: c.confirmed.load(Ordering::Relaxed),
            returned: c.returned.load(Ordering::Relaxed),
            nacked: c.nacked.load(Ordering::Relaxed),
            timed_out: c.timed_out.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
            confirm_latency_total: Duration::from_micros(c.latency_micros.load(Ordering::Relaxed)),
        }
    }

    /// Publishes in flight right now.
    pub fn in_flight(&self) -> usize {
        self.inner.cfg.max_in_flight - self.inner.permits.available_permits()
    }

    /// Waits for in-flight publishes (up to `deadline`), then closes the connection.
    pub async fn close(&self, deadline: Duration) {
        let all = u32::try_from(self.inner.cfg.max_in_flight).unwrap_or(u32::MAX);
        let _ = tokio::time::timeout(deadline, self.inner.permits.acquire_many(all)).await;
        self.inner
            .idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        self.inner.connector.close().await;
    }

    async fn write(
        &self,
        p: Prepared,
        deadline: Instant,
    ) -> std::result::Result<(Arc<Conn>, (u64, Channel), lapin::PublisherConfirm), PublishOutcome>
    {
        let wait = deadline.saturating_duration_since(Instant::now());
        let conn = self
            .inner
            .connector
            .get(wait)
            .await
            .map_err(PublishOutcome::Failed)?;
        let blocks_before = conn.block_count();
        let timed_out = |conn: &Conn| PublishOutcome::TimedOut {
            blocked: conn.is_blocked() || conn.block_count() != blocks_before,
        };
        let channel = match tokio::time::timeout_at(deadline, self.inner.channel(&conn)).await {
            Ok(Ok(ch)) => ch,
            Ok(Err(e)) => return Err(PublishOutcome::Failed(e)),
            Err(_) => return Err(timed_out(&conn)),
        };
        let opts = BasicPublishOptions {
            mandatory: p.mandatory,
            immediate: false,
        };
        let write = channel
            .1
            .basic_publish(p.exchange, p.routing_key, opts, &p.body, p.properties);
        match tokio::time::timeout_at(deadline, write).await {
            Ok(Ok(confirm)) => Ok((conn, channel, confirm)),
            Ok(Err(e)) => Err(PublishOutcome::Failed(Error::amqp(e))),
            // The channel is dropped: a late confirm or return must never reach the next publish.
            Err(_) => Err(timed_out(&conn)),
        }
    }
}

impl Inner {
    async fn channel(&self, conn: &Conn) -> Result<(u64, Channel)> {
        {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            while let Some((generation, ch)) = idle.pop() {
                if generation == conn.generation && ch.status().connected() {
                    return Ok((generation, ch));
                }
            }
        }
        let ch = conn.conn.create_channel().await.map_err(Error::amqp)?;
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(Error::amqp)?;
        Ok((conn.generation, ch))
    }

    async fn await_confirm(
        &self,
        conn: Arc<Conn>,
        channel: (u64, Channel),
        confirm: lapin::PublisherConfirm,
        started: Instant,
        deadline: Instant,
        permit: OwnedSemaphorePermit,
    ) -> PublishOutcome {
        let blocks_before = conn.block_count();
        let outcome = match tokio::time::timeout_at(deadline, confirm).await {
            Ok(Ok(Confirmation::Ack(None))) => PublishOutcome::Confirmed {
                latency: started.elapsed(),
            },
            Ok(Ok(Confirmation::Ack(Some(ret)) | Confirmation::Nack(Some(ret))))
                if ret.reply_code != 0 =>
            {
                PublishOutcome::Returned {
                    reply_code: ret.reply_code,
                    reply_text: ret.reply_text.to_string(),
                }
            }
            Ok(Ok(Confirmation::Ack(Some(_)) | Confirmation::Nack(_))) => PublishOutcome::Nacked,
            Ok(Ok(Confirmation::NotRequested)) => {
                PublishOutcome::Failed(Error::Amqp("channel is not in confirm mode".into()))
            }
            Ok(Err(e)) => PublishOutcome::Failed(Error::amqp(e)),
            Err(_) => PublishOutcome::TimedOut {
                blocked: conn.is_blocked() || conn.block_count() != blocks_before,
            },
        };
        // Only a channel whose one publish got a definite verdict goes back to the pool.
        let definite = matches!(
            outcome,
            PublishOutcome::Confirmed { .. }
                | PublishOutcome::Returned { .. }
                | PublishOutcome::Nacked
        );
        if definite && channel.1.status().connected() {
            self.idle
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(channel);
        }
        drop(permit);
        self.count(&outcome);
        outcome
    }

    fn count(&self, outcome: &PublishOutcome) {
        let c = &self.counters;
        match outcome {
            PublishOutcome::Confirmed { latency } => {
                c.confirmed.fetch_add(1, Ordering::Relaxed);
                c.latency_micros.fetch_add(
                    u64::try_from(latency.as_micros()).unwrap_or(u64::MAX),
                    Ordering::Relaxed,
                );
                tracing::trace!(latency_us = latency.as_micros() as u64, "publish confirmed");
            }
            PublishOutcome::Returned {
                reply_code,
                reply_text,
            } => {
                c.returned.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(reply_code, %reply_text, "publish returned");
            }
            PublishOutcome::Nacked => {
                c.nacked.fetch_add(1, Ordering::Relaxed);
                tracing::debug!("publish nacked");
            }
            PublishOutcome::TimedOut { blocked } => {
                c.timed_out.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(blocked, "publish confirm timed out");
            }
            PublishOutcome::Failed(e) => {
                c.failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "publish failed; outcome unknown");
            }
        }
    }
}

/// A publish on the wire, waiting for its confirm. Dropping it does not cancel anything:
/// the confirm is still awaited and counted.
#[derive(Debug)]
#[must_use = "the outcome says whether the broker took the message"]
pub struct PendingConfirm {
    rx: oneshot::Receiver<PublishOutcome>,
}

impl Future for PendingConfirm {
    type Output = PublishOutcome;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<PublishOutcome> {
        Pin::new(&mut self.rx).poll(cx).map(|r| {
            r.unwrap_or_else(|_| {
                PublishOutcome::Failed(Error::Amqp("confirm task ended (runtime shut down)".into()))
            })
        })
    }
}

/// Unused helper kept private: the properties type publishers accept.
#[allow(dead_code)]
type Props = BasicProperties;
