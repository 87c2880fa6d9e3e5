//! `/metrics`, `/healthz`, `/readyz`: a `tower::Service` ([`HttpEndpoints`]) and the
//! worker's own HTTP/1 server around it (hyper).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::error::{Error, Result};

/// Histogram buckets for the `_seconds` metrics: 1 ms to 60 s.
const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Largest request head the endpoint reads (hyper answers 431 past it).
const MAX_REQUEST: usize = 8 * 1024;
/// Connections served at once; more wait in the listen backlog.
const MAX_CONNECTIONS: usize = 64;
/// How long one connection may take, slow clients included.
const CONNECTION_TIME: Duration = Duration::from_secs(10);
/// How often histogram samples are folded into their buckets between scrapes.
const UPKEEP: Duration = Duration::from_secs(5);

static PROMETHEUS: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs rabbitkit's Prometheus recorder as the process's global `metrics` recorder,
/// once per process; true when it is (or already was) rabbitkit's. Call it before
/// [`Worker::start`](crate::Worker::start) when you serve [`HttpEndpoints`] from your own
/// server without [`Worker::http`](crate::Worker::http) (which calls it itself): metric
/// handles bind to the recorder installed when the worker starts. False when another
/// recorder was installed first: `/metrics` then answers 503.
pub fn install_prometheus() -> bool {
    prometheus().is_some()
}

pub(crate) fn prometheus() -> Option<&'static PrometheusHandle> {
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
                    crate::stats::describe();
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

/// Histogram samples are buffered until upkeep folds them into buckets: without a scrape
/// they would grow without bound. One thread folds them every [`UPKEEP`] while anything
/// that records them (a [`Publisher`](crate::Publisher), so every worker) is alive, and
/// exits when the last one is dropped.
struct Upkeep {
    /// (users alive, whether the thread runs).
    state: Mutex<(usize, bool)>,
    changed: Condvar,
}

static UPKEEP_STATE: Upkeep = Upkeep {
    state: Mutex::new((0, false)),
    changed: Condvar::new(),
};

/// Keeps the upkeep thread running while held.
#[derive(Debug)]
pub(crate) struct UpkeepGuard(());

/// A guard keeping histogram upkeep running, when rabbitkit's recorder is installed.
pub(crate) fn upkeep_guard() -> Option<UpkeepGuard> {
    let handle = PROMETHEUS.get()?.as_ref()?;
    let mut state = UPKEEP_STATE.state.lock().unwrap_or_else(|p| p.into_inner());
    state.0 += 1;
    if !state.1 {
        let spawned = std::thread::Builder::new()
            .name("rabbitkit-metrics-upkeep".into())
            .spawn(move || upkeep_loop(handle));
        match spawned {
            Ok(_) => state.1 = true,
            Err(e) => {
                tracing::warn!(error = %e, "no metrics upkeep thread; histograms are folded on scrape only");
            }
        }
    }
    Some(UpkeepGuard(()))
}

impl Drop for UpkeepGuard {
    fn drop(&mut self) {
        let mut state = UPKEEP_STATE.state.lock().unwrap_or_else(|p| p.into_inner());
        state.0 = state.0.saturating_sub(1);
        UPKEEP_STATE.changed.notify_all();
    }
}

fn upkeep_loop(handle: &'static PrometheusHandle) {
    loop {
        let state = UPKEEP_STATE.state.lock().unwrap_or_else(|p| p.into_inner());
        let (mut state, _) = UPKEEP_STATE
            .changed
            .wait_timeout_while(state, UPKEEP, |s| s.0 > 0)
            .unwrap_or_else(|p| p.into_inner());
        if state.0 == 0 {
            // Decided under the lock: a guard taken from now on starts a new thread.
            state.1 = false;
            drop(state);
            handle.run_upkeep();
            return;
        }
        drop(state);
        handle.run_upkeep();
    }
}

/// Whether the upkeep thread runs (tests).
#[cfg(test)]
fn upkeep_running() -> bool {
    UPKEEP_STATE
        .state
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .1
}

/// Readiness as the endpoint sees it.
pub(crate) type Ready = Arc<dyn Fn() -> bool + Send + Sync>;

/// `GET /metrics`, `/healthz` and `/readyz` of one worker as a `tower::Service` over
/// `http::Request`s, to mount into an axum or hyper server of your own:
///
/// ```text
/// let ops = handle.http_service();
/// let app = axum::Router::new()
///     .route_service("/metrics", ops.clone())
///     .route_service("/healthz", ops.clone())
///     .route_service("/readyz", ops);
/// ```
///
/// Paths are matched on their last segment (`/ops/metrics` is `/metrics`), so the
/// service also works behind a nested router. Other methods than `GET` and `HEAD` are 405,
/// other paths 404. Never fails (`Error = Infallible`).
#[derive(Clone)]
pub struct HttpEndpoints {
    ready: Ready,
    metrics: Option<&'static PrometheusHandle>,
}

impl std::fmt::Debug for HttpEndpoints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpEndpoints")
            .field("ready", &(self.ready)())
            .field("metrics", &self.metrics.is_some())
            .finish()
    }
}

impl HttpEndpoints {
    pub(crate) fn new(ready: Ready) -> Self {
        Self {
            ready,
            metrics: prometheus(),
        }
    }

    /// The answer to `method path`.
    pub fn respond(&self, method: &Method, path: &str) -> Response<Full<Bytes>> {
        let text = "text/plain; charset=utf-8";
        if method != Method::GET && method != Method::HEAD {
            return reply(StatusCode::METHOD_NOT_ALLOWED, text, "only GET\n".into());
        }
        match path.rsplit('/').next().unwrap_or("") {
            "metrics" => match self.metrics {
                Some(h) => {
                    h.run_upkeep();
                    reply(StatusCode::OK, "text/plain; version=0.0.4", h.render())
                }
                None => reply(
                    StatusCode::SERVICE_UNAVAILABLE,
                    text,
                    "another metrics recorder is installed in this process; scrape it\n".into(),
                ),
            },
            "healthz" => reply(StatusCode::OK, text, "ok\n".into()),
            "readyz" if (self.ready)() => reply(StatusCode::OK, text, "ready\n".into()),
            "readyz" => reply(StatusCode::SERVICE_UNAVAILABLE, text, "not ready\n".into()),
            _ => reply(StatusCode::NOT_FOUND, text, "not found\n".into()),
        }
    }
}

fn reply(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    if status == StatusCode::METHOD_NOT_ALLOWED {
        r.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
    }
    r
}

impl<B> tower::Service<Request<B>> for HttpEndpoints {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = std::future::Ready<std::result::Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<std::result::Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        std::future::ready(Ok(self.respond(req.method(), req.uri().path())))
    }
}

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
    /// Serves `endpoints` on `listener` until stopped.
    pub(crate) fn serve(listener: TcpListener, endpoints: HttpEndpoints) -> Self {
        let addr = listener.local_addr().ok();
        match addr {
            Some(addr) => tracing::info!(%addr, "metrics and health endpoint listening"),
            None => tracing::info!("metrics and health endpoint listening (address unknown)"),
        }
        let task = tokio::spawn(serve(listener, endpoints));
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

async fn serve(listener: TcpListener, endpoints: HttpEndpoints) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    // Owned here: when the endpoint stops, the open connections go with it.
    let mut connections = tokio::task::JoinSet::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(CONNECTION_TIME)
        .max_buf_size(MAX_REQUEST)
        .keep_alive(false);
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
        let svc = hyper::service::service_fn({
            let endpoints = endpoints.clone();
            move |req: Request<hyper::body::Incoming>| {
                std::future::ready(Ok::<_, Infallible>(
                    endpoints.respond(req.method(), req.uri().path()),
                ))
            }
        });
        let conn = http.serve_connection(TokioIo::new(stream), svc);
        connections.spawn(async move {
            match tokio::time::timeout(CONNECTION_TIME, conn).await {
                Ok(Err(e)) => tracing::debug!(error = %e, "endpoint request failed"),
                Err(_) => tracing::debug!("endpoint connection took too long; closed"),
                Ok(Ok(())) => {}
            }
            drop(slot);
        });
    }
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use std::time::{Duration, Instant};

    #[test]
    fn upkeep_thread_runs_while_used_and_exits_after() {
        assert!(super::install_prometheus());
        let a = super::upkeep_guard().expect("recorder installed");
        let b = super::upkeep_guard().expect("recorder installed");
        assert!(super::upkeep_running());
        drop(a);
        std::thread::sleep(Duration::from_millis(100));
        assert!(super::upkeep_running(), "one user is left");
        drop(b);
        let until = Instant::now() + Duration::from_secs(2);
        while super::upkeep_running() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!super::upkeep_running(), "no user left: the thread exits");
        let c = super::upkeep_guard().expect("recorder installed");
        assert!(super::upkeep_running(), "a new user starts it again");
        drop(c);
    }
}
