//! Several nodes: a worker starts on the first reachable one, fails over to the next when
//! its node goes, re-declares and resumes there, never acks a tag of the old channel;
//! publishes pending on a dying connection fail at once; access refusals fail fast; the
//! connect timeout is honoured. Node A is a private node (instance 5); node B is the shared
//! node of the same version, behind a proxy the test controls.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lapin::BasicProperties;
use rabbitkit_core::extract::Body;
use rabbitkit_core::{
    BoxError, ConnectionConfig, Envelope, Error, Permanent, PublishOutcome, Publisher,
    PublisherConfig, RetryPolicy, Subscriber, Worker,
};
use rabbitkit_tests::proxy::{Mode, Proxy};
use rabbitkit_tests::{Broker, wait_until};

const WAIT: Duration = Duration::from_secs(30);

/// Runs `undo` when dropped, also when the test fails: a stopped node is started again.
struct Undo<F: FnMut()>(F);

impl<F: FnMut()> Drop for Undo<F> {
    fn drop(&mut self) {
        (self.0)();
    }
}

/// A local port nothing listens on.
fn dead_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// Handles `ok*` at once, `slow*` in 5 s, parks `park*` (permanent failure).
fn recording_subscriber(seen: Arc<Mutex<Vec<String>>>, started: Arc<AtomicU32>) -> Subscriber {
    Subscriber::new("orders", move |Body(b): Body| {
        let seen = seen.clone();
        let started = started.clone();
        async move {
            let body = String::from_utf8_lossy(&b).into_owned();
            started.fetch_add(1, Ordering::SeqCst);
            if body.starts_with("slow") {
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
            if body.starts_with("park") {
                return Err(Permanent::new("refused for good").into());
            }
            seen.lock().unwrap().push(body);
            Ok::<_, BoxError>(())
        }
    })
    .retry(RetryPolicy::new([Duration::from_millis(200)]).max_attempts(2))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_given_a_dead_node_first_starts_on_the_next() {
    let vh = Broker::from_env().vhost("nodes-dead");
    let dead = format!("amqp://guest:guest@127.0.0.1:{}/{}", dead_port(), vh.name);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let t0 = Instant::now();
    let w = Worker::new(ConnectionConfig::nodes([dead, vh.url()]))
        .shutdown_deadline(Duration::from_secs(5))
        .subscribe(recording_subscriber(seen.clone(), Arc::default()))
        .start()
        .await
        .unwrap_or_else(|e| panic!("start: {e}"));
    let took = t0.elapsed();
    vh.publish_raw("", "orders", b"ok-1", BasicProperties::default())
        .await;
    wait_until(WAIT, "ok-1 handled on the live node", || async {
        seen.lock().unwrap().len() == 1
    })
    .await;
    assert!(w.is_ready());
    let r = w.shutdown().await;
    assert_eq!(r.subscribers["orders"].acked, 1);
    eprintln!("started on the second node after {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_fails_over_to_the_next_node_redeclares_and_resumes_without_stale_acks() {
    let a = Broker::private(5);
    let b = Broker::from_env();
    let vh_a = a.vhost("nodes-failover");
    let vh_b = b.vhost_named(&vh_a.name);
    // Node B through a proxy: refused until the test opens it, so "not ready" is seen.
    let proxy_b = Proxy::start(&vh_b.hostport(), Mode::Refuse).await;
    let url_b = proxy_b.url("guest:guest", &vh_a.name);
    let mut cfg = ConnectionConfig::nodes([vh_a.url(), url_b]);
    cfg.max_backoff = Duration::from_millis(500);
    cfg.connect_timeout = Duration::from_secs(3);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let started = Arc::new(AtomicU32::new(0));
    let w = Worker::new(cfg)
        .shutdown_deadline(Duration::from_secs(5))
        .subscribe(recording_subscriber(seen.clone(), started.clone()))
        .start()
        .await
        .unwrap_or_else(|e| panic!("start: {e}"));
    wait_until(WAIT, "ready on A", || async { w.is_ready() }).await;
    assert_eq!(
        vh_b.try_depth("orders").await,
        None,
        "nothing declared on B yet"
    );
    for i in 0..3 {
        vh_a.publish_raw(
            "",
            "orders",
            format!("ok-a{i}").as_bytes(),
            Default::default(),
        )
        .await;
    }
    wait_until(WAIT, "3 handled on A", || async {
        seen.lock().unwrap().len() == 3
    })
    .await;
    // Two deliveries in their handlers when node A goes: their acks must not reach any
    // other channel.
    for i in 0..2 {
        vh_a.publish_raw(
            "",
            "orders",
            format!("slow-a{i}").as_bytes(),
            Default::default(),
        )
        .await;
    }
    wait_until(WAIT, "both slow handlers started", || async {
        started.load(Ordering::SeqCst) == 5
    })
    .await;

    let stop = a.clone();
    tokio::task::spawn_blocking(move || stop.ctl(&["stop_app"]))
        .await
        .unwrap();
    let restart = a.clone();
    let mut guard = Some(Undo(move || {
        restart.ctl(&["start_app"]);
    }));
    {
        wait_until(WAIT, "not ready while no node is reachable", || async {
            !w.is_ready()
        })
        .await;
        // The slow handlers finish against a dead channel: ack lost, not sent elsewhere.
        wait_until(WAIT, "two acks found their channel gone", || async {
            w.stats("orders").unwrap().ack_lost == 2
        })
        .await;
        proxy_b.set(Mode::Forward);
        wait_until(WAIT, "ready again on node B", || async { w.is_ready() }).await;
        assert_eq!(
            vh_b.try_depth("orders").await,
            Some(0),
            "the topology was declared on B"
        );
        assert!(vh_b.try_depth("orders.parking").await.is_some());
        for i in 0..3 {
            vh_b.publish_raw(
                "",
                "orders",
                format!("ok-b{i}").as_bytes(),
                Default::default(),
            )
            .await;
        }
        vh_b.publish_raw("", "orders", b"park-b", Default::default())
            .await;
        wait_until(WAIT, "3 handled on B", || async {
            seen.lock()
                .unwrap()
                .iter()
                .filter(|s| s.starts_with("ok-b"))
                .count()
                == 3
        })
        .await;
        wait_until(WAIT, "the parking copy published on B", || async {
            vh_b.try_depth("orders.parking").await == Some(1)
        })
        .await;
        // The copy is in the parking queue before the worker has its confirm and acks
        // the original.
        wait_until(WAIT, "the parked original acked", || async {
            w.stats("orders").unwrap().acked >= 7
        })
        .await;
        let s = w.stats("orders").unwrap();
        assert_eq!(s.ack_lost, 2, "only the two stale deliveries: {s:?}");
        assert_eq!(s.settlement_failures, 0, "{s:?}");
        assert_eq!(s.parked, 1, "{s:?}");
        assert_eq!(s.acked, 3 + 3 + 1, "{s:?}");
        assert_eq!(vh_b.depth("orders").await, 0);
    }
    let guard = guard.take();
    tokio::task::spawn_blocking(move || drop(guard))
        .await
        .unwrap();
    let _ = w.shutdown().await;
    // The stale deliveries were never acked: node A still holds them.
    wait_until(WAIT, "node A back with both slow deliveries", || async {
        vh_a.try_depth("orders").await == Some(2)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn publishes_pending_when_the_connection_dies_fail_at_once() {
    let vh = Broker::from_env().vhost("nodes-pending");
    vh.declare_queue("sink", Default::default()).await;
    let proxy = Proxy::start(&vh.hostport(), Mode::Forward).await;
    let confirm_timeout = Duration::from_secs(30);
    let p = Publisher::new(
        ConnectionConfig::new(proxy.url("guest:guest", &vh.name)),
        PublisherConfig {
            confirm_timeout,
            ..Default::default()
        },
    )
    .unwrap();
    p.connect().await.unwrap();
    assert!(
        p.publish(Envelope::new("", "sink", "warm-up"))
            .await
            .unwrap()
            .is_confirmed()
    );
    // Confirms stop arriving; 50 publishes are written and wait.
    proxy.set(Mode::Freeze);
    let mut pending = Vec::new();
    for i in 0..50 {
        pending.push(
            p.send(Envelope::new("", "sink", format!("m{i}")))
                .await
                .unwrap(),
        );
    }
    let waiting: Vec<_> = pending
        .into_iter()
        .map(|c| tokio::spawn(async move { (c.await, Instant::now()) }))
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let unresolved = waiting.iter().filter(|j| !j.is_finished()).count();
    assert_eq!(
        unresolved, 50,
        "every publish is still pending when the fault strikes"
    );
    assert_eq!(p.in_flight(), 50);
    assert_eq!(p.stats().unconfirmed, 50, "all 50 written, none resolved");
    let cut_at = Instant::now();
    proxy.cut();
    let mut latest = Duration::ZERO;
    for j in waiting {
        let (outcome, at) = j.await.unwrap();
        assert!(
            matches!(outcome, PublishOutcome::Failed(_)),
            "a lost connection fails its pending publishes: {outcome}"
        );
        latest = latest.max(at.duration_since(cut_at));
    }
    assert!(
        latest < Duration::from_secs(2),
        "pending publishes resolved {latest:?} after the cut (confirm timeout {confirm_timeout:?})"
    );
    assert_eq!(p.stats().failed, 50);
    // The publisher reconnects on its own.
    proxy.set(Mode::Forward);
    let after = p.publish(Envelope::new("", "sink", "after")).await.unwrap();
    assert!(after.is_confirmed(), "{after}");
    eprintln!("50 pending publishes failed within {latest:?} of the cut");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_or_a_forbidden_vhost_fails_the_start_at_once() {
    let broker = Broker::from_env();
    let vh = broker.vhost("nodes-auth");
    let hostport = vh.hostport();
    let cases = [
        (
            format!("amqp://guest:wr@ng:pw@{hostport}/{}", vh.name),
            "ACCESS",
        ),
        (
            format!(
                "amqp://guest:guest@{hostport}/rk-no-such-vhost-{}",
                std::process::id()
            ),
            "NOT",
        ),
    ];
    for (url, code) in cases {
        let t0 = Instant::now();
        let err = Worker::new(ConnectionConfig::new(url))
            .subscribe(recording_subscriber(Arc::default(), Arc::default()))
            .start()
            .await
            .err();
        let took = t0.elapsed();
        let Some(Error::AccessRefused { node, reason }) = &err else {
            panic!("expected AccessRefused, got {err:?}");
        };
        assert_eq!(*node, hostport);
        assert!(reason.contains(code), "{reason}");
        let text = err.as_ref().map(ToString::to_string).unwrap_or_default();
        assert!(!text.contains("wr@ng"), "{text}");
        assert!(took < Duration::from_secs(2), "took {took:?}");
        eprintln!("refused in {took:?}: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_timeout_is_honoured_for_a_silent_node_and_for_a_refusing_one() {
    let vh = Broker::from_env().vhost("nodes-timeout");
    let silent = Proxy::start(&vh.hostport(), Mode::Blackhole).await;
    let refusing = format!("amqp://guest:guest@127.0.0.1:{}/{}", dead_port(), vh.name);
    for (url, what) in [
        (silent.url("guest:guest", &vh.name), "silent"),
        (refusing, "refusing"),
    ] {
        let mut cfg = ConnectionConfig::new(url);
        cfg.connect_timeout = Duration::from_secs(3);
        let t0 = Instant::now();
        let err = Worker::new(cfg)
            .subscribe(recording_subscriber(Arc::default(), Arc::default()))
            .start()
            .await
            .err();
        let took = t0.elapsed();
        let Some(Error::Unreachable { nodes, .. }) = &err else {
            panic!("{what}: expected Unreachable, got {err:?}");
        };
        assert!(
            nodes.contains("127.0.0.1:"),
            "{what}: names the node: {nodes}"
        );
        assert!(
            took >= Duration::from_millis(2900) && took < Duration::from_millis(4500),
            "{what}: gave up after {took:?}, connect-timeout is 3 s"
        );
        eprintln!("{what}: gave up after {took:?}: {nodes}");
    }
    // A silent first node costs one connect-timeout; the next node is then used.
    let mut cfg = ConnectionConfig::nodes([silent.url("guest:guest", &vh.name), vh.url()]);
    cfg.connect_timeout = Duration::from_secs(2);
    let t0 = Instant::now();
    let w = Worker::new(cfg)
        .subscribe(recording_subscriber(Arc::default(), Arc::default()))
        .start()
        .await
        .unwrap_or_else(|e| panic!("start past a silent node: {e}"));
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(4),
        "{took:?}"
    );
    let _ = w.shutdown().await;
}
