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
        }
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

    /// Starts and runs until `signal` completes, then shuts down gracefully.
    pub async fn run_until(self, signal: impl Future<Output = ()>) -> Result<WorkerReport> {
        let handle = self.start().await?;
        signal.await;
        Ok(handle.shutdown().await)
    }

    /// Validates, connects, declares every topology, starts consuming; returns a handle.
    /// Errors here (bad topology, broker unreachable, inequivalent queue arguments) stop
    /// the start: nothing is consumed.
    pub async fn start(self) -> Result<WorkerHandle> {
        if self.subscribers.is_empty() {
            return Err(Error::Config(
                "a worker needs at least one subscriber".into(),
            ));
        }
        let mut names = std::collections::HashSet::new();
        for s in &self.subscribers {
            s.validate()?;
            if !names.insert(s.name.clone()) {
                return Err(Error::Config(format!(
                    "two subscribers are named {:?}",
                    s.name
                )));
            }
        }
        let vhost = self.connection.validate()?.vhost;
        // Before anything takes metric handles: they bind to the recorder installed now.
        #[cfg(feature = "http")]
        let listener = match self.http {
            Some(addr) => {
                crate::observe::install_prometheus();
                Some(crate::observe::bind(addr).await?)
            }
            None => None,
        };
        let consumer = Arc::new(Connector::new(
            self.connection.clone(),
            "rabbitkit-consumer",
        )?);
        let publisher = Publisher::new(self.connection.clone(), self.publisher.clone())?;
        let wait = self.connection.connect_timeout;
        let conn = consumer.get(wait).await?;
        publisher.connect().await?;
        for s in &self.subscribers {
            let ch = conn.conn.create_channel().await.map_err(Error::amqp)?;
            s.full_topology().apply(&ch, s.mode).await?;
            let _ = ch.close(200, "topology declared".into()).await;
        }
        let (stop_tx, stop_rx) = watch::channel(false);
        let (hard_tx, hard_rx) = watch::channel(false);
        let mut tasks = Vec::new();
        let mut stats = HashMap::new();
        let mut ready = Vec::new();
        for mut s in self.subscribers {
            let counters = Arc::new(Counters::new(&Labels {
                vhost: vhost.clone(),
                queue: s.topology.queue.clone(),
            }));
            let is_ready = Arc::new(AtomicBool::new(false));
            stats.insert(s.name.clone(), counters.clone());
            ready.push(is_ready.clone());
            let mut ext = self.extensions.clone();
            ext.insert(publisher.clone());
            ext.extend(std::mem::take(&mut s.extensions));
            let sub = consume::SubscriberTask::new(
                s,
                Arc::new(ext),
                consumer.clone(),
                publisher.clone(),
                counters,
                is_ready,
                stop_rx.clone(),
                hard_rx.clone(),
                self.shutdown_deadline,
            );
            tasks.push(tokio::spawn(sub.run()));
        }
        let readiness = Arc::new(Readiness {
            stopping: AtomicBool::new(false),
            consuming: ready,
        });
        #[cfg(feature = "http")]
        let endpoint = listener.map(|listener| {
            let r = readiness.clone();
            crate::observe::Endpoint::serve(listener, Arc::new(move || r.is_ready()))
        });
        Ok(WorkerHandle {
            readiness,
            #[cfg(feature = "http")]
            endpoint,
            stop: stop_tx,
            hard: hard_tx,
            tasks,
            stats,
            publisher,
            consumer,
            deadline: self.shutdown_deadline,
        })
    }
}

/// Ready = every subscriber consuming and shutdown not started.
#[derive(Debug)]
struct Readiness {
    /// Set when shutdown starts (`/readyz` turns 503).
    stopping: AtomicBool,
    /// One flag per subscriber: connected and consuming.
    consuming: Vec<Arc<AtomicBool>>,
}

impl Readiness {
    fn is_ready(&self) -> bool {
        !self.stopping.load(Ordering::Acquire)
            && self.consuming.iter().all(|r| r.load(Ordering::Acquire))
    }
}

/// A running worker.
#[derive(Debug)]
pub struct WorkerHandle {
    /// What `is_ready` and `/readyz` read.
    readiness: Arc<Readiness>,
    #[cfg(feature = "http")]
    endpoint: Option<crate::observe::Endpoint>,
    stop: watch::Sender<bool>,
    hard: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    stats: HashMap<String, Arc<Counters>>,
    publisher: Publisher,
    consumer: Arc<Connector>,
    deadline: Duration,
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
    pub fn is_ready(&self) -> bool {
        self.readiness.is_ready()
    }

    /// The address the HTTP endpoint listens on, when [`Worker::http`] was set.
    #[cfg(feature = "http")]
    pub fn http_addr(&self) -> Option<std::net::SocketAddr> {
        self.endpoint.as_ref().and_then(|e| e.addr)
    }

    /// The publisher the worker settles with (handlers get it as `State<Publisher>`).
    pub fn publisher(&self) -> &Publisher {
        &self.publisher
    }

    /// Stops consuming, lets in-flight handlers finish and settle within the shutdown
    /// deadline, requeues stragglers, closes both connections.
    pub async fn shutdown(self) -> WorkerReport {
        self.readiness.stopping.store(true, Ordering::Release);
        let _ = self.stop.send(true);
        let hard = self.hard;
        let deadline = self.deadline;
        let timer = tokio::spawn(async move {
            tokio::time::sleep(deadline).await;
            let _ = hard.send(true);
            // Keep the sender alive until the tasks end.
            hard.closed().await;
        });
        for t in self.tasks {
            if let Err(e) = t.await {
                tracing::error!(error = %e, "subscriber task failed");
            }
        }
        timer.abort();
        self.publisher.close(Duration::from_secs(5)).await;
        self.consumer.close().await;
        #[cfg(feature = "http")]
        if let Some(e) = &self.endpoint {
            e.stop();
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
