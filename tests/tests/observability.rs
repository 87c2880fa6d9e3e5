//! Metrics, health and readiness on the worker's HTTP endpoint, against a real broker.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use lapin::BasicProperties;
use rabbitkit_core::extract::Json;
use rabbitkit_core::headers::Attempt;
use rabbitkit_core::{BoxError, ConnectionConfig, RetryPolicy, Subscriber, Worker};
use rabbitkit_tests::{Broker, Vhost, http, wait_until};

const WAIT: Duration = Duration::from_secs(20);

#[derive(serde::Deserialize)]
struct Order {
    id: u32,
}

fn json() -> BasicProperties {
    BasicProperties::default().with_content_type("application/json".into())
}

async fn start(vh: &Vhost, sub: Subscriber) -> rabbitkit_core::WorkerHandle {
    Worker::new(ConnectionConfig::new(vh.url()))
        .shutdown_deadline(Duration::from_secs(5))
        .parking_depth_interval(Duration::from_secs(1))
        .http("127.0.0.1:0".parse().unwrap())
        .subscribe(sub)
        .start()
        .await
        .unwrap()
}

/// The value of `name` for this vhost's `orders` queue in a Prometheus text scrape, summed
/// over its other labels (`parked` has one series per reason).
fn sample(scrape: &str, name: &str, vhost: &str) -> Option<f64> {
    sample_with(scrape, name, vhost, "")
}

/// Like [`sample`], over the series whose labels also contain `extra`.
fn sample_with(scrape: &str, name: &str, vhost: &str, extra: &str) -> Option<f64> {
    let values: Vec<f64> = scrape
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split(['{', ' ']).next() == Some(name))
        .filter(|l| {
            (l.contains(r#"queue="orders""#)
                || l.contains(r#"messaging_destination_name="orders""#))
                && l.contains(&format!(r#"vhost="{vhost}""#))
                && l.contains(extra)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_endpoint_reports_the_same_counts_as_the_worker() {
    let vh = Broker::from_env().vhost("obs-metrics");
    // Every third order fails on its first attempt; unparsable payloads are parked.
    let sub = Subscriber::new("orders", |a: Attempt, Json(o): Json<Order>| async move {
        if o.id % 3 == 0 && a.number == 1 {
            return Err::<(), BoxError>("transient".into());
        }
        Ok(())
    })
    .retry(RetryPolicy::new([Duration::from_millis(200)]).max_attempts(3));
    let w = start(&vh, sub).await;
    let base = format!("http://{}", w.http_addr().unwrap());
    wait_until(WAIT, "/readyz 200", || async {
        http(&base, "GET", "/readyz", None).0 == 200
    })
    .await;
    assert_eq!(http(&base, "GET", "/healthz", None), (200, "ok\n".into()));
    for id in 1..=9 {
        vh.publish_raw("", "orders", format!(r#"{{"id":{id}}}"#).as_bytes(), json())
            .await;
    }
    for _ in 0..2 {
        vh.publish_raw("", "orders", b"not json", json()).await;
    }
    // 6 direct successes, 3 failures retried then acked, 2 poison parked.
    wait_until(WAIT, "every delivery settled", || async {
        let s = w.stats("orders").unwrap();
        (s.consumed, s.acked, s.retried, s.parked) == (14, 14, 3, 2)
    })
    .await;
    let st = w.stats("orders").unwrap();
    let (status, scrape) = http(&base, "GET", "/metrics", None);
    assert_eq!(status, 200, "{scrape}");
    let name = vh.name.as_str();
    for (metric, want) in [
        ("rabbitkit_consumed_total", st.consumed),
        ("rabbitkit_acked_total", st.acked),
        ("rabbitkit_retried_total", st.retried),
        ("rabbitkit_parked_total", st.parked),
        ("rabbitkit_requeued_total", st.requeued),
        (
            "rabbitkit_settlement_failures_total",
            st.settlement_failures,
        ),
        ("rabbitkit_panics_total", st.panics),
    ] {
        assert_eq!(
            sample(&scrape, metric, name),
            Some(want as f64),
            "{metric} in:\n{scrape}"
        );
    }
    assert_eq!(
        sample(&scrape, "rabbitkit_handler_duration_seconds_count", name),
        Some(14.0),
        "every delivery ran through the handler service (the poison ones stop at the extractor):\n{scrape}"
    );
    assert_eq!(sample(&scrape, "rabbitkit_in_flight", name), Some(0.0));
    assert_eq!(
        sample_with(
            &scrape,
            "rabbitkit_parked_total",
            name,
            r#"reason="decode""#
        ),
        Some(2.0),
        "parked by reason:\n{scrape}"
    );
    assert_eq!(
        sample_with(
            &scrape,
            "rabbitkit_parked_total",
            name,
            r#"reason="max-attempts""#
        ),
        Some(0.0),
        "every reason is exported from the start"
    );
    assert_eq!(
        sample(&scrape, "messaging_client_consumed_messages_total", name),
        Some(st.consumed as f64)
    );
    assert_eq!(
        sample(&scrape, "messaging_process_duration_seconds_count", name),
        Some(st.consumed as f64),
        "every delivery from receipt to settlement:\n{scrape}"
    );
    for conn in ["rabbitkit-consumer", "rabbitkit-publisher"] {
        let up = format!(r#"rabbitkit_connection_up{{connection="{conn}",vhost="{name}"}} 1"#);
        assert!(scrape.contains(&up), "{up} in:\n{scrape}");
    }
    assert_help_on_every_series(&scrape);
    // The parking-depth gauge follows the parking queue (polled every second).
    wait_until(WAIT, "parking depth gauge at 2", || async {
        let (_, s) = http(&base, "GET", "/metrics", None);
        sample(&s, "rabbitkit_parking_depth", name) == Some(2.0)
    })
    .await;
    let confirms = scrape
        .lines()
        .find(|l| l.starts_with("rabbitkit_confirm_latency_seconds_count"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(confirms >= 5.0, "5 copies confirmed at least:\n{scrape}");
    assert_eq!(http(&base, "GET", "/nope", None).0, 404);
    assert_eq!(http(&base, "POST", "/metrics", Some("")).0, 405);
    let addr = w.http_addr().unwrap();
    w.shutdown().await;
    wait_until(WAIT, "endpoint closed after shutdown", || async move {
        tokio::net::TcpStream::connect(addr).await.is_err()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failures_are_counted_by_known_error_kind_and_a_manual_park_keeps_its_kind() {
    use rabbitkit_core::extract::Body;
    use rabbitkit_core::{Failure, Outcome, headers};
    let vh = Broker::from_env().vhost("obs-kinds");
    // `fraud` is declared, `mystery` is not: it is counted as `other`, so a handler cannot
    // grow the label's values without bound.
    let sub = Subscriber::new("orders", |a: Attempt, Body(body): Body| async move {
        match &body[..] {
            b"fraud" => Outcome::Park(Failure::new("fraud", "card flagged")),
            b"mystery" => Outcome::Park(Failure::new("mystery", "who knows")),
            b"flaky" if a.number == 1 => Outcome::Error("transient".into()),
            _ => Outcome::Ack,
        }
    })
    .kinds(["fraud"])
    .retry(RetryPolicy::new([Duration::from_millis(200)]).max_attempts(3));
    let w = start(&vh, sub).await;
    let base = format!("http://{}", w.http_addr().unwrap());
    for body in ["fraud", "mystery", "flaky", "fine"] {
        vh.publish_raw("", "orders", body.as_bytes(), BasicProperties::default())
            .await;
    }
    wait_until(WAIT, "every delivery settled", || async {
        let s = w.stats("orders").unwrap();
        (s.acked, s.retried, s.parked) == (5, 1, 2)
    })
    .await;
    let (_, scrape) = http(&base, "GET", "/metrics", None);
    let name = vh.name.as_str();
    let failures = |kind: &str| {
        sample_with(
            &scrape,
            "rabbitkit_failures_total",
            name,
            &format!(r#"kind="{kind}""#),
        )
    };
    assert_eq!(failures("fraud"), Some(1.0), "{scrape}");
    assert_eq!(failures("other"), Some(1.0), "{scrape}");
    assert_eq!(failures("error"), Some(1.0), "{scrape}");
    assert_eq!(
        failures("decode"),
        Some(0.0),
        "known kinds from the start:\n{scrape}"
    );
    assert_eq!(failures("mystery"), None, "{scrape}");
    assert_eq!(sample(&scrape, "rabbitkit_failures_total", name), Some(3.0));
    assert_help_on_every_series(&scrape);
    // The park reason says who decided (the handler); the error kind says what failed.
    let parked = vh.get_all("orders.parking", 10).await;
    let fraud = parked
        .iter()
        .find(|g| g.body == b"fraud")
        .expect("fraud parked");
    assert_eq!(
        fraud.header_str(headers::PARK_REASON).as_deref(),
        Some("handler")
    );
    assert_eq!(
        fraud.header_str(headers::ERROR_KIND).as_deref(),
        Some("fraud")
    );
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readyz_turns_unavailable_when_shutdown_starts() {
    let vh = Broker::from_env().vhost("obs-ready");
    let release = Arc::new(tokio::sync::Notify::new());
    let r2 = release.clone();
    let sub = Subscriber::new("orders", move || {
        let release = r2.clone();
        async move {
            release.notified().await;
            Ok::<_, BoxError>(())
        }
    });
    let w = start(&vh, sub).await;
    let base = format!("http://{}", w.http_addr().unwrap());
    wait_until(WAIT, "/readyz 200", || async {
        http(&base, "GET", "/readyz", None).0 == 200
    })
    .await;
    vh.publish_raw("", "orders", b"slow", json()).await;
    wait_until(WAIT, "handler running", || async {
        w.stats("orders").unwrap().consumed == 1
    })
    .await;
    let shutdown = tokio::spawn(w.shutdown());
    let b2 = base.clone();
    wait_until(WAIT, "/readyz 503 while draining", move || {
        let b = b2.clone();
        async move { http(&b, "GET", "/readyz", None).0 == 503 }
    })
    .await;
    assert_eq!(
        http(&base, "GET", "/healthz", None).0,
        200,
        "alive while draining"
    );
    release.notify_one();
    let report = shutdown.await.unwrap();
    assert_eq!(report.subscribers["orders"].acked, 1);
}

/// A port already in use fails the start before anything is declared or consumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_port_fails_the_start_before_anything_is_consumed() {
    let vh = Broker::from_env().vhost("obs-port");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let sub = Subscriber::new("orders", || async { Ok::<_, BoxError>(()) });
    let err = Worker::new(ConnectionConfig::new(vh.url()))
        .http(addr)
        .subscribe(sub)
        .start()
        .await
        .expect_err("the start must fail");
    assert!(
        matches!(err, rabbitkit_core::Error::Config(_))
            && err.to_string().contains("cannot listen"),
        "{err}"
    );
    assert_eq!(vh.try_depth("orders").await, None, "nothing was declared");
}

/// Every series in a scrape has a `# HELP` line.
fn assert_help_on_every_series(scrape: &str) {
    let helped: std::collections::HashSet<&str> = scrape
        .lines()
        .filter_map(|l| l.strip_prefix("# HELP ")?.split(' ').next())
        .collect();
    for line in scrape
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let name = line.split(['{', ' ']).next().unwrap();
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|b| helped.contains(b)))
            .unwrap_or(name);
        assert!(helped.contains(base), "no # HELP for {name}");
    }
}

/// Metric names (and label names) used by the shipped dashboard and alert rules.
fn referenced_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    let mut token = String::new();
    for c in text.chars().chain(std::iter::once(' ')) {
        if c.is_ascii_alphanumeric() || c == '_' {
            token.push(c);
            continue;
        }
        if token.starts_with("rabbitkit_") || token.starts_with("messaging_") {
            names.insert(std::mem::take(&mut token));
        }
        token.clear();
    }
    names
}

/// Every metric the Grafana dashboard and the Prometheus alert rules in `docs/dashboards/`
/// reference exists on a real `/metrics` (or is a label of one): renaming a metric breaks
/// this test, not the operators' dashboards.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dashboard_and_alert_rules_use_only_exported_metrics() {
    let vh = Broker::from_env().vhost("obs-dashboard");
    let sub = Subscriber::new("orders", |a: Attempt, Json(o): Json<Order>| async move {
        if o.id == 1 && a.number == 1 {
            return Err::<(), BoxError>("transient".into());
        }
        Ok(())
    })
    .retry(RetryPolicy::new([Duration::from_millis(100)]).max_attempts(3));
    let w = start(&vh, sub).await;
    let base = format!("http://{}", w.http_addr().unwrap());
    vh.publish_raw("", "orders", br#"{"id":1}"#, json()).await;
    vh.publish_raw("", "orders", b"poison", json()).await;
    wait_until(WAIT, "settled and the parking depth polled", || async {
        let s = w.stats("orders").unwrap();
        let (_, scrape) = http(&base, "GET", "/metrics", None);
        (s.acked, s.retried, s.parked) == (3, 1, 1)
            && sample(&scrape, "rabbitkit_parking_depth", &vh.name) == Some(1.0)
    })
    .await;
    let (status, scrape) = http(&base, "GET", "/metrics", None);
    assert_eq!(status, 200);
    let series: std::collections::HashSet<&str> = scrape
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    let labels: std::collections::HashSet<&str> = scrape
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('{')?.1.split_once('}'))
        .flat_map(|(labels, _)| labels.split(','))
        .filter_map(|kv| kv.split('=').next())
        .collect();
    // Shown with --nocapture (docs/OBSERVABILITY.md quotes it).
    scrape
        .lines()
        .filter(|l| l.contains(&format!(r#"vhost="{}""#, vh.name)) && !l.contains("_bucket"))
        .for_each(|l| println!("{l}"));
    let dashboard = include_str!("../../docs/dashboards/rabbitkit-grafana.json");
    let alerts = include_str!("../../docs/dashboards/rabbitkit-alerts.yml");
    serde_json::from_str::<serde_json::Value>(dashboard).expect("the dashboard is JSON");
    for (file, text) in [("dashboard", dashboard), ("alert rules", alerts)] {
        let names = referenced_names(text);
        let metrics: Vec<_> = names
            .iter()
            .filter(|n| !labels.contains(n.as_str()))
            .collect();
        assert!(metrics.len() >= 6, "{file} references metrics: {names:?}");
        for name in metrics {
            assert!(
                series.contains(name.as_str()),
                "the {file} uses {name}, which /metrics does not export:\n{scrape}"
            );
        }
    }
    w.shutdown().await;
}
