//! Metrics and the worker's HTTP endpoint.
//!
//! rabbitkit reports through the [`metrics`] facade, so any recorder works (install it
//! before [`Worker::start`](crate::Worker::start): the handles are taken then). Per
//! subscriber, labelled `vhost` and `queue`:
//!
//! - counters [`COUNTER_NAMES`]: `rabbitkit_consumed_total`, `rabbitkit_acked_total`,
//!   `rabbitkit_retried_total`, `rabbitkit_parked_total`, `rabbitkit_requeued_total`,
//!   `rabbitkit_rejected_total`, `rabbitkit_settlement_failures_total`,
//!   `rabbitkit_ack_lost_total`, `rabbitkit_panics_total`, `rabbitkit_timeouts_total`,
//!   `rabbitkit_unsettled_total` (the same numbers as [`SubscriberStats`](crate::SubscriberStats));
//! - gauge [`IN_FLIGHT`]; histogram [`HANDLER_DURATION`].
//!
//! Per publisher: histogram [`CONFIRM_LATENCY`] (no labels).
//!
//! With the `http` feature, [`Worker::http`](crate::Worker::http) serves, on one port:
//! `GET /metrics` (Prometheus text format, rendered by `metrics-exporter-prometheus`, which
//! rabbitkit installs as the global recorder), `GET /healthz` (200 while the worker runs)
//! and `GET /readyz` (200 when every subscriber is connected and consuming, 503 otherwise,
//! and from the moment shutdown starts).

pub use crate::stats::{CONFIRM_LATENCY, COUNTER_NAMES, HANDLER_DURATION, IN_FLIGHT};

#[cfg(feature = "http")]
pub(crate) use endpoint::{Endpoint, bind, install_prometheus};

#[cfg(feature = "http")]
mod endpoint {
    use std::net::SocketAddr;
    use std::sync::{Arc, OnceLock};
    use std::time::Duration;

    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};
    use tokio::task::JoinHandle;

    use crate::error::{Error, Result};

    /// Histogram buckets for the `_seconds` metrics: 1 ms to 60 s.
    const BUCKETS: &[f64] = &[
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    ];
    /// Largest request head the endpoint reads.
    const MAX_REQUEST: usize = 8 * 1024;
    /// Connections served at once; more wait in the listen backlog.
    const MAX_CONNECTIONS: usize = 64;
    /// How often histogram samples are folded into their buckets between scrapes.
    const UPKEEP: Duration = Duration::from_secs(5);

    static PROMETHEUS: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

    /// Installs the Prometheus recorder as the global `metrics` recorder, once per
    /// process. `None` when another recorder was installed first: `/metrics` then says so.
    pub(crate) fn install_prometheus() -> Option<&'static PrometheusHandle> {
        PROMETHEUS
            .get_or_init(|| {
                let builder = match PrometheusBuilder::new()
                    .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), BUCKETS)
                {
                    Ok(b) => b,
                    Err(e) => {
                        tracing::warn!(error = %e, "prometheus buckets refused; histograms are summaries");
                        PrometheusBuilder::new()
                    }
                };
                let recorder = builder.build_recorder();
                let handle = recorder.handle();
                match metrics::set_global_recorder(recorder) {
                    Ok(()) => {
                        // Histogram samples are buffered until upkeep folds them into
                        // buckets: without a scrape they would grow without bound.
                        let h = handle.clone();
                        let upkeep = std::thread::Builder::new()
                            .name("rabbitkit-metrics-upkeep".into())
                            .spawn(move || {
                                loop {
                                    std::thread::sleep(UPKEEP);
                                    h.run_upkeep();
                                }
                            });
                        if let Err(e) = upkeep {
                            tracing::warn!(error = %e, "no metrics upkeep thread; histograms are folded on scrape only");
                        }
                        Some(handle)
                    }
                    Err(_) => {
                        tracing::warn!(
                            "another metrics recorder is installed; /metrics will not serve rabbitkit's metrics (scrape your recorder)"
                        );
                        None
                    }
                }
            })
            .as_ref()
    }

    /// Readiness as the endpoint sees it.
    pub(crate) type Ready = Arc<dyn Fn() -> bool + Send + Sync>;

    /// Binds the endpoint's address: done before the worker consumes anything, so a port
    /// in use fails [`Worker::start`](crate::Worker::start) with nothing processed.
    pub(crate) async fn bind(addr: SocketAddr) -> Result<TcpListener> {
        TcpListener::bind(addr)
            .await
            .map_err(|e| Error::Config(format!("cannot listen on {addr}: {e}")))
    }

    /// The running endpoint; dropping it (or [`Endpoint::stop`]) closes the listener and
    /// every connection it is serving.
    #[derive(Debug)]
    pub(crate) struct Endpoint {
        pub(crate) addr: Option<SocketAddr>,
        task: JoinHandle<()>,
    }

    impl Endpoint {
        /// Serves on `listener` until stopped.
        pub(crate) fn serve(listener: TcpListener, ready: Ready) -> Self {
            let addr = listener.local_addr().ok();
            let metrics = install_prometheus();
            tracing::info!(?addr, "metrics and health endpoint listening");
            let task = tokio::spawn(serve(listener, ready, metrics));
            Self { addr, task }
        }

        pub(crate) fn stop(&self) {
            self.task.abort();
        }
    }

    impl Drop for Endpoint {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    async fn serve(
        listener: TcpListener,
        ready: Ready,
        metrics: Option<&'static PrometheusHandle>,
    ) {
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
        // Owned here: when the endpoint stops, the open connections go with it.
        let mut connections = tokio::task::JoinSet::new();
        loop {
            while connections.try_join_next().is_some() {}
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "endpoint accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let ready = ready.clone();
            connections.spawn(async move {
                let answer =
                    tokio::time::timeout(Duration::from_secs(10), respond(stream, &ready, metrics));
                if let Ok(Err(e)) = answer.await {
                    tracing::debug!(error = %e, "endpoint request failed");
                }
                drop(slot);
            });
        }
    }

    async fn respond(
        mut stream: TcpStream,
        ready: &Ready,
        metrics: Option<&'static PrometheusHandle>,
    ) -> std::io::Result<()> {
        let mut head = Vec::with_capacity(512);
        let mut chunk = [0u8; 1024];
        let mut scanned = 0;
        while !head[scanned..].windows(4).any(|w| w == b"\r\n\r\n") {
            // The end of the head may straddle two reads: look back 3 bytes, not further.
            scanned = head.len().saturating_sub(3);
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&chunk[..n]);
            if head.len() > MAX_REQUEST {
                return reply(&mut stream, 431, "text/plain", "request head too large\n").await;
            }
        }
        let head = String::from_utf8_lossy(&head);
        let mut line = head.lines().next().unwrap_or("").split(' ');
        let method = line.next().unwrap_or("");
        let path = line.next().unwrap_or("").split('?').next().unwrap_or("");
        let text = "text/plain; charset=utf-8";
        match (method, path) {
            ("GET", "/metrics") => match metrics {
                Some(h) => {
                    h.run_upkeep();
                    reply(&mut stream, 200, "text/plain; version=0.0.4", &h.render()).await
                }
                None => {
                    let msg = "another metrics recorder is installed in this process; scrape it\n";
                    reply(&mut stream, 503, text, msg).await
                }
            },
            ("GET", "/healthz") => reply(&mut stream, 200, text, "ok\n").await,
            ("GET", "/readyz") if ready() => reply(&mut stream, 200, text, "ready\n").await,
            ("GET", "/readyz") => reply(&mut stream, 503, text, "not ready\n").await,
            ("GET", _) => reply(&mut stream, 404, text, "not found\n").await,
            _ => reply(&mut stream, 405, text, "only GET\n").await,
        }
    }

    async fn reply(
        stream: &mut TcpStream,
        status: u16,
        content_type: &str,
        body: &str,
    ) -> std::io::Result<()> {
        let reason = match status {
            200 => "OK",
            404 => "Not Found",
            405 => "Method Not Allowed",
            431 => "Request Header Fields Too Large",
            _ => "Service Unavailable",
        };
        let head = format!(
            "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        stream.shutdown().await
    }
}
