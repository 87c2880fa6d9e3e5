//! The confirmed publisher.
//!
//! Design, from measured lapin 4.12 behaviour (see `docs/ARCHITECTURE.md`):
//! - its **own connection**: a resource alarm blocks a publishing connection entirely
//!   (acks included), so consumers never share it;
//! - a few confirm-mode channels ("lanes", [`PublisherConfig::channels`]), each owned by one
//!   task that is the channel's only publisher (`basic_publish` calls racing from several
//!   threads on one channel get confirms attributed to the wrong publish); it hands every
//!   waiting publish to lapin in order without waiting for the previous one to be written,
//!   so lapin writes them in one go, and keeps many unconfirmed;
//! - returns are attributed by message id, not by which confirm lapin attached them to (with
//!   several mandatory publishes in flight lapin hands a `basic.return` to whichever confirm
//!   it resolves next); see `lane.rs` for why that is exact;
//! - the unconfirmed window is a semaphore shared by all lanes: when it is full, `send`
//!   waits, so memory stays bounded and backpressure reaches the caller;
//! - every confirm is awaited individually (`wait_for_confirms` only waits for the last one);
//! - `Ack` with a return is [`PublishOutcome::Returned`], never success.

mod lane;
mod many;
mod outcome;
mod reply;

pub use outcome::PublishOutcome;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::Stream;
use serde::Deserialize;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::time::Instant;

use crate::connection::{ConnectionConfig, Connector};
use crate::envelope::Envelope;
use crate::error::{Error, Result};

/// Publisher settings.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct PublisherConfig {
    /// Unconfirmed publishes allowed at once, over all channels. When all are in flight,
    /// `publish` waits: backpressure reaches the caller, memory stays bounded (at most this
    /// many envelopes, each at most `max_body`, are held).
    #[serde(default = "default_window")]
    pub max_in_flight: usize,
    /// Confirm channels the publishes are spread over, round-robin. Each is written by one
    /// task; with `1`, publishes go out in the order they were sent.
    #[serde(default = "default_channels")]
    pub channels: usize,
    /// How long a publish may wait for its confirm (write included) before it is
    /// `TimedOut`. Generous: durable confirms wait for fsync, quorum ones for a majority.
    #[serde(with = "humantime_serde", default = "default_confirm_timeout")]
    pub confirm_timeout: Duration,
    /// Largest body accepted, in bytes (RabbitMQ 4.x refuses over 16 MiB by default).
    #[serde(default = "default_max_body")]
    pub max_body: usize,
}

fn default_window() -> usize {
    256
}
fn default_channels() -> usize {
    1
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
            channels: default_channels(),
            confirm_timeout: default_confirm_timeout(),
            max_body: default_max_body(),
        }
    }
}

/// The frame size assumed before the publisher's first connection when no URL asks for a
/// smaller one (`?frame_max=`): RabbitMQ's default `frame_max`, 128 KiB. Once connected, the
/// value negotiated with the broker is used instead (a broker configured lower is learned
/// on the first connection, and every publish is checked again against the frame of the
/// connection it is written on, see `lane.rs`). The AMQP minimum, 4 KiB, would refuse
/// every message with more than about 4 KiB of headers until the first connection; a
/// worker connects its publisher before it consumes, so settlement copies are always
/// checked against the negotiated value.
const DEFAULT_FRAME_MAX: u32 = 128 * 1024;

/// The bytes of a content-header frame around its property list: the frame header
/// (type 1, channel 2, size 4) and end octet (1), then class id (2), weight (2) and body
/// size (8). The properties (flags included) must fit `frame_max` minus these: the
/// content header is one frame, it cannot be split like a body (the broker closes the
/// connection with `FRAME_ERROR` on a larger frame, failing every publish in flight on it).
const HEADER_FRAME_OVERHEAD: usize = 8 + 12;

/// The property budget of a connection whose negotiated `frame_max` is `frame_max`, with
/// room kept for the [`PUBLISH_TOKEN`](crate::headers::PUBLISH_TOKEN) a lane may add at
/// write time.
fn properties_budget(frame_max: u32) -> usize {
    usize::try_from(frame_max)
        .unwrap_or(usize::MAX)
        .saturating_sub(HEADER_FRAME_OVERHEAD + lane::TOKEN_ROOM)
}

/// Counters kept by a publisher.
#[derive(Debug)]
struct Counters {
    /// `rabbitkit_confirm_latency_seconds`, taken from the recorder installed when the
    /// publisher was built.
    latency: metrics::Histogram,
    sent: AtomicU64,
    confirmed: AtomicU64,
    returned: AtomicU64,
    nacked: AtomicU64,
    timed_out: AtomicU64,
    failed: AtomicU64,
    latency_micros: AtomicU64,
    /// Publishes handed to a channel whose outcome is not reported yet (kept by the lanes).
    unconfirmed: AtomicU64,
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
    /// Publishes written to a channel (or being written) whose outcome is not known yet,
    /// counted by the channels' tasks; never above [`PublisherConfig::max_in_flight`].
    /// [`Publisher::in_flight`] also counts publishes waiting to be written.
    pub unconfirmed: u64,
}

/// A publisher with broker confirms, mandatory routing and a bounded unconfirmed window.
///
/// Cheap to clone; clones share the connection, the channels and the window.
#[derive(Debug, Clone)]
pub struct Publisher {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    shared: Arc<Shared>,
    permits: Arc<Semaphore>,
    /// One sender per lane; a lane's task starts on the first publish it gets (a publisher
    /// can be built outside a runtime) and again if its runtime went away.
    lanes: Box<[std::sync::Mutex<Option<mpsc::UnboundedSender<reply::LaneMsg>>>]>,
    next_lane: AtomicUsize,
}

/// What the lanes share with the handle. Lanes do not hold [`Inner`]: when the last
/// `Publisher` clone is dropped, the lanes see their senders close, finish what they hold
/// and stop.
#[derive(Debug)]
struct Shared {
    connector: Connector,
    cfg: PublisherConfig,
    counters: Counters,
    /// Set by [`Publisher::close`]: later publishes are refused, not sent on a new
    /// connection.
    closed: std::sync::atomic::AtomicBool,
    /// The `frame_max` negotiated by the latest connection (0: none yet), which every
    /// envelope is measured against before it is sent.
    frame_max: AtomicU32,
    /// The frame size assumed before the first connection: the smallest `?frame_max=` of
    /// the URLs (the client asks for it, so the broker cannot negotiate more), else
    /// [`DEFAULT_FRAME_MAX`].
    frame_max_before_connect: u32,
    /// Keeps the Prometheus histograms folded while the lanes record latencies.
    #[cfg(feature = "http")]
    _upkeep: Option<crate::observe::UpkeepGuard>,
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
        if cfg.max_in_flight > Semaphore::MAX_PERMITS {
            return Err(Error::Config(format!(
                "publisher max-in-flight must be at most {}",
                Semaphore::MAX_PERMITS
            )));
        }
        // A deadline is `now + confirm-timeout`: refuse what would overflow the clock.
        if cfg.confirm_timeout > Duration::from_secs(365 * 24 * 3600) {
            return Err(Error::Config(
                "publisher confirm-timeout must be at most a year".into(),
            ));
        }
        if cfg.channels == 0 {
            return Err(Error::Config(
                "publisher channels must be at least 1".into(),
            ));
        }
        if cfg.confirm_timeout.is_zero() {
            return Err(Error::Config(
                "publisher confirm-timeout must be above 0 (every publish would time out)".into(),
            ));
        }
        if cfg.max_body == 0 {
            return Err(Error::Config(
                "publisher max-body must be at least 1".into(),
            ));
        }
        let lanes = (0..cfg.channels)
            .map(|_| std::sync::Mutex::new(None))
            .collect();
        Ok(Self {
            inner: Arc::new(Inner {
                shared: Arc::new(Shared {
                    connector: Connector::new(connection.clone(), "rabbitkit-publisher")?,
                    counters: Counters {
                        latency: metrics::histogram!(crate::stats::CONFIRM_LATENCY),
                        sent: AtomicU64::new(0),
                        confirmed: AtomicU64::new(0),
                        returned: AtomicU64::new(0),
                        nacked: AtomicU64::new(0),
                        timed_out: AtomicU64::new(0),
                        failed: AtomicU64::new(0),
                        latency_micros: AtomicU64::new(0),
                        unconfirmed: AtomicU64::new(0),
                    },
                    cfg: cfg.clone(),
                    closed: std::sync::atomic::AtomicBool::new(false),
                    frame_max: AtomicU32::new(0),
                    frame_max_before_connect: requested_frame_max(&connection),
                    #[cfg(feature = "http")]
                    _upkeep: crate::observe::upkeep_guard(),
                }),
                permits: Arc::new(Semaphore::new(cfg.max_in_flight)),
                lanes,
                next_lane: AtomicUsize::new(0),
            }),
        })
    }

    /// Connects now (instead of on the first publish), waiting up to the connection's
    /// `connect_timeout` (every node is tried at least once).
    pub async fn connect(&self) -> Result<()> {
        let shared = &self.inner.shared;
        let conn = shared
            .connector
            .get(shared.connector.config().connect_timeout)
            .await?;
        shared.learn(&conn);
        Ok(())
    }

    /// The settings.
    pub fn config(&self) -> &PublisherConfig {
        &self.inner.shared.cfg
    }

    /// Whether `envelope` passes the checks [`Publisher::send`] makes before sending
    /// (names, body size, headers, properties budget): `Err` is the error `send` would give.
    ///
    /// The envelope is measured as it will be sent: with the message id `send` generates
    /// when it has none, the trace headers it writes (feature `otel`: `traceparent`, and
    /// `tracestate` when the current trace carries one), and room for the publish token a
    /// confirm channel may add. The budget is one content-header frame of the `frame_max`
    /// negotiated by the publisher's latest connection; before the first one, the smallest
    /// `?frame_max=` of the URLs, else RabbitMQ's default of 128 KiB.
    pub fn check(&self, envelope: &Envelope) -> Result<()> {
        let budget = self.inner.shared.properties_budget();
        #[cfg(feature = "otel")]
        let budget = budget.saturating_sub(crate::observe::otel::room(envelope));
        envelope.check(self.inner.shared.cfg.max_body, budget)
    }

    /// The largest encoded size, in bytes, the properties (headers included) of a publish
    /// may have now: one content-header frame of the negotiated `frame_max`, less the
    /// frame's own fields and room for the publish token (see [`Publisher::check`]).
    pub fn properties_budget(&self) -> usize {
        self.inner.shared.properties_budget()
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

    /// Takes a slot in the window (waiting while the window is full), hands the publish to
    /// one of the confirm channels and returns; the [`PendingConfirm`] resolves to the
    /// outcome. With [`PublisherConfig::channels`] = 1, publishes sent one after another go
    /// out in that order.
    ///
    /// `Err` means the envelope was refused before anything was sent ([`Error::Closed`]
    /// after [`Publisher::close`]).
    pub async fn send(&self, envelope: Envelope) -> Result<PendingConfirm> {
        // The send span's context replaces the envelope's trace headers (a retry copy
        // then carries the context of the attempt that failed).
        #[cfg(feature = "otel")]
        let (envelope, span) = {
            let span = crate::observe::otel::send_span(&envelope);
            (crate::observe::otel::inject(&span, envelope), span)
        };
        let shared = &self.inner.shared;
        let closed = || Error::Closed { what: "publisher" };
        if shared.closed.load(Ordering::Acquire) {
            return Err(closed());
        }
        let prepared = envelope.prepare(shared.cfg.max_body, shared.properties_budget())?;
        let permit = self
            .inner
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| closed())?;
        // Closed while this waited for a slot.
        if shared.closed.load(Ordering::Acquire) {
            return Err(closed());
        }
        shared.counters.sent.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let (reply, rx) = oneshot::channel();
        self.inner.dispatch(reply::Job {
            prepared,
            permit,
            reply: reply::Reply::Task(reply),
            started,
            deadline: started + shared.cfg.confirm_timeout,
            blocks_before: None,
        });
        Ok(PendingConfirm {
            rx,
            #[cfg(feature = "otel")]
            span,
        })
    }

    /// Publishes every envelope with the window kept full; yields `(index, result)` in
    /// completion order. `Err` is an envelope refused before anything was sent, as
    /// [`Publisher::send`] refuses it.
    ///
    /// Each poll takes every free window slot, hands those publishes to a channel's task in
    /// one message and collects the outcomes the tasks file, one wake-up per channel pass:
    /// cheaper than a `send` per envelope, with the same channels, attribution and
    /// deadlines. With [`PublisherConfig::channels`] = 1 the batch goes out in its order.
    /// Dropping the stream publishes nothing more; what it handed over is still made,
    /// confirmed and counted.
    pub fn publish_many<I>(
        &self,
        envelopes: I,
    ) -> impl Stream<Item = (usize, Result<PublishOutcome>)> + Send + 'static
    where
        I: IntoIterator<Item = Envelope>,
        I::IntoIter: Send + 'static,
    {
        many::Many::new(self.inner.clone(), Box::new(envelopes.into_iter()))
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> PublisherStats {
        let c = &self.inner.shared.counters;
        PublisherStats {
            sent: c.sent.load(Ordering::Relaxed),
            confirmed: c.confirmed.load(Ordering::Relaxed),
            returned: c.returned.load(Ordering::Relaxed),
            nacked: c.nacked.load(Ordering::Relaxed),
            timed_out: c.timed_out.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
            confirm_latency_total: Duration::from_micros(c.latency_micros.load(Ordering::Relaxed)),
            unconfirmed: c.unconfirmed.load(Ordering::Relaxed),
        }
    }

    /// Publishes in flight right now: window slots taken, by publishes waiting to be
    /// written or awaiting their confirm ([`PublisherStats::unconfirmed`] counts only the
    /// latter).
    pub fn in_flight(&self) -> usize {
        self.inner.shared.cfg.max_in_flight - self.inner.permits.available_permits()
    }

    /// Refuses new publishes from now on ([`Error::Closed`], on every clone), waits for
    /// in-flight publishes (up to `deadline`), then closes the connection for good.
    pub async fn close(&self, deadline: Duration) {
        self.inner.shared.closed.store(true, Ordering::Release);
        let all = u32::try_from(self.inner.shared.cfg.max_in_flight).unwrap_or(u32::MAX);
        let _ = tokio::time::timeout(deadline, self.inner.permits.acquire_many(all)).await;
        self.inner.shared.connector.close().await;
    }
}

impl Inner {
    /// Hands `job` to the next lane, starting the lane's task if it is not running.
    fn dispatch(&self, job: reply::Job) {
        self.dispatch_msg(reply::LaneMsg::One(job));
    }

    /// Hands a `publish_many` pass to the next lane in one message.
    fn dispatch_many(&self, jobs: Vec<reply::Job>) {
        self.dispatch_msg(reply::LaneMsg::Many(jobs));
    }

    fn dispatch_msg(&self, mut msg: reply::LaneMsg) {
        let i = self.next_lane.fetch_add(1, Ordering::Relaxed) % self.lanes.len();
        let mut slot = self.lanes[i].lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = slot.as_ref() {
            match tx.send(msg) {
                Ok(()) => return,
                Err(mpsc::error::SendError(back)) => msg = back,
            }
        }
        let handle = match tokio::runtime::Handle::try_current() {
            Ok(handle) => handle,
            Err(_) => {
                let jobs = match msg {
                    reply::LaneMsg::One(job) => vec![job],
                    reply::LaneMsg::Many(jobs) => jobs,
                };
                for job in jobs {
                    let outcome = PublishOutcome::Failed(Error::Config(
                        "publish outside a tokio runtime".into(),
                    ));
                    self.shared.count(&outcome);
                    job.reply.deliver(outcome);
                }
                return;
            }
        };
        let (tx, rx) = mpsc::unbounded_channel();
        handle.spawn(lane::run(self.shared.clone(), rx));
        // The receiver is alive: it was just handed to the lane.
        let _ = tx.send(msg);
        *slot = Some(tx);
    }
}

/// The smallest `?frame_max=` the URLs of `connection` ask for (0 and unparsable ones
/// ignored), else [`DEFAULT_FRAME_MAX`].
fn requested_frame_max(connection: &ConnectionConfig) -> u32 {
    connection
        .urls
        .iter()
        .filter_map(|url| url.parse::<lapin::uri::AMQPUri>().ok()?.query.frame_max)
        .filter(|f| *f > 0)
        .min()
        .unwrap_or(DEFAULT_FRAME_MAX)
}

impl Shared {
    /// Remembers the `frame_max` negotiated by `conn`.
    fn learn(&self, conn: &crate::connection::Conn) {
        self.frame_max
            .store(conn.conn.configuration().frame_max(), Ordering::Relaxed);
    }

    /// The properties budget of the latest connection, or the one assumed before any.
    fn properties_budget(&self) -> usize {
        match self.frame_max.load(Ordering::Relaxed) {
            0 => properties_budget(self.frame_max_before_connect),
            negotiated => properties_budget(negotiated),
        }
    }

    fn count(&self, outcome: &PublishOutcome) {
        let c = &self.counters;
        match outcome {
            PublishOutcome::Confirmed { latency } => {
                c.confirmed.fetch_add(1, Ordering::Relaxed);
                c.latency.record(latency.as_secs_f64());
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

/// A publish handed to the publisher, waiting for its outcome. Dropping it does not cancel
/// anything: the publish is still made, its confirm awaited and counted.
#[derive(Debug)]
#[must_use = "the outcome says whether the broker took the message"]
pub struct PendingConfirm {
    rx: oneshot::Receiver<PublishOutcome>,
    /// The publish's `send` span, closed with this future.
    #[cfg(feature = "otel")]
    span: tracing::Span,
}

impl Future for PendingConfirm {
    type Output = PublishOutcome;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<PublishOutcome> {
        let outcome = Pin::new(&mut self.rx).poll(cx).map(|r| {
            r.unwrap_or_else(|_| {
                PublishOutcome::Failed(Error::Amqp(
                    "publisher task ended (runtime shut down)".into(),
                ))
            })
        });
        #[cfg(feature = "otel")]
        if let Poll::Ready(o) = &outcome {
            crate::observe::otel::sent(&self.span, o);
        }
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_publisher_that_would_time_out_or_refuse_every_copy_is_refused() {
        let conn = || ConnectionConfig::new("amqp://guest:guest@127.0.0.1:5672/%2f");
        let zero_timeout = PublisherConfig {
            confirm_timeout: Duration::ZERO,
            ..Default::default()
        };
        assert!(matches!(
            Publisher::new(conn(), zero_timeout),
            Err(Error::Config(_))
        ));
        let zero_body = PublisherConfig {
            max_body: 0,
            ..Default::default()
        };
        assert!(matches!(
            Publisher::new(conn(), zero_body),
            Err(Error::Config(_))
        ));
    }

    /// A copy with `len` bytes in one header and properties of exactly `size` estimated
    /// bytes (a message id set, as on every copy rabbitkit makes).
    fn copy_of_size(size: usize) -> Envelope {
        let with = |len: usize| {
            let mut t = lapin::types::FieldTable::default();
            t.insert(
                "evidence".into(),
                lapin::types::AMQPValue::LongString("e".repeat(len).into()),
            );
            Envelope::new("", "orders.retry.5s", "body").properties(
                lapin::BasicProperties::default()
                    .with_message_id("m-1".into())
                    .with_headers(t),
            )
        };
        let base = crate::envelope::properties_size(with(0).basic_properties());
        let e = with(size - base);
        assert_eq!(crate::envelope::properties_size(e.basic_properties()), size);
        e
    }

    fn publisher(url: &str) -> Publisher {
        Publisher::new(ConnectionConfig::new(url), PublisherConfig::default())
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn the_size_check_uses_the_frame_size_asked_for_not_a_fixed_budget() {
        // Before the first connection, a URL that asks for 8 KiB frames is the budget: the
        // broker cannot negotiate more. The old check let 120 KiB through, and such a copy
        // then closed the publisher's connection on every attempt.
        let p = publisher("amqp://guest:guest@127.0.0.1:5672/%2f?frame_max=8192");
        let fits = 8192 - HEADER_FRAME_OVERHEAD - lane::TOKEN_ROOM;
        assert_eq!(p.properties_budget(), fits);
        assert!(matches!(
            p.check(&copy_of_size(10 * 1024)),
            Err(Error::InvalidHeader { .. })
        ));
        #[cfg(not(feature = "otel"))]
        assert!(p.check(&copy_of_size(fits)).is_ok());
        // Without a frame size asked for: RabbitMQ's default.
        let p = publisher("amqp://guest:guest@127.0.0.1:5672/%2f");
        assert_eq!(
            p.properties_budget(),
            128 * 1024 - HEADER_FRAME_OVERHEAD - lane::TOKEN_ROOM
        );
    }

    #[test]
    fn a_copy_that_fits_the_frame_only_without_the_publish_token_is_refused() {
        // It would fit the content-header frame as it is, but not once the confirm channel
        // adds its publish token (when the id is already in flight, as a retry copy's is).
        let p = publisher("amqp://guest:guest@127.0.0.1:5672/%2f?frame_max=8192");
        let frame = 8192 - HEADER_FRAME_OVERHEAD;
        let copy = copy_of_size(frame - 10);
        assert!(matches!(p.check(&copy), Err(Error::InvalidHeader { .. })));
        // `send` refuses it alike, before anything is sent.
        assert!(matches!(
            copy.prepare(p.config().max_body, p.inner.shared.properties_budget()),
            Err(Error::InvalidHeader { .. })
        ));
    }

    #[cfg(feature = "otel")]
    #[test]
    fn a_copy_that_fits_only_without_the_trace_headers_is_refused() {
        let p = publisher("amqp://guest:guest@127.0.0.1:5672/%2f?frame_max=8192");
        let budget = p.properties_budget();
        // Fits the budget as it is; `send` adds a 55-byte `traceparent` before preparing.
        let copy = copy_of_size(budget - 20);
        assert!(matches!(p.check(&copy), Err(Error::InvalidHeader { .. })));
        let room = crate::observe::otel::room(&copy);
        assert!(room >= 1 + "traceparent".len() + 1 + 4 + 55, "{room}");
        assert!(p.check(&copy_of_size(budget - room)).is_ok());
        // A copy that already carries a `traceparent` only needs room for the difference.
        let carried = copy_of_size(budget - 200).header(
            "traceparent",
            lapin::types::LongString::from(
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ),
        );
        assert_eq!(crate::observe::otel::room(&carried), 0);
    }
}
