//! What a worker file is refused for, each mistake named by its key (and line and column
//! where the file has them), before anything connects.

use super::*;

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
