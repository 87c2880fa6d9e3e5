//! The worker: connections, consumers, the per-delivery pipeline, shutdown.

mod check;
mod consume;
mod process;

pub use crate::config::{check, from_config};

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::connection::{ConnectionConfig, Connector};
use crate::delivery::Extensions;
use crate::error::{Error, Result};
use crate::publisher::{Publisher, PublisherConfig};
use crate::stats::{Counters, Labels, SubscriberStats};
use crate::subscriber::{IntoSubscriber, Subscriber};

/// Runs subscribers. A consuming connection and a separate publishing connection (a
/// resource alarm blocks a publishing connection, acks included).
///
/// ```no_run
/// # use rabbitkit_core::{worker::Worker, ConnectionConfig, subscriber::Subscriber};
/// # async fn run() -> rabbitkit_core::Result<()> {
/// async fn hello(body: rabbitkit_core::extract::Body) -> Result<(), std::io::Error> {
///     println!("{} bytes", body.0.len());
///     Ok(())
/// }
/// Worker::new(ConnectionConfig::new("amqp://guest:guest@127.0.0.1:5672/%2f"))
///     .subscribe(Subscriber::new("hello", hello))
///     .run_until(tokio::time::sleep(std::time::Duration::from_secs(60)))
///     .await?;
/// # Ok(()) }
/// ```
#[must_use]
#[derive(Debug)]
pub struct Worker {
    pub(crate) connection: ConnectionConfig,
    pub(crate) publisher: PublisherConfig,
    pub(crate) subscribers: Vec<Subscriber>,
    pub(crate) shutdown_deadline: Duration,
    extensions: Extensions,
    #[cfg(feature = "http")]
    pub(crate) http: Option<std::net::SocketAddr>,
    pub(crate) parking_depth: Option<Duration>,
    trace_context: crate::observe::TraceContext,
    header_trust: Option<crate::trust::HeaderTrust>,
}

impl Worker {
    /// A worker for the broker at `connection`.
    pub fn new(connection: ConnectionConfig) -> Self {
        Self {
            connection,
            publisher: PublisherConfig::default(),
            subscribers: Vec::new(),
            shutdown_deadline: Duration::from_secs(30),
            extensions: Extensions::default(),
            #[cfg(feature = "http")]
            http: None,
            parking_depth: None,
            trace_context: crate::observe::TraceContext::default(),
            header_trust: None,
        }
    }

    /// The Postgres inbox of this worker's
    /// [`AckPolicy::Transactional`](crate::AckPolicy::Transactional) subscribers (feature
    /// `postgres`). Stored as worker state, so the [`Tx`](crate::inbox::Tx) extractor's
    /// requirement is checked at start.
    #[cfg(feature = "postgres")]
    pub fn postgres(self, inbox: crate::inbox::Inbox) -> Self {
        self.state(inbox)
    }

    /// How rabbitkit's own attempt and route headers are signed and checked
    /// ([`HeaderTrust`](crate::trust::HeaderTrust)). Without this call the worker reads
    /// [`HeaderTrust::from_env`](crate::trust::HeaderTrust::from_env) (`RABBITKIT_HEADER_KEY`,
    /// `RABBITKIT_HEADER_KEY_PREVIOUS`, `RABBITKIT_HEADER_ACCEPT_UNSIGNED_FOR`), refuses to
    /// start when a key is shorter than 16 bytes or the window is not a duration, and
    /// without a key warns at start: then own headers are believed on copies that `x-death`
    /// says left one of the queue's delay tiers and on replays, which a producer able to
    /// publish into a tier, to set `x-death` (RabbitMQ 3.10-3.13) or to write those headers
    /// can still forge.
    pub fn header_trust(mut self, trust: crate::trust::HeaderTrust) -> Self {
        self.header_trust = Some(trust);
        self
    }

    /// Polls the depth of every subscriber's parking queue each `every` (a passive declare
    /// on the consuming connection) into the `rabbitkit_parking_depth` gauge. Off by
    /// default; at least 1 s (the broker answers each poll).
    pub fn parking_depth_interval(mut self, every: Duration) -> Self {
        self.parking_depth = Some(every);
        self
    }

    /// How each `process` span relates to the producer's trace context: a link (the
    /// default, per the OpenTelemetry messaging conventions) or a parent. Read by the
    /// `otel` feature's spans.
    pub fn trace_context(mut self, how: crate::observe::TraceContext) -> Self {
        self.trace_context = how;
        self
    }

    /// Adds a subscriber.
    pub fn subscribe(mut self, s: impl IntoSubscriber) -> Self {
        self.subscribers.push(s.into_subscriber());
        self
    }

    /// Settings of the publisher used for retry and parking copies.
    pub fn publisher_config(mut self, cfg: PublisherConfig) -> Self {
        self.publisher = cfg;
        self
    }

    /// How long in-flight handlers may run after shutdown starts; stragglers are requeued.
    /// `Duration::MAX` waits for them however long they take.
    pub fn shutdown_deadline(mut self, d: Duration) -> Self {
        self.shutdown_deadline = d;
        self
    }

    /// Serves `GET /metrics` (Prometheus), `/healthz` and `/readyz` on `addr` (port 0: any
    /// free port, see [`WorkerHandle::http_addr`]). Installs the Prometheus recorder as the
    /// process's global `metrics` recorder, unless one is installed already. See
    /// [`observe`](crate::observe).
    #[cfg(feature = "http")]
    pub fn http(mut self, addr: std::net::SocketAddr) -> Self {
        self.http = Some(addr);
        self
    }

    /// State shared by all subscribers ([`State`](crate::extract::State) extractor).
    pub fn state<T: Clone + Send + Sync + 'static>(mut self, value: T) -> Self {
        self.extensions.insert(value);
        self
    }

    /// Starts and runs until SIGINT or SIGTERM ([`shutdown_signal`](crate::shutdown_signal)),
    /// then shuts down gracefully: what systemd and Kubernetes expect.
    pub async fn run_until_signal(self) -> Result<WorkerReport> {
        self.run_until(crate::signal::shutdown_signal()).await
    }

    /// Starts and runs until `signal` completes, then shuts down gracefully.
    pub async fn run_until(self, signal: impl Future<Output = ()>) -> Result<WorkerReport> {
        let handle = self.start().await?;
        signal.await;
        Ok(handle.shutdown().await)
    }

    /// Checks what can be checked without a broker: at least one subscriber, unique
    /// subscriber names, and each subscriber's names, retry policy and topology
    /// ([`Subscriber::validate`]). [`Worker::start`], [`Worker::check_topology`] and
    /// [`from_config`] all run it.
    pub fn validate(&self) -> Result<()> {
        if self.subscribers.is_empty() {
            return Err(Error::Config(
                "a worker needs at least one subscriber".into(),
            ));
        }
        let mut names = std::collections::HashSet::new();
        for s in &self.subscribers {
            s.validate()?;
            if !names.insert(s.name.as_str()) {
                return Err(Error::Config(format!(
                    "two subscribers are named {:?}",
                    s.name
                )));
            }
        }
        Ok(())
    }

    /// Validates, connects, declares every topology, starts consuming; returns a handle.
    /// Errors here (bad topology, broker unreachable, inequivalent queue arguments) stop
    /// the start: nothing is consumed.
    pub async fn start(self) -> Result<WorkerHandle> {
        self.validate()?;
        let trust = match self.header_trust.clone() {
            Some(t) => t,
            None => match crate::trust::HeaderTrust::from_env() {
                Ok(t) if t.keys().is_some() => t,
                Ok(t) => {
                    tracing::warn!(
                        "{} is not set: rabbitkit's attempt and route headers are not signed, and are believed on copies that x-death says left a delay tier and on replays (forgeable by a producer that can publish into a tier or set those headers); see docs/GUARANTEES.md",
                        crate::trust::KEY_ENV
                    );
                    t
                }
                Err(e) => return Err(Error::Config(e.to_string())),
            },
        };
        if trust.keys().is_none() && !trust.accepts_unsigned() {
            // Every retry copy would start again at attempt 1: retried for ever.
            return Err(Error::Config(
                "header trust refuses unsigned copies but has no key to sign them with: every retry would start again at attempt 1".into(),
            ));
        }
        // Only here: state may be added to a worker after `from_config` built it.
        for s in &self.subscribers {
            s.check_state(&self.extensions)?;
            // Transactional mode needs the Postgres inbox (`crate::inbox`, `Worker::postgres`).
            if s.policy == crate::policy::AckPolicy::Transactional {
                #[cfg(feature = "postgres")]
                let wired = self.extensions.get::<crate::inbox::Inbox>().is_some();
                #[cfg(not(feature = "postgres"))]
                let wired = false;
                if !wired {
                    return Err(Error::Config(format!(
                        "subscriber {:?}: ack policy transactional needs rabbitkit's `postgres` feature and a worker inbox (Worker::postgres)",
                        s.name
                    )));
                }
            }
        }
        let vhost = self.connection.validate()?.vhost;
        if let Some(every) = self.parking_depth.filter(|e| *e < Duration::from_secs(1)) {
            return Err(Error::Config(format!(
                "parking-depth-interval must be at least 1s, got {}",
                humantime::format_duration(every)
            )));
        }
        // Before anything takes metric handles: they bind to the recorder installed now.
        #[cfg(feature = "http")]
        let listener = match self.http {
            Some(addr) => {
                crate::observe::install_prometheus();
                Some(crate::observe::bind(addr).await?)
            }
            None => None,
        };
        crate::stats::describe();
        let consumer = Arc::new(Connector::new(
            self.connection.clone(),
            "rabbitkit-consumer",
        )?);
        let publisher = Publisher::new(self.connection.clone(), self.publisher.clone())?;
        let wait = self.connection.connect_timeout;
        // Both at once: with a silent node in the list each pays its connect-timeout.
        let (conn, published) = tokio::join!(consumer.get(wait), publisher.connect());
        let conn = conn?;
        published?;
        for s in &self.subscribers {
            let ch = conn.conn.create_channel().await.map_err(Error::amqp)?;
            let topology = s.full_topology();
            match topology
                .apply_in(&ch, s.mode, &topology.site(&self.connection)?)
                .await
            {
                Ok(()) => {
                    let _ = ch.close(200, "topology declared".into()).await;
                }
                Err(e @ Error::ParkingUnavailable { .. }) => {
                    crate::topology::warn_parking_unavailable(&topology.queue, &e);
                }
                Err(e) => return Err(e),
            }
            // Classic tiers of an earlier release keep expiring into the work queue, but
            // at-most-once: say so, with the command that moves them.
            topology
                .warn_legacy_tiers(&conn.conn, &self.connection)
                .await;
        }
        let (stop_tx, stop) = watch::channel(false);
        let (hard_tx, hard_stop) = watch::channel(false);
        let parts = consume::WorkerParts {
            connector: consumer.clone(),
            publisher: publisher.clone(),
            stop,
            hard_stop,
            deadline: self.shutdown_deadline,
            trace_context: self.trace_context,
            trust,
        };
        let mut tasks = Vec::new();
        let mut stats = HashMap::new();
        let mut ready = Vec::new();
        let mut watched = Vec::new();
        for mut s in self.subscribers {
            if self.parking_depth.is_some() {
                watched.push(crate::observe::depth::Watched::new(
                    &vhost,
                    &s.topology.queue,
                ));
            }
            let counters = Arc::new(Counters::new(&Labels {
                vhost: vhost.clone(),
                queue: s.topology.queue.clone(),
                kinds: s.kinds.metric_kinds(),
            }));
            let is_ready = Arc::new(AtomicBool::new(false));
            stats.insert(s.name.clone(), counters.clone());
            if s.has_no_deadline() {
                tracing::warn!(
                    subscriber = %s.name,
                    queue = %s.topology.queue,
                    "this subscriber's handlers have no deadline: one that hangs holds its slot until the channel dies (/readyz reports a subscriber whose slots are all stuck)"
                );
            }
            ready.push(Consuming {
                flag: is_ready.clone(),
                counters: counters.clone(),
                slots: u64::try_from(s.concurrency.min(usize::from(s.prefetch)))
                    .unwrap_or(u64::MAX),
                stall_limit: stall_limit(
                    s.effective_deadline(),
                    s.retry.immediate_retries,
                    self.publisher.confirm_timeout,
                ),
            });
            let mut ext = self.extensions.clone();
            ext.insert(publisher.clone());
            ext.extend(std::mem::take(&mut s.extensions));
            let own = consume::SubscriberParts {
                subscriber: s,
                extensions: Arc::new(ext),
                counters,
                ready: is_ready,
            };
            let sub = consume::SubscriberTask::new(own, &parts);
            tasks.push(tokio::spawn(sub.run()));
        }
        let depth = self.parking_depth.map(|every| {
            tokio::spawn(crate::observe::depth::poll(
                consumer.clone(),
                watched,
                every,
            ))
        });
        let readiness = Arc::new(Readiness {
            stopping: AtomicBool::new(false),
            consuming: ready,
        });
        #[cfg(feature = "http")]
        let endpoint = listener.map(|listener| {
            let r = readiness.clone();
            crate::observe::Endpoint::serve(
                listener,
                crate::observe::HttpEndpoints::new(Arc::new(move || r.is_ready())),
            )
        });
        let counters: Vec<Arc<Counters>> = stats.values().cloned().collect();
        Ok(WorkerHandle {
            stats,
            publisher: publisher.clone(),
            running: Some(Running {
                readiness,
                #[cfg(feature = "http")]
                endpoint,
                stop: stop_tx,
                hard: hard_tx,
                tasks,
                publisher,
                consumer,
                deadline: self.shutdown_deadline,
                depth,
                counters,
                done: false,
            }),
        })
    }
}

/// Ready = every subscriber consuming and shutdown not started.
#[derive(Debug)]
struct Readiness {
    /// Set when shutdown starts (`/readyz` turns 503).
    stopping: AtomicBool,
    /// One per subscriber.
    consuming: Vec<Consuming>,
}

/// How long a subscriber whose slots are all taken may go without a delivery starting or
/// finishing before it counts as stalled: the longest a delivery can legitimately take:
/// every run of the handler (the first and its immediate retries) up to its deadline (the
/// default one without a deadline), then a copy's confirm, the longest requeue pause
/// (5 s), and 5 s of margin.
fn stall_limit(deadline: Option<Duration>, immediate_retries: u32, confirm: Duration) -> Duration {
    deadline
        .unwrap_or(crate::subscriber::DEFAULT_DEADLINE)
        .saturating_mul(immediate_retries.saturating_add(1))
        .saturating_add(confirm)
        .saturating_add(Duration::from_secs(10))
}

/// What tells whether one subscriber consumes.
#[derive(Debug)]
struct Consuming {
    /// Connected and subscribed.
    flag: Arc<AtomicBool>,
    counters: Arc<Counters>,
    /// Its concurrency (at most its prefetch).
    slots: u64,
    /// See [`stall_limit`].
    stall_limit: Duration,
}

impl Readiness {
    /// Ready: not stopping, and every subscriber subscribed and not stalled (all its slots
    /// taken and nothing finished for longer than [`stall_limit`]).
    fn is_ready(&self) -> bool {
        !self.stopping.load(Ordering::Acquire)
            && self.consuming.iter().all(|c| {
                c.flag.load(Ordering::Acquire) && !c.counters.stalled(c.slots, c.stall_limit)
            })
    }
}

/// A running worker.
///
/// [`WorkerHandle::shutdown`] stops it gracefully. Dropping the handle (or the future of
/// [`Worker::run_until`], or of `shutdown` itself) is a graceful shutdown with a zero
/// deadline, carried out in the background on the runtime: consuming stops, in-flight
/// handlers are cut and their deliveries requeued (a copy already sent gets its verdict
/// first), then both connections close. Without a runtime left to run it, the connections
/// die with the process and the broker requeues whatever was unacked.
#[derive(Debug)]
pub struct WorkerHandle {
    stats: HashMap<String, Arc<Counters>>,
    publisher: Publisher,
    /// `None` once `shutdown` has taken it.
    running: Option<Running>,
}

/// What stopping a worker needs. Dropped unfinished (the handle or a shutdown future
/// dropped), it stops the worker with a zero deadline.
#[derive(Debug)]
struct Running {
    /// What `is_ready` and `/readyz` read.
    readiness: Arc<Readiness>,
    #[cfg(feature = "http")]
    endpoint: Option<crate::observe::Endpoint>,
    stop: watch::Sender<bool>,
    hard: watch::Sender<bool>,
    /// Subscriber tasks not yet finished.
    tasks: Vec<JoinHandle<()>>,
    publisher: Publisher,
    consumer: Arc<Connector>,
    deadline: Duration,
    /// The parking-depth poller, when enabled.
    depth: Option<JoinHandle<()>>,
    /// Every subscriber's counters (the shutdown logs).
    counters: Vec<Arc<Counters>>,
    /// Set when a graceful shutdown completed.
    done: bool,
}

/// Counters of every subscriber at shutdown.
#[derive(Debug, Clone, Default)]
pub struct WorkerReport {
    /// Per subscriber name.
    pub subscribers: HashMap<String, SubscriberStats>,
}

impl WorkerHandle {
    /// The counters of subscriber `name`.
    pub fn stats(&self, name: &str) -> Option<SubscriberStats> {
        self.stats.get(name).map(|c| c.snapshot())
    }

    /// True when every subscriber is connected and consuming, and shutdown has not started.
    /// A subscriber whose concurrency slots are all taken, with no delivery started or
    /// finished for longer than a delivery can legitimately take (its handler runs up to
    /// their deadline, a copy's confirm timeout and 10 s), is not consuming: hung handlers.
    pub fn is_ready(&self) -> bool {
        self.running
            .as_ref()
            .is_some_and(|r| r.readiness.is_ready())
    }

    /// The address the HTTP endpoint listens on, when [`Worker::http`] was set.
    #[cfg(feature = "http")]
    pub fn http_addr(&self) -> Option<std::net::SocketAddr> {
        self.running
            .as_ref()
            .and_then(|r| r.endpoint.as_ref())
            .and_then(|e| e.addr)
    }

    /// `/metrics`, `/healthz` and `/readyz` of this worker as a `tower::Service`, to mount
    /// into your own axum or hyper server (with or without [`Worker::http`]). For
    /// `/metrics` to show rabbitkit's series, call
    /// [`observe::install_prometheus`](crate::observe::install_prometheus) before
    /// [`Worker::start`] (or set [`Worker::http`], which does).
    #[cfg(feature = "http")]
    pub fn http_service(&self) -> crate::observe::HttpEndpoints {
        let r = self.running.as_ref().map(|r| r.readiness.clone());
        crate::observe::HttpEndpoints::new(Arc::new(move || {
            r.as_ref().is_some_and(|r| r.is_ready())
        }))
    }

    /// The publisher the worker settles with (handlers get it as `State<Publisher>`).
    pub fn publisher(&self) -> &Publisher {
        &self.publisher
    }

    /// Stops consuming, lets in-flight handlers finish and settle within the shutdown
    /// deadline, requeues stragglers, closes both connections. Dropping this future before
    /// it completes finishes the shutdown in the background with a zero deadline (see
    /// [`WorkerHandle`]).
    pub async fn shutdown(mut self) -> WorkerReport {
        if let Some(mut running) = self.running.take() {
            running.shutdown().await;
        }
        WorkerReport {
            subscribers: self
                .stats
                .iter()
                .map(|(k, v)| (k.clone(), v.snapshot()))
                .collect(),
        }
    }
}

impl Running {
    async fn shutdown(&mut self) {
        let began = std::time::Instant::now();
        self.readiness.stopping.store(true, Ordering::Release);
        if let Some(d) = &self.depth {
            d.abort();
        }
        let in_flight: u64 = self.counters.iter().map(|c| c.in_flight_now()).sum();
        tracing::info!(
            in_flight,
            deadline = %humantime::format_duration(self.deadline),
            "shutdown: consuming stopped, draining in-flight handlers"
        );
        let _ = self.stop.send(true);
        let hard = self.hard.clone();
        let deadline = self.deadline;
        let counters = self.counters.clone();
        // A deadline past the clock's range (`Duration::MAX`) never fires.
        let timer = tokio::time::Instant::now().checked_add(deadline).map(|at| {
            tokio::spawn(async move {
                tokio::time::sleep_until(at).await;
                let left: u64 = counters.iter().map(|c| c.in_flight_now()).sum();
                if left > 0 {
                    tracing::warn!(
                        in_flight = left,
                        "shutdown deadline passed; cutting off the handlers still running and requeueing their messages"
                    );
                }
                let _ = hard.send(true);
            })
        });
        while let Some(t) = self.tasks.last_mut() {
            if let Err(e) = t.await {
                tracing::error!(error = %e, "subscriber task failed");
            }
            self.tasks.pop();
        }
        if let Some(timer) = timer {
            timer.abort();
        }
        self.publisher.close(Duration::from_secs(5)).await;
        self.consumer.close().await;
        #[cfg(feature = "http")]
        if let Some(e) = &self.endpoint {
            e.stop();
        }
        let stragglers: u64 = self
            .counters
            .iter()
            .map(|c| c.stragglers.load(Ordering::Relaxed))
            .sum();
        tracing::info!(
            drained = in_flight.saturating_sub(stragglers),
            stragglers_requeued = stragglers,
            took = ?began.elapsed(),
            "shutdown complete"
        );
        self.done = true;
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.readiness.stopping.store(true, Ordering::Release);
        if let Some(d) = &self.depth {
            d.abort();
        }
        let _ = self.stop.send(true);
        let _ = self.hard.send(true);
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let tasks = std::mem::take(&mut self.tasks);
        let publisher = self.publisher.clone();
        let consumer = self.consumer.clone();
        #[cfg(feature = "http")]
        let endpoint = self.endpoint.take();
        tracing::warn!(
            "worker dropped without a graceful shutdown; stopping it with a zero deadline"
        );
        rt.spawn(async move {
            for t in tasks {
                if let Err(e) = t.await {
                    tracing::error!(error = %e, "subscriber task failed");
                }
            }
            publisher.close(Duration::from_secs(5)).await;
            consumer.close().await;
            #[cfg(feature = "http")]
            if let Some(e) = endpoint {
                e.stop();
            }
        });
    }
}
