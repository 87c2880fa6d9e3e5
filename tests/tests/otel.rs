//! OpenTelemetry spans and trace-context propagation against a real broker, exported to
//! the SDK's in-memory exporter through `tracing-opentelemetry`: publish → fail → retry →
//! success is one connected trace. Run with `--features otel`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::Value;
use opentelemetry::trace::{SpanId, SpanKind, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use rabbitkit_core::headers::Attempt;
use rabbitkit_core::observe::TraceContext;
use rabbitkit_core::{
    BoxError, ConnectionConfig, Envelope, Publisher, PublisherConfig, RetryPolicy, Subscriber,
    Worker,
};
use rabbitkit_tests::{Broker, Vhost, wait_until};
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

const WAIT: Duration = Duration::from_secs(20);

fn telemetry() -> &'static (SdkTracerProvider, InMemorySpanExporter) {
    static T: OnceLock<(SdkTracerProvider, InMemorySpanExporter)> = OnceLock::new();
    T.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("rabbitkit-tests"));
        tracing_subscriber::registry().with(layer).init();
        (provider, exporter)
    })
}

fn spans() -> Vec<SpanData> {
    let (provider, exporter) = telemetry();
    provider.force_flush().unwrap();
    exporter.get_finished_spans().unwrap()
}

fn attr<'a>(s: &'a SpanData, key: &str) -> Option<&'a Value> {
    s.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| &kv.value)
}

fn links_to(s: &SpanData, target: &SpanData) -> bool {
    s.links.links.iter().any(|l| {
        l.span_context.span_id() == target.span_context.span_id()
            && l.span_context.trace_id() == target.span_context.trace_id()
    })
}

/// Runs publish → fail once → retry → success on `queue`, in a root span `checkout`.
async fn run(vh: &Vhost, queue: &'static str, how: TraceContext) {
    let sub = Subscriber::new(queue, |a: Attempt| async move {
        if a.number == 1 {
            return Err::<(), BoxError>("stock service unavailable".into());
        }
        Ok(())
    })
    .retry(RetryPolicy::new([Duration::from_millis(100)]).max_attempts(3));
    let w = Worker::new(ConnectionConfig::new(vh.url()))
        .trace_context(how)
        .subscribe(sub)
        .start()
        .await
        .unwrap();
    let publisher =
        Publisher::new(ConnectionConfig::new(vh.url()), PublisherConfig::default()).unwrap();
    let outcome = publisher
        .publish(
            Envelope::new("", queue, b"{}".to_vec())
                .message_id(format!("{queue}-1"))
                .correlation_id("order-42"),
        )
        .instrument(tracing::info_span!("checkout", queue))
        .await
        .unwrap();
    assert!(outcome.is_confirmed(), "{outcome}");
    wait_until(WAIT, "retried, then acked", || async {
        let s = w.stats(queue).unwrap();
        (s.retried, s.acked) == (1, 2)
    })
    .await;
    w.shutdown().await;
    publisher.close(Duration::from_secs(1)).await;
}

struct Trace {
    checkout: SpanData,
    send: SpanData,
    first: SpanData,
    retry_send: SpanData,
    second: SpanData,
    settles: Vec<SpanData>,
}

fn trace_of(queue: &str) -> Trace {
    let all = spans();
    let by_name =
        |name: &str| -> Vec<SpanData> { all.iter().filter(|s| s.name == name).cloned().collect() };
    let checkout = all
        .iter()
        .find(|s| {
            s.name == "checkout" && attr(s, "queue").map(|v| v.as_str()) == Some(queue.into())
        })
        .cloned()
        .expect("the root span");
    let send = by_name("send amq.default")
        .into_iter()
        .find(|s| s.parent_span_id == checkout.span_context.span_id())
        .expect("the publisher's send span, child of the caller's span");
    let mut process = by_name(&format!("process {queue}"));
    process.sort_by_key(|s| s.start_time);
    assert_eq!(
        process.len(),
        2,
        "one process span per attempt: {process:#?}"
    );
    let first = process.remove(0);
    let second = process.remove(0);
    let retry_send = by_name(&format!("send {queue}.retry"))
        .into_iter()
        .find(|s| s.parent_span_id == first.span_context.span_id())
        .expect("the retry copy's send span, child of the failed attempt");
    let settles = by_name(&format!("settle {queue}"));
    Trace {
        checkout,
        send,
        first,
        retry_send,
        second,
        settles,
    }
}

/// Prints the spans as a tree (run with `--nocapture` to see it; docs/OBSERVABILITY.md
/// shows one).
fn print_tree(t: &Trace) {
    let short = |s: &SpanData| format!("{}", s.span_context.span_id());
    let mut all = vec![&t.checkout, &t.send, &t.first, &t.retry_send, &t.second];
    all.extend(t.settles.iter());
    all.sort_by_key(|s| s.start_time);
    let known = all.clone();
    let t0 = t.checkout.start_time;
    for s in all {
        let mut depth = 0;
        let mut parent = s.parent_span_id;
        while let Some(p) = known.iter().find(|k| k.span_context.span_id() == parent) {
            depth += 1;
            parent = p.parent_span_id;
        }
        let links: Vec<String> = s
            .links
            .links
            .iter()
            .map(|l| format!("{}", l.span_context.span_id()))
            .collect();
        println!(
            "{:indent$}{} [{:?}] trace={} span={} parent={}{} +{}ms",
            "",
            s.name,
            s.span_kind,
            &s.span_context.trace_id().to_string()[..8],
            short(s),
            s.parent_span_id,
            if links.is_empty() {
                String::new()
            } else {
                format!(" links={}", links.join(","))
            },
            s.start_time
                .duration_since(t0)
                .unwrap_or_default()
                .as_millis(),
            indent = depth * 2
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn process_spans_link_to_the_producer_and_retries_carry_the_failed_attempt() {
    telemetry();
    let vh = Broker::from_env().vhost("otel-link");
    run(&vh, "linked", TraceContext::Link).await;
    let t = trace_of("linked");
    print_tree(&t);

    assert_eq!(t.send.span_kind, SpanKind::Producer);
    assert_eq!(
        attr(&t.send, "messaging.operation.type"),
        Some(&"send".into())
    );
    assert_eq!(
        attr(&t.send, "messaging.message.id"),
        Some(&"linked-1".into())
    );
    assert_eq!(
        attr(&t.send, "messaging.message.conversation_id"),
        Some(&"order-42".into())
    );

    // Attempt 1: a CONSUMER span of its own trace, linked to the producer's send span.
    let p1 = &t.first;
    assert_eq!(p1.span_kind, SpanKind::Consumer);
    assert!(
        links_to(p1, &t.send),
        "attempt 1 links to the send span: {:?}",
        p1.links
    );
    assert_eq!(p1.parent_span_id, SpanId::INVALID, "a new root");
    assert_ne!(
        p1.span_context.trace_id(),
        t.checkout.span_context.trace_id()
    );
    for (k, v) in [
        ("messaging.system", Value::from("rabbitmq")),
        ("messaging.operation.name", "process".into()),
        ("messaging.operation.type", "process".into()),
        ("messaging.destination.name", "linked".into()),
        (
            "messaging.rabbitmq.destination.routing_key",
            "linked".into(),
        ),
        ("messaging.message.id", "linked-1".into()),
        ("messaging.message.conversation_id", "order-42".into()),
        ("server.address", "127.0.0.1".into()),
        ("error.type", "error".into()),
        ("rabbitkit.outcome", "retry".into()),
    ] {
        assert_eq!(attr(p1, k), Some(&v), "{k} on {p1:#?}");
    }
    assert_eq!(
        attr(p1, "messaging.message.body.size"),
        Some(&Value::I64(2))
    );
    assert!(attr(p1, "messaging.rabbitmq.message.delivery_tag").is_some());
    assert_eq!(
        attr(p1, "server.port"),
        Some(&Value::I64(
            vh.broker.amqp.rsplit(':').next().unwrap().parse().unwrap()
        ))
    );

    // The retry copy is sent from inside attempt 1 and carries its context...
    assert_eq!(t.retry_send.span_kind, SpanKind::Producer);
    assert_eq!(
        t.retry_send.span_context.trace_id(),
        p1.span_context.trace_id()
    );
    // ... so attempt 2 links to it: one chain from the publish to the success.
    let p2 = &t.second;
    assert!(
        links_to(p2, &t.retry_send),
        "attempt 2 links to the retry send: {:?}",
        p2.links
    );
    assert_eq!(attr(p2, "rabbitkit.outcome"), Some(&"ack".into()));
    assert_eq!(attr(p2, "error.type"), None);

    // Each original is settled once, by an ack (CLIENT span under its process span).
    let acks: Vec<_> = t
        .settles
        .iter()
        .filter(|s| attr(s, "messaging.operation.name") == Some(&"ack".into()))
        .collect();
    assert_eq!(acks.len(), 2, "{:#?}", t.settles);
    for s in &acks {
        assert_eq!(s.span_kind, SpanKind::Client);
        assert_eq!(attr(s, "messaging.operation.type"), Some(&"settle".into()));
    }
    assert!(
        acks.iter()
            .any(|s| s.parent_span_id == p1.span_context.span_id())
    );
    assert!(
        acks.iter()
            .any(|s| s.parent_span_id == p2.span_context.span_id())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_parent_mode_publish_fail_retry_success_is_one_trace() {
    telemetry();
    let vh = Broker::from_env().vhost("otel-parent");
    run(&vh, "parented", TraceContext::Parent).await;
    let t = trace_of("parented");
    print_tree(&t);
    let trace = t.checkout.span_context.trace_id();
    for s in [&t.send, &t.first, &t.retry_send, &t.second] {
        assert_eq!(
            s.span_context.trace_id(),
            trace,
            "{} in the caller's trace",
            s.name
        );
    }
    assert_eq!(t.first.parent_span_id, t.send.span_context.span_id());
    assert!(t.first.parent_span_is_remote);
    assert_eq!(t.retry_send.parent_span_id, t.first.span_context.span_id());
    assert_eq!(t.second.parent_span_id, t.retry_send.span_context.span_id());
    assert!(
        links_to(&t.second, &t.retry_send),
        "the link is kept in parent mode too"
    );
}
