use std::time::Duration;

use super::*;
use crate::extract::Body;
use crate::policy::{AckPolicy, ManualFallback};
use crate::retry::RetryStep;
use crate::subscriber::Subscriber;
use crate::topology::{Binding, QueueType, TopologyMode};
use crate::worker::{Worker, from_config};
use crate::{Error, RetryPolicy};

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
fn a_kind_policy_that_contradicts_itself_is_refused_at_load() {
    let src = format!(
        "{MINIMAL}\n[subscribers.retry]\ntiers = [\"1s\"]\n\n[subscribers.retry.kinds.bad]\npark = true\nmax-attempts = 2\n"
    );
    let (key, _, _, message) = file_error(&src);
    assert_eq!(key, "subscribers[0].retry.kinds");
    assert!(
        message.contains("\"bad\"") && message.contains("park"),
        "{message}"
    );
    let unknown = format!(
        "{MINIMAL}\n[subscribers.retry]\ntiers = []\n\n[subscribers.retry.kinds.x]\nprk = true\n"
    );
    assert!(
        WorkerConfig::from_toml(&unknown).is_err(),
        "unknown key in a kind"
    );
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
fn unknown_key_names_the_key_its_line_and_column() {
    let src = MINIMAL.replace(
        "queue = \"greetings\"",
        "queue = \"greetings\"\n  prefetc = 5",
    );
    let (key, line, column, message) = file_error(&src);
    assert_eq!(key, "subscribers[0].prefetc");
    assert_eq!((line, column), (8, 3));
    assert!(message.contains("unknown field `prefetc`"), "{message}");

    let src = MINIMAL.replace("url =", "password = \"x\"\nurl =");
    let (key, line, column, _) = file_error(&src);
    assert_eq!((key.as_str(), line, column), ("connection.password", 3, 1));

    let src = format!("{MINIMAL}bindings = [{{ exchange = \"x\", routing = \"k\" }}]\n");
    let (key, line, ..) = file_error(&src);
    assert_eq!((key.as_str(), line), ("subscribers[0].bindings.routing", 8));
}

#[test]
fn bad_durations_and_zero_prefetch_are_located() {
    let (key, line, column, message) = file_error(&format!("{MINIMAL}deadline = \"soon\"\n"));
    assert_eq!(
        (key.as_str(), line, column),
        ("subscribers[0].deadline", 8, 12)
    );
    assert!(
        message.contains("soon") || message.contains("duration"),
        "{message}"
    );

    let (key, _, _, message) = file_error(&format!("{MINIMAL}prefetch = 0\n"));
    assert_eq!(key, "subscribers[0].prefetch");
    assert!(message.contains("nonzero"), "{message}");
    let (key, ..) = file_error(&format!("{MINIMAL}concurrency = 0\n"));
    assert_eq!(key, "subscribers[0].concurrency");
    let (key, ..) = file_error(&format!("{MINIMAL}prefetch = 70000\n"));
    assert_eq!(key, "subscribers[0].prefetch");

    let (key, line, ..) = file_error(&format!(
        "{MINIMAL}[subscribers.retry]\ntiers = [\"1s\",\n  \"later\"]\n"
    ));
    assert_eq!((key.as_str(), line), ("subscribers[0].retry.tiers", 9));
    let (key, line, ..) = file_error(&format!(
        "{MINIMAL}[subscribers.retry]\ntiers = [\"1s\"]\nmax-attempts = 0\n"
    ));
    assert_eq!(
        (key.as_str(), line),
        ("subscribers[0].retry.max-attempts", 10)
    );
    let (key, ..) = file_error(&format!("{MINIMAL}[subscribers.retry]\ntiers = [\"0s\"]\n"));
    assert_eq!(key, "subscribers[0].retry.tiers");
    let (key, ..) = file_error(&MINIMAL.replace("[[sub", "[publisher]\nchannels = 0\n[[sub"));
    assert_eq!(key, "publisher.channels");
    let (key, ..) = file_error(&MINIMAL.replace("[[sub", "[publisher]\nmax-in-flight = 0\n[[sub"));
    assert_eq!(key, "publisher.max-in-flight");
    let (key, ..) = file_error(&format!("{MINIMAL}ack = \"sometimes\"\n"));
    assert_eq!(key, "subscribers[0].ack");
}

#[test]
fn bad_ack_coalescing_is_located() {
    let (key, line, ..) = file_error(&format!(
        "{MINIMAL}ack-coalescing = {{ max-acks = 0, max-delay = \"5ms\" }}\n"
    ));
    assert_eq!(
        (key.as_str(), line),
        ("subscribers[0].ack-coalescing.max-acks", 8)
    );
    let (key, _, _, message) = file_error(&format!(
        "{MINIMAL}prefetch = 10\nack-coalescing = {{ max-acks = 11, max-delay = \"5ms\" }}\n"
    ));
    assert_eq!(key, "subscribers[0].ack-coalescing.max-acks");
    assert!(message.contains("prefetch (10)"), "{message}");
    let (key, ..) = file_error(&format!(
        "{MINIMAL}ack-coalescing = {{ max-acks = 8, max-delay = \"2s\" }}\n"
    ));
    assert_eq!(key, "subscribers[0].ack-coalescing.max-delay");
    let (key, _, _, message) = file_error(&format!(
        "{MINIMAL}ack-coalescing = {{ max-acks = 8, delay = \"2ms\" }}\n"
    ));
    assert!(key.starts_with("subscribers[0].ack-coalescing"), "{key}");
    assert!(message.contains("delay"), "{message}");
    // Against the registered subscriber's prefetch (50) when the file leaves it out, and
    // never with ack-first.
    let over = parse(&format!(
        "{MINIMAL}ack-coalescing = {{ max-acks = 51, max-delay = \"5ms\" }}\n"
    ));
    let err = from_config(&over, &handlers()).err().map(|e| e.to_string());
    assert!(
        err.as_deref().is_some_and(|e| e.contains("prefetch (50)")),
        "{err:?}"
    );
    let first = parse(&format!(
        "{MINIMAL}ack = \"ack-first\"\nack-coalescing = {{ max-acks = 8, max-delay = \"5ms\" }}\n"
    ));
    let err = from_config(&first, &handlers())
        .err()
        .map(|e| e.to_string());
    assert!(
        err.as_deref().is_some_and(|e| e.contains("ack-first")),
        "{err:?}"
    );
}

#[test]
fn bad_url_is_typed_and_never_shows_the_password() {
    let src = MINIMAL.replace(
        "amqp://app:s3cret@rabbit:5672/%2f",
        "http://app:s3cret@rabbit/x",
    );
    let err = WorkerConfig::from_toml(&src).err().map(|e| e.to_string());
    let err = err.unwrap_or_default();
    assert!(
        err.contains("connection.url") && err.contains("line 3"),
        "{err}"
    );
    assert!(!err.contains("s3cret"), "{err}");
    // A password shown by a type error elsewhere is scrubbed too.
    let src = format!("{MINIMAL}prefetch = \"amqp://app:s3cret@h\"\n");
    let (_, _, _, message) = file_error(&src);
    assert!(!message.contains("s3cret"), "{message}");
    let debug = format!("{:?}", parse(MINIMAL).connection);
    assert!(
        !debug.contains("s3cret") && debug.contains("app:***@"),
        "{debug}"
    );
}

#[test]
fn tls_must_agree_with_the_url_and_the_feature() {
    let (key, ..) = file_error(&MINIMAL.replace("%2f\"", "%2f\"\ntls = true"));
    assert_eq!(key, "connection.tls");
    let src = MINIMAL.replace("amqp://", "amqps://");
    let (key, _, _, message) = file_error(&src);
    assert_eq!(key, "connection.tls");
    assert!(message.contains("tls = true"), "{message}");
    let src = MINIMAL
        .replace("amqp://", "amqps://")
        .replace("%2f\"", "%2f\"\ntls = true");
    let r = WorkerConfig::from_toml(&src);
    if cfg!(feature = "tls") {
        assert!(r.is_ok(), "{r:?}");
    } else {
        let msg = r.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains("`tls` cargo feature"), "{msg}");
    }
}

#[test]
fn tls_settings_parse_as_a_table_and_agree_with_the_url() {
    let src = MINIMAL.replace("amqp://", "amqps://").replace(
        "%2f\"",
        "%2f\"\n[connection.tls]\nca-file = \"/etc/rk/ca.pem\"\ncert-file = \"c.pem\"\nkey-file = \"k.pem\"\nserver-name = \"rabbit.test\"",
    );
    let r = WorkerConfig::from_toml(&src);
    if !cfg!(feature = "tls") {
        // Refused, not parsed and ignored.
        let msg = r.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            msg.contains("connection.tls") && msg.contains("`tls` cargo feature"),
            "{msg}"
        );
        return;
    }
    let cfg = r.unwrap_or_else(|e| panic!("{e}"));
    let want = crate::connection::TlsConfig::new()
        .ca_file("/etc/rk/ca.pem")
        .client_cert("c.pem", "k.pem")
        .server_name("rabbit.test");
    assert_eq!(cfg.connection.tls.as_ref(), Some(&want));
    assert_eq!(cfg.connection.to_connection_config().tls, Some(want));
    // A certificate without its key, an unknown key, settings on amqp:// URLs.
    let (key, _, _, message) = file_error(&src.replace("key-file = \"k.pem\"\n", ""));
    assert_eq!(key, "connection.tls");
    assert!(message.contains("key-file"), "{message}");
    let (key, ..) = file_error(&src.replace("ca-file", "ca-path"));
    assert!(key.starts_with("connection.tls"), "{key}");
    let (key, ..) = file_error(&src.replace("amqps://", "amqp://"));
    assert_eq!(key, "connection.tls");
}

#[test]
fn tls_environment_variables_override_the_file() {
    let src = MINIMAL
        .replace("amqp://", "amqps://")
        .replace("%2f\"", "%2f\"\ntls = true");
    if !cfg!(feature = "tls") {
        // Refused at parse (tls_settings_parse_as_a_table_and_agree_with_the_url).
        return;
    }
    let mut cfg = parse(&src);
    cfg.override_from_env(|k| match k {
        "RABBITKIT_TLS_CA_FILE" => Some("/run/ca.pem".into()),
        "RABBITKIT_TLS_SERVER_NAME" => Some("rabbit.test".into()),
        _ => None,
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let tls = cfg.connection.tls.clone().unwrap_or_default();
    assert_eq!(
        tls.ca_file.as_deref(),
        Some(std::path::Path::new("/run/ca.pem"))
    );
    assert_eq!(tls.server_name.as_deref(), Some("rabbit.test"));
    // A half client certificate is refused, naming the variable; nothing changes.
    let err = cfg
        .override_from_env(|k| (k == "RABBITKIT_TLS_CERT_FILE").then(|| "c.pem".into()))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("RABBITKIT_TLS_CERT_FILE") && err.contains("key-file"),
        "{err}"
    );
    assert_eq!(cfg.connection.tls, Some(tls));
}

#[test]
fn rabbitkit_url_overrides_the_file_and_is_checked() {
    let mut cfg = parse(MINIMAL);
    let env = |url: &'static str| move |k: &str| (k == URL_ENV).then(|| url.to_owned());
    cfg.override_from_env(env("amqp://u:pw@other:5673/v"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(cfg.connection.urls, ["amqp://u:pw@other:5673/v"]);
    let w = from_config(&cfg, &handlers()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(w.connection.urls, ["amqp://u:pw@other:5673/v"]);
    cfg.override_from_env(|_| None)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        cfg.connection.urls,
        ["amqp://u:pw@other:5673/v"],
        "no variable, no change"
    );

    let err = cfg.override_from_env(env("ftp://u:hunter2@h")).err();
    let Some(Error::InvalidUrl { reason }) = err else {
        panic!("expected InvalidUrl, got {err:?}");
    };
    assert!(
        reason.contains(URL_ENV) && !reason.contains("hunter2"),
        "{reason}"
    );
    let err = cfg.override_from_env(env("amqps://u:hunter2@h/v")).err();
    let reason = err.map(|e| e.to_string()).unwrap_or_default();
    assert!(
        reason.contains("tls") && !reason.contains("hunter2"),
        "{reason}"
    );
    assert_eq!(
        cfg.connection.urls,
        ["amqp://u:pw@other:5673/v"],
        "a refused URL changes nothing"
    );
}

#[test]
fn unknown_handler_names_it_and_the_registered_ones() {
    let cfg = parse(&MINIMAL.replace("\"greet\"", "\"gret\""));
    match from_config(&cfg, &handlers()) {
        Err(Error::UnknownHandler { name, registered }) => {
            assert_eq!(name, "gret");
            assert_eq!(registered, ["flaky", "greet", "orders"]);
        }
        other => panic!("expected UnknownHandler, got {other:?}"),
    }
    let msg = from_config(&cfg, &handlers()).err().map(|e| e.to_string());
    assert_eq!(
        msg.as_deref(),
        Some(r#"no handler named "gret" is registered (registered: flaky, greet, orders)"#)
    );
}

#[test]
fn duplicate_names_missing_subscribers_and_bad_queues_are_refused() {
    let (key, line, ..) = file_error(&format!(
        "{MINIMAL}{}",
        &MINIMAL[MINIMAL.find("[[").unwrap_or(0)..]
    ));
    assert_eq!((key.as_str(), line), ("subscribers[1].queue", 10));
    let (key, ..) = file_error("subscribers = []\n[connection]\nurl = \"amqp://h/v\"\n");
    assert_eq!(key, "subscribers");
    let (key, ..) = file_error("[connection]\nurl = \"amqp://h/v\"\n");
    assert_eq!(key, "subscribers");
    let (key, ..) = file_error(&MINIMAL.replace("queue = \"greetings\"", ""));
    assert_eq!(key, "subscribers[0].queue");
    let cfg = parse(&MINIMAL.replace("\"greetings\"", "\"\""));
    assert!(matches!(
        from_config(&cfg, &handlers()),
        Err(Error::InvalidName { .. })
    ));
    let twice = Handlers::new().handler("greet", ok).handler("greet", ok);
    let msg = from_config(&parse(MINIMAL), &twice)
        .err()
        .map(|e| e.to_string());
    assert!(msg.unwrap_or_default().contains("registered twice"));
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
fn load_reads_the_file_then_the_environment() {
    let path = std::env::temp_dir().join(format!("rabbitkit-load-{}.toml", std::process::id()));
    std::fs::write(&path, MINIMAL).unwrap_or_else(|e| panic!("{e}"));
    let cfg = WorkerConfig::load(&path).unwrap_or_else(|e| panic!("{e}"));
    let _ = std::fs::remove_file(&path);
    // The test environment may set RABBITKIT_URL; either way it wins over the file.
    let want =
        std::env::var(URL_ENV).unwrap_or_else(|_| "amqp://app:s3cret@rabbit:5672/%2f".into());
    assert_eq!(cfg.connection.urls.join(","), want);
    assert_eq!(cfg.subscribers[0].queue, "greetings");
    let err = WorkerConfig::load(&path).err().map(|e| e.to_string());
    assert!(
        err.unwrap_or_default().contains("cannot read"),
        "a missing file is named"
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
fn a_node_list_and_its_order_reach_the_worker() {
    let src = MINIMAL.replace(
        "url = \"amqp://app:s3cret@rabbit:5672/%2f\"",
        "url = [\"amqp://app:s3cret@rabbit-1:5672/%2f\", \"amqp://app:s3cret@rabbit-2:5672/%2f\"]\norder = \"shuffled\"",
    );
    let w = build(&src);
    assert_eq!(
        w.connection.urls,
        [
            "amqp://app:s3cret@rabbit-1:5672/%2f",
            "amqp://app:s3cret@rabbit-2:5672/%2f"
        ]
    );
    assert_eq!(w.connection.order, crate::NodeOrder::Shuffled);
    // `urls` is the same key under its plural name.
    let plural = build(&src.replace("url = [", "urls = ["));
    assert_eq!(plural.connection.urls, w.connection.urls);
    // Both at once, an empty list, an unknown order, mixed vhosts: refused, located,
    // no password in the message.
    let both = src.replace("order =", "urls = [\"amqp://h/%2f\"]\norder =");
    let (key, ..) = file_error(&both);
    assert!(key.starts_with("connection"), "{key}");
    let (key, _, _, message) =
        file_error(&MINIMAL.replace("url = \"amqp://app:s3cret@rabbit:5672/%2f\"", "url = []"));
    assert_eq!(key, "connection.url");
    assert!(message.contains("no broker URL"), "{message}");
    let (key, ..) = file_error(&src.replace("\"shuffled\"", "\"random\""));
    assert_eq!(key, "connection.order");
    let (key, _, _, message) = file_error(&src.replace("rabbit-2:5672/%2f", "rabbit-2:5672/other"));
    assert_eq!(key, "connection.url");
    assert!(
        message.contains("same vhost") && !message.contains("s3cret"),
        "{message}"
    );
}

#[test]
fn rabbitkit_url_may_list_several_nodes() {
    let mut cfg = parse(MINIMAL);
    cfg.override_from_env(|k| {
        (k == URL_ENV).then(|| "amqp://u:p@ss@one:5672/v, amqp://u:p@ss@two:5673/v".to_owned())
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        cfg.connection.urls,
        ["amqp://u:p@ss@one:5672/v", "amqp://u:p@ss@two:5673/v"]
    );
    let err = cfg
        .override_from_env(|k| {
            (k == URL_ENV).then(|| "amqp://u:hunt@r2@one/v,amqp://u:hunt@r2@two/w".to_owned())
        })
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains(URL_ENV) && err.contains("same vhost") && !err.contains("hunt"),
        "{err}"
    );
}

#[test]
fn zero_durations_and_a_zero_max_body_are_refused_with_their_key() {
    let conn = |extra: &str| {
        format!(
            "[connection]\nurl = \"amqp://app:s3cret@rabbit:5672/%2f\"\n{extra}\n\
             [[subscribers]]\nhandler = \"greet\"\nqueue = \"greetings\"\n"
        )
    };
    let (key, ..) = file_error(&conn("connect-timeout = \"0s\""));
    assert_eq!(key, "connection.connect-timeout");
    let (key, _, _, message) = file_error(&conn("max-backoff = \"0s\""));
    assert_eq!(key, "connection.max-backoff");
    assert!(message.contains("spin"), "{message}");
    let (key, ..) = file_error(&format!("{MINIMAL}deadline = \"0s\"\n"));
    assert_eq!(key, "subscribers[0].deadline");
    let publisher = |extra: &str| {
        format!(
            "[connection]\nurl = \"amqp://app:s3cret@rabbit:5672/%2f\"\n\
             [publisher]\n{extra}\n\
             [[subscribers]]\nhandler = \"greet\"\nqueue = \"greetings\"\n"
        )
    };
    let (key, ..) = file_error(&publisher("confirm-timeout = \"0s\""));
    assert_eq!(key, "publisher.confirm-timeout");
    let (key, ..) = file_error(&publisher("max-body = 0"));
    assert_eq!(key, "publisher.max-body");
}

#[test]
fn keys_the_subscriber_would_ignore_are_refused() {
    let limit = parse(&format!("{MINIMAL}delivery-limit = 5\n"));
    let err = from_config(&limit, &handlers())
        .err()
        .map(|e| e.to_string());
    assert!(
        err.as_deref()
            .is_some_and(|e| e.contains("subscribers[0].delivery-limit") && e.contains("quorum")),
        "{err:?}"
    );
    let quorum = parse(&format!(
        "{MINIMAL}queue-type = \"quorum\"\ndelivery-limit = 5\n"
    ));
    assert!(from_config(&quorum, &handlers()).is_ok());
    let fallback = parse(&format!("{MINIMAL}manual-fallback = \"reject\"\n"));
    let err = from_config(&fallback, &handlers())
        .err()
        .map(|e| e.to_string());
    assert!(
        err.as_deref()
            .is_some_and(|e| e.contains("subscribers[0].manual-fallback")),
        "{err:?}"
    );
    let manual = parse(&format!(
        "{MINIMAL}ack = \"manual\"\nmanual-fallback = \"reject\"\n"
    ));
    assert!(from_config(&manual, &handlers()).is_ok());

    // The file turning off what the registered handler's code set is refused at the file's key.
    let coded = || {
        Handlers::new().subscriber(
            "greet",
            Subscriber::new("greetings", ok)
                .queue_type(QueueType::Quorum)
                .delivery_limit(5)
                .ack_policy(AckPolicy::Manual)
                .manual_fallback(ManualFallback::Reject),
        )
    };
    assert!(from_config(&parse(MINIMAL), &coded()).is_ok());
    for (line, key) in [
        ("queue-type = \"classic\"\n", "subscribers[0].queue-type"),
        ("ack = \"auto\"\n", "subscribers[0].ack"),
    ] {
        let err = from_config(&parse(&format!("{MINIMAL}{line}")), &coded())
            .err()
            .map(|e| e.to_string());
        assert!(err.as_deref().is_some_and(|e| e.contains(key)), "{err:?}");
    }
    // The topology tool reads the file alone (the handler's code is not known there).
    let file_only = parse(&format!(
        "{MINIMAL}delivery-limit = 5\nmanual-fallback = \"reject\"\n"
    ));
    assert!(topologies(&file_only).is_ok());
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

#[test]
fn a_plain_http_management_url_to_another_host_needs_allow_plain_http() {
    let src = |topology: &str| {
        format!(
            "[connection]\nurl = \"amqp://localhost\"\n[topology]\nmode = \"validate\"\n{topology}\n\
             [[subscribers]]\nhandler = \"greet\"\nqueue = \"greetings\"\n"
        )
    };
    let remote = "management-url = \"http://ops:pw@rabbit:15672\"";
    let refused = from_config(&parse(&src(remote)), &handlers()).err();
    assert!(
        matches!(&refused, Some(Error::PlainHttpRefused { url }) if !url.contains("pw")),
        "{refused:?}"
    );
    let allowed = build(&src(&format!("{remote}\nallow-plain-http = true")));
    assert_eq!(
        allowed.subscribers[0].topology.management,
        Some(crate::topology::ManagementUrl::new("http://ops:pw@rabbit:15672").allow_plain_http())
    );
    let local = build(&src("management-url = \"http://127.0.0.1:15672\""));
    assert!(local.subscribers[0].topology.management.is_some());
    // Parsed but applying to nothing: refused, not ignored.
    let alone = from_config(&parse(&src("allow-plain-http = true")), &handlers()).err();
    assert!(
        matches!(&alone, Some(Error::Config(m)) if m.contains("allow-plain-http")),
        "{alone:?}"
    );
}
