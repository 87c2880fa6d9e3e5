//! A worker built from a TOML config against a real broker, and the passive topology check
//! behind `--check`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use lapin::BasicProperties;
use lapin::ExchangeKind;
use lapin::options::ExchangeDeclareOptions;
use lapin::types::FieldTable;
use rabbitkit_core::config::{self, Handlers, WorkerConfig};
use rabbitkit_core::extract::Json;
use rabbitkit_core::headers::Attempt;
use rabbitkit_core::topology::ObjectState;
use rabbitkit_core::{BoxError, Delivery, Error, Failure, Outcome, worker};
use rabbitkit_tests::{Broker, Vhost, http, wait_until};

const WAIT: Duration = Duration::from_secs(30);

#[derive(serde::Deserialize)]
struct Order {
    #[allow(dead_code)]
    id: u64,
}

/// Fails its first two attempts.
async fn flaky(attempt: Attempt) -> Result<(), BoxError> {
    if attempt.number < 3 {
        Err(format!("transient failure on attempt {}", attempt.number).into())
    } else {
        Ok(())
    }
}

async fn orders(Json(_): Json<Order>) -> Result<(), BoxError> {
    Ok(())
}

fn handlers() -> Handlers {
    // One of each kind of registration: a tower service and async fns.
    let greet = tower::service_fn(|d: Delivery| async move {
        Ok::<_, BoxError>(if d.body().is_empty() {
            Outcome::park(Failure::decode("empty greeting"))
        } else {
            Outcome::Ack
        })
    });
    Handlers::new()
        .service("greet", greet)
        .handler("flaky", flaky)
        .handler("orders", orders)
}

/// A config for `vh` with three subscribers; `jobs_type` is the queue type of `cfg.jobs`.
fn config(vh: &Vhost, jobs_type: &str, mode: &str) -> WorkerConfig {
    let src = config_src(vh, jobs_type, mode);
    WorkerConfig::from_toml(&src).unwrap_or_else(|e| panic!("{e}"))
}

fn config_src(vh: &Vhost, jobs_type: &str, mode: &str) -> String {
    format!(
        r#"
shutdown-deadline = "5s"
[connection]
url = "{url}"
connect-timeout = "10s"
[topology]
mode = "{mode}"
[[subscribers]]
handler = "greet"
queue = "cfg.greetings"
bindings = [{{ exchange = "cfg", routing-key = "greeting.*" }}]
[[subscribers]]
handler = "flaky"
name = "jobs"
queue = "cfg.jobs"
queue-type = "{jobs_type}"
prefetch = 5
[subscribers.retry]
tiers = ["200ms"]
max-attempts = 5
[[subscribers]]
handler = "orders"
queue = "cfg.orders"
bindings = [{{ exchange = "cfg", routing-key = "order.*" }}]
[subscribers.retry]
tiers = ["200ms"]
max-attempts = 2
"#,
        url = vh.url()
    )
}

/// Declares `cfg`'s topology the way a worker does: by starting one, then stopping it.
async fn apply_topology(cfg: &WorkerConfig) {
    let w = worker::from_config(cfg, &handlers())
        .unwrap()
        .start()
        .await
        .unwrap_or_else(|e| panic!("start: {e}"));
    w.shutdown().await;
}

fn json() -> BasicProperties {
    BasicProperties::default().with_content_type("application/json".into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn worker_from_toml_acks_retries_and_parks() {
    let vh = Broker::from_env().vhost("cfg-run");
    let w = worker::from_config(&config(&vh, "classic", "declare"), &handlers())
        .unwrap()
        .start()
        .await
        .unwrap_or_else(|e| panic!("start: {e}"));
    for i in 0..3 {
        vh.publish_raw("cfg", "greeting.new", format!("hi {i}").as_bytes(), json())
            .await;
    }
    vh.publish_raw("cfg", "greeting.new", b"", json()).await;
    for _ in 0..2 {
        vh.publish_raw("", "cfg.jobs", b"job", json()).await;
    }
    vh.publish_raw("cfg", "order.created", br#"{"id":1}"#, json())
        .await;
    vh.publish_raw("cfg", "order.created", b"{not json", json())
        .await;
    wait_until(WAIT, "every message settled", || async {
        let (g, j, o) = (
            w.stats("cfg.greetings").unwrap(),
            w.stats("jobs").unwrap(),
            w.stats("cfg.orders").unwrap(),
        );
        g.acked == 4 && g.parked == 1 && j.acked == 6 && o.acked == 2 && o.parked == 1
    })
    .await;
    let jobs = w.stats("jobs").unwrap();
    assert_eq!(
        (jobs.retried, jobs.parked),
        (4, 0),
        "two failures each, then success"
    );
    let orders = w.stats("cfg.orders").unwrap();
    assert_eq!(
        (orders.retried, orders.parked),
        (0, 1),
        "poison parks at once"
    );
    let greetings = w.stats("cfg.greetings").unwrap();
    assert_eq!(
        (greetings.retried, greetings.parked),
        (0, 1),
        "the service parked the empty greeting"
    );
    let report = w.shutdown().await;
    assert_eq!(report.subscribers.len(), 3);
    for q in [
        "cfg.greetings",
        "cfg.jobs",
        "cfg.orders",
        "cfg.jobs.delay.200ms",
    ] {
        assert_eq!(vh.depth(q).await, 0, "{q} is empty");
    }
    assert_eq!(vh.depth("cfg.jobs.parking").await, 0);
    let parked = vh.get_all("cfg.orders.parking", 10).await;
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0].body, b"{not json");
    assert_eq!(
        parked[0].header_str("x-rabbitkit-park-reason").as_deref(),
        Some("decode")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_passes_on_an_applied_topology() {
    let vh = Broker::from_env().vhost("cfg-check-ok");
    let cfg = config(&vh, "quorum", "declare");
    apply_topology(&cfg).await;
    let report = config::check(&cfg, &handlers()).await.unwrap();
    assert!(report.is_ok(), "{report}");
    assert!(
        report
            .present()
            .any(|o| o.what == r#"work queue "cfg.jobs""#),
        "{report:?}"
    );
    assert!(
        report
            .present()
            .any(|o| o.what == r#"retry tier "cfg.jobs.delay.200ms""#)
    );
    assert!(
        report
            .present()
            .any(|o| o.what == r#"exchange "cfg" (topic)"#)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_a_missing_queue_without_declaring_anything() {
    let vh = Broker::from_env().vhost("cfg-check-missing");
    let cfg = config(&vh, "classic", "declare");
    apply_topology(&cfg).await;
    vh.delete_queue("cfg.orders").await;
    vh.delete_queue("cfg.jobs.delay.200ms").await;
    let report = config::check(&cfg, &handlers()).await.unwrap();
    assert!(!report.is_ok());
    let text = report.to_string();
    assert_eq!(report.problems().count(), 2, "{text}");
    assert!(
        text.contains(r#"cfg.orders: work queue "cfg.orders": missing"#),
        "{text}"
    );
    assert!(
        text.contains(r#"jobs: retry tier "cfg.jobs.delay.200ms": missing"#),
        "{text}"
    );
    assert_eq!(vh.try_depth("cfg.orders").await, None, "not declared");
    assert_eq!(vh.try_depth("cfg.jobs.delay.200ms").await, None);

    // A fresh vhost: everything is missing, and still nothing gets declared.
    let empty = Broker::from_env().vhost("cfg-check-empty");
    let report = config::check(&config(&empty, "classic", "declare"), &handlers())
        .await
        .unwrap();
    assert_eq!(report.present().count(), 0, "{report}");
    assert!(report.problems().all(|p| p.state == ObjectState::Missing));
    assert_eq!(empty.try_depth("cfg.greetings").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_a_queue_of_the_other_type() {
    for (declared, configured) in [("classic", "quorum"), ("quorum", "classic")] {
        let vh = Broker::from_env().vhost("cfg-check-type");
        apply_topology(&config(&vh, declared, "declare")).await;
        let report = config::check(&config(&vh, configured, "declare"), &handlers())
            .await
            .unwrap();
        let text = report.to_string();
        let problems: Vec<_> = report.problems().collect();
        assert_eq!(problems.len(), 1, "{declared} → {configured}: {text}");
        let p = problems[0];
        assert_eq!(p.what, r#"work queue "cfg.jobs""#);
        let issue = p.state.to_string();
        let want = if configured == "quorum" {
            r#"x-queue-type = "quorum""#
        } else {
            "classic type"
        };
        assert!(
            issue.starts_with("differs") && issue.contains(want),
            "{declared} → {configured}: {text}"
        );
        assert!(issue.contains("PRECONDITION_FAILED"), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_an_exchange_of_another_kind() {
    let vh = Broker::from_env().vhost("cfg-check-kind");
    let c = vh.connect().await;
    let ch = c.create_channel().await.unwrap();
    ch.exchange_declare(
        "cfg".into(),
        ExchangeKind::Fanout,
        ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    let _ = c.close(200, "".into()).await;
    let report = config::check(&config(&vh, "classic", "declare"), &handlers())
        .await
        .unwrap();
    let text = report.to_string();
    let kind: Vec<_> = report
        .problems()
        .filter(|p| p.what == r#"exchange "cfg" (topic)"#)
        .map(|p| p.state.to_string())
        .collect();
    assert_eq!(kind.len(), 2, "greetings and orders bind to it: {text}");
    assert!(
        kind[0].contains("topic exchange") && kind[0].contains("PRECONDITION_FAILED"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validate_mode_from_config_refuses_to_start_on_a_missing_topology() {
    let vh = Broker::from_env().vhost("cfg-validate");
    let err = worker::from_config(&config(&vh, "classic", "validate"), &handlers())
        .unwrap()
        .start()
        .await
        .err();
    assert!(matches!(err, Some(Error::Declare { .. })), "{err:?}");
    assert_eq!(vh.try_depth("cfg.greetings").await, None);
    assert_eq!(vh.try_depth("cfg.greetings.parking").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_listen_from_config_serves_metrics_and_readiness() {
    let vh = Broker::from_env().vhost("cfg-http");
    let src = config_src(&vh, "classic", "declare").replace(
        "[topology]",
        "[observability]\nhttp-listen = \"127.0.0.1:0\"\n[topology]",
    );
    let cfg = WorkerConfig::from_toml(&src).unwrap_or_else(|e| panic!("{e}"));
    let w = worker::from_config(&cfg, &handlers())
        .unwrap()
        .start()
        .await
        .unwrap_or_else(|e| panic!("start: {e}"));
    let base = format!("http://{}", w.http_addr().expect("the endpoint is served"));
    wait_until(WAIT, "/readyz says ready", || {
        let base = base.clone();
        async move { http(&base, "GET", "/readyz", None).0 == 200 }
    })
    .await;
    vh.publish_raw("cfg", "greeting.new", b"hi", json()).await;
    wait_until(WAIT, "the greeting acked", || async {
        w.stats("cfg.greetings").unwrap().acked == 1
    })
    .await;
    let (status, scrape) = http(&base, "GET", "/metrics", None);
    assert_eq!(status, 200);
    let acked = scrape.lines().find(|l| {
        l.starts_with("rabbitkit_acked_total{")
            && l.contains(r#"queue="cfg.greetings""#)
            && l.contains(&format!(r#"vhost="{}""#, vh.name))
    });
    assert!(
        acked.is_some_and(|l| l.ends_with(" 1")),
        "{acked:?} in\n{scrape}"
    );
    w.shutdown().await;
}
