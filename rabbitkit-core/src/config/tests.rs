use std::time::Duration;

use super::*;
use crate::extract::Body;
use crate::policy::{AckPolicy, ManualFallback};
use crate::retry::RetryStep;
use crate::subscriber::Subscriber;
use crate::topology::{Binding, QueueType, TopologyMode};
use crate::worker::{Worker, from_config};
use crate::{Error, RetryPolicy};

// The connection section (URLs, nodes, TLS, the environment), and the mistakes a file is
// refused for, each located by key: tests of their own.
mod connection;
mod refusals;

const REFERENCE: &str = include_str!("../../../examples/worker.toml");

async fn ok(_: Body) -> Result<(), std::io::Error> {
    Ok(())
}

fn handlers() -> Handlers {
    Handlers::new()
        .handler("greet", ok)
        .handler("flaky", ok)
        // The reference file gives the orders subscriber policies for these kinds.
        .subscriber(
            "orders",
            Subscriber::new("", ok).kinds(["validation", "inventory"]),
        )
}

fn parse(src: &str) -> WorkerConfig {
    WorkerConfig::from_toml(src).unwrap_or_else(|e| panic!("{e}"))
}

fn build(src: &str) -> Worker {
    from_config(&parse(src), &handlers()).unwrap_or_else(|e| panic!("{e}"))
}

/// The error of parsing `src`, as (key, line, column, message).
fn file_error(src: &str) -> (String, usize, usize, String) {
    match WorkerConfig::from_toml(src) {
        Err(Error::ConfigFile {
            key,
            line,
            column,
            message,
        }) => (key, line, column, message),
        other => panic!("expected a ConfigFile error, got {other:?}"),
    }
}

const MINIMAL: &str = r#"
[connection]
url = "amqp://app:s3cret@rabbit:5672/%2f"

[[subscribers]]
handler = "greet"
queue = "greetings"
"#;

#[test]
fn reference_file_parses_with_every_key() {
    let cfg = parse(REFERENCE);
    assert_eq!(cfg.subscribers.len(), 3);
    let w = from_config(&cfg, &handlers()).unwrap_or_else(|e| panic!("{e}"));
    let flaky = &w.subscribers[1];
    assert_eq!(flaky.handler_name(), "flaky-jobs");
    assert_eq!(flaky.topology.queue_type, QueueType::Quorum);
    assert_eq!(flaky.topology.tier_queue_type, QueueType::Quorum);
    // Left out, the tiers are quorum.
    assert_eq!(w.subscribers[0].topology.tier_queue_type, QueueType::Quorum);
    assert_eq!(
        flaky.retry.tiers,
        [Duration::from_millis(200), Duration::from_secs(1)]
    );
    assert_eq!(w.parking_depth, Some(Duration::from_secs(30)));
    assert_eq!(
        flaky.ack_coalescing,
        Some(crate::AckCoalescing::new(8, Duration::from_millis(5)))
    );
    // Policies by kind reach the subscriber and its decisions.
    let orders = &w.subscribers[2].retry;
    assert_eq!(orders.next_for("validation", 1, None), RetryStep::ParkNow);
    assert_eq!(
        orders.next_for("inventory", 4, None),
        RetryStep::Tier(Duration::from_secs(1))
    );
    assert_eq!(orders.next_for("error", 3, None), RetryStep::Exhausted);
}

#[test]
fn defaults_are_the_builders() {
    let cfg = parse(MINIMAL);
    assert_eq!(cfg.shutdown_deadline, Duration::from_secs(30));
    assert_eq!(cfg.publisher, crate::PublisherConfig::default());
    assert_eq!(cfg.observability, Observability::default());
    assert_eq!(
        cfg.connection.to_connection_config(),
        crate::ConnectionConfig::new("amqp://app:s3cret@rabbit:5672/%2f")
    );
    let w = build(MINIMAL);
    let s = &w.subscribers[0];
    let plain = Subscriber::new("greetings", ok);
    assert_eq!(
        s.handler_name(),
        "greetings",
        "the name defaults to the queue"
    );
    assert_eq!(s.topology, plain.topology);
    assert_eq!(s.retry, plain.retry);
    assert_eq!(
        (s.prefetch, s.concurrency),
        (plain.prefetch, plain.concurrency)
    );
    assert_eq!(
        (s.policy, s.fallback, s.mode),
        (plain.policy, plain.fallback, plain.mode)
    );
    assert_eq!(
        s.effective_deadline(),
        Some(crate::subscriber::DEFAULT_DEADLINE)
    );
    assert_eq!(s.ack_coalescing, None, "ack coalescing is off by default");
}

/// Every key with a value that is not its default, and the place it must reach.
#[test]
fn every_key_reaches_the_worker() {
    let src = r#"
shutdown-deadline = "7s"
[connection]
url = "amqp://app:s3cret@rabbit:5672/orders"
heartbeat = "3s"
connect-timeout = "4s"
max-backoff = "9s"
tls = false
[publisher]
max-in-flight = 7
channels = 2
confirm-timeout = "11s"
max-body = 1000
[topology]
mode = "validate"
management-url = "http://ops:pw@rabbit:15672"
allow-plain-http = true
[observability]
log-level = "debug"
log-format = "compact"
[[subscribers]]
handler = "flaky"
name = "jobs-v2"
queue = "jobs"
queue-type = "quorum"
delivery-limit = 9
tier-queue-type = "classic"
exchange-kind = "direct"
bindings = [{ exchange = "work", routing-key = "job" }]
prefetch = 12
concurrency = 3
ack = "manual"
manual-fallback = "reject"
requeue-limit = 4
deadline = "2s"
ack-coalescing = { max-acks = 6, max-delay = "3ms" }
[subscribers.retry]
tiers = ["2s", "1m"]
max-attempts = 8
immediate-retries = 2
immediate-backoff = "10ms"
jitter = true
"#;
    let cfg = parse(src);
    assert_eq!(cfg.observability.log_level, LogLevel::Debug);
    assert_eq!(cfg.observability.log_format, LogFormat::Compact);
    assert_eq!(
        cfg.observability.log_level.as_tracing(),
        tracing::Level::DEBUG
    );
    let w = from_config(&cfg, &handlers()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(w.shutdown_deadline, Duration::from_secs(7));
    let c = &w.connection;
    assert_eq!(c.urls, ["amqp://app:s3cret@rabbit:5672/orders"]);
    assert_eq!(c.heartbeat, Duration::from_secs(3));
    assert_eq!(c.connect_timeout, Duration::from_secs(4));
    assert_eq!(c.max_backoff, Duration::from_secs(9));
    assert_eq!(c.order, crate::NodeOrder::InOrder);
    let p = &w.publisher;
    assert_eq!((p.max_in_flight, p.channels, p.max_body), (7, 2, 1000));
    assert_eq!(p.confirm_timeout, Duration::from_secs(11));
    let s = &w.subscribers[0];
    assert_eq!(s.handler_name(), "jobs-v2");
    assert_eq!(s.queue(), "jobs");
    assert_eq!(s.mode, TopologyMode::Validate);
    assert_eq!(
        s.topology.management,
        Some(crate::topology::ManagementUrl::new("http://ops:pw@rabbit:15672").allow_plain_http())
    );
    assert_eq!(s.topology.queue_type, QueueType::Quorum);
    assert_eq!(s.topology.delivery_limit, 9);
    assert_eq!(s.topology.tier_queue_type, QueueType::Classic);
    assert_eq!(s.topology.exchange_kind, "direct");
    assert_eq!(
        s.topology.bindings,
        [Binding {
            exchange: "work".into(),
            routing_key: "job".into()
        }]
    );
    assert_eq!((s.prefetch, s.concurrency), (12, 3));
    assert_eq!(s.policy, AckPolicy::Manual);
    assert_eq!(s.fallback, ManualFallback::Reject);
    assert_eq!(s.requeue_limit, 4);
    assert_eq!(s.effective_deadline(), Some(Duration::from_secs(2)));
    assert_eq!(
        s.ack_coalescing,
        Some(crate::AckCoalescing::new(6, Duration::from_millis(3)))
    );
    assert_eq!(
        s.retry,
        RetryPolicy {
            tiers: vec![Duration::from_secs(2), Duration::from_secs(60)],
            max_attempts: 8,
            immediate_retries: 2,
            immediate_backoff: Duration::from_millis(10),
            jitter: true,
            kinds: Default::default(),
        }
    );
}

#[test]
fn a_retry_table_overrides_only_the_keys_it_gives() {
    let tiers = [Duration::from_millis(200), Duration::from_secs(5)];
    let registered = Subscriber::new("ignored", ok).retry(
        RetryPolicy::new(tiers)
            .max_attempts(3)
            .immediate_retries(1)
            .on_kind("timeout", crate::kind::KindPolicy::park()),
    );
    let h = Handlers::new().subscriber("greet", registered);
    // `max-attempts` alone: the registered tiers, immediate retries and kinds stay.
    let src = format!("{MINIMAL}[subscribers.retry]\nmax-attempts = 8\n");
    let w = from_config(&parse(&src), &h).unwrap_or_else(|e| panic!("{e}"));
    let r = &w.subscribers[0].retry;
    assert_eq!(r.tiers, tiers, "tiers left out keep the registered ones");
    assert_eq!(r.max_attempts, 8);
    assert_eq!(r.immediate_retries, 1);
    assert!(r.kinds.contains_key("timeout"));
    // A kind given is added to the registered ones; tiers given replace them.
    let src = format!(
        "{MINIMAL}[subscribers.retry]\ntiers = [\"1m\"]\n[subscribers.retry.kinds.decode]\npark = true\n"
    );
    let w = from_config(&parse(&src), &h).unwrap_or_else(|e| panic!("{e}"));
    let r = &w.subscribers[0].retry;
    assert_eq!(r.tiers, [Duration::from_secs(60)]);
    assert_eq!(
        r.max_attempts, 3,
        "max-attempts left out keeps the registered 3"
    );
    assert_eq!(
        r.kinds.keys().collect::<Vec<_>>(),
        ["decode", "timeout"],
        "kinds are merged"
    );
    // A zero limit given is still refused at its key.
    let (key, ..) = file_error(&format!("{MINIMAL}[subscribers.retry]\nmax-attempts = 0\n"));
    assert_eq!(key, "subscribers[0].retry.max-attempts");
}

#[test]
fn keys_left_out_keep_the_registered_subscribers_settings() {
    let registered = Subscriber::new("ignored", ok)
        .retry(RetryPolicy::none())
        .prefetch(7)
        .bind("shop", "order.*");
    let h = Handlers::new().subscriber("greet", registered);
    let w = from_config(&parse(MINIMAL), &h).unwrap_or_else(|e| panic!("{e}"));
    let s = &w.subscribers[0];
    assert_eq!(s.queue(), "greetings", "the queue is the config's");
    assert_eq!(s.retry, RetryPolicy::none());
    assert_eq!(s.prefetch, 7);
    assert_eq!(s.topology.bindings.len(), 1);
    let cfg = parse(&format!("{MINIMAL}prefetch = 3\nbindings = []\n"));
    let w = from_config(&cfg, &h).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(w.subscribers[0].prefetch, 3);
    assert!(w.subscribers[0].topology.bindings.is_empty());
}

#[test]
fn one_handler_serves_several_queues() {
    let src = format!(
        "{MINIMAL}\n[[subscribers]]\nhandler = \"greet\"\nqueue = \"welcomes\"\nprefetch = 2\n"
    );
    let w = build(&src);
    let names: Vec<_> = w.subscribers.iter().map(|s| s.handler_name()).collect();
    assert_eq!(names, ["greetings", "welcomes"]);
    assert_eq!(w.subscribers[1].prefetch, 2);
    assert_eq!(
        w.subscribers[0].prefetch,
        crate::subscriber::DEFAULT_PREFETCH
    );
}

#[test]
fn http_listen_reaches_the_worker_or_is_refused_without_the_feature() {
    let src = MINIMAL.replace(
        "[[sub",
        "[observability]\nhttp-listen = \"127.0.0.1:9464\"\n[[sub",
    );
    let r = WorkerConfig::from_toml(&src);
    #[cfg(feature = "http")]
    {
        let cfg = r.unwrap_or_else(|e| panic!("{e}"));
        let w = from_config(&cfg, &handlers()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(w.http, "127.0.0.1:9464".parse().ok());
    }
    #[cfg(not(feature = "http"))]
    match r {
        Err(Error::ConfigFile {
            key, line, message, ..
        }) => {
            assert_eq!((key.as_str(), line), ("observability.http-listen", 6));
            assert!(message.contains("`http` cargo feature"), "{message}");
        }
        other => panic!("expected a ConfigFile error, got {other:?}"),
    }
    let (key, ..) = file_error(&src.replace("127.0.0.1:9464", "localhost"));
    assert_eq!(key, "observability.http-listen");
}

#[test]
fn parking_depth_interval_reaches_the_worker() {
    let src = MINIMAL.replace(
        "[[sub",
        "[observability]\nparking-depth-interval = \"15s\"\n[[sub",
    );
    let cfg = WorkerConfig::from_toml(&src).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        cfg.observability.parking_depth_interval,
        Some(std::time::Duration::from_secs(15))
    );
    let w = from_config(&cfg, &handlers()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(w.parking_depth, Some(std::time::Duration::from_secs(15)));
    let off = from_config(
        &WorkerConfig::from_toml(MINIMAL).unwrap_or_else(|e| panic!("{e}")),
        &handlers(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(off.parking_depth, None, "off by default");
    let (key, ..) = file_error(&src.replace("15s", "fifteen"));
    assert_eq!(key, "observability.parking-depth-interval");
}

#[test]
fn a_settle_handler_needs_manual_ack() {
    async fn manual(s: crate::Settle) -> crate::Outcome {
        let _ = s.ack().await;
        crate::Outcome::Settled
    }
    let h = Handlers::new().handler("greet", manual);
    let err = from_config(&parse(MINIMAL), &h)
        .err()
        .unwrap_or_else(|| panic!("a Settle handler under ack = auto must be refused"));
    assert!(err.to_string().contains("Settle"), "{err}");
    let cfg = parse(&format!("{MINIMAL}ack = \"manual\"\n"));
    let _worker = from_config(&cfg, &h).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn topology_modes_parse_and_a_management_url_needs_validate_or_adopt() {
    let src = |mode: &str, url: &str| {
        format!(
            "[connection]\nurl = \"amqp://localhost\"\n[topology]\nmode = \"{mode}\"\n{url}\n\
             [[subscribers]]\nhandler = \"greet\"\nqueue = \"greetings\"\n"
        )
    };
    let adopt = build(&src("adopt", ""));
    assert_eq!(adopt.subscribers[0].mode, TopologyMode::Adopt);
    assert!(adopt.subscribers[0].topology.management.is_none());
    let url = "management-url = \"http://localhost:15672\"";
    let with = build(&src("adopt", url));
    assert!(with.subscribers[0].topology.management.is_some());
    let ignored = from_config(&parse(&src("declare", url)), &handlers()).err();
    assert!(
        matches!(&ignored, Some(Error::Config(m)) if m.contains("management-url")),
        "{ignored:?}"
    );
    let https = from_config(
        &parse(&src("validate", "management-url = \"https://h\"")),
        &handlers(),
    );
    if cfg!(feature = "tls") {
        assert!(https.is_ok(), "{:?}", https.err());
    } else {
        let err = https.err();
        assert!(
            matches!(&err, Some(Error::HttpsUnavailable { .. })),
            "{err:?}"
        );
    }
    assert!(WorkerConfig::from_toml(&src("adopted", "")).is_err());
}
