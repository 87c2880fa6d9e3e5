//! The `validate` and `adopt` topology modes against a real broker: a work queue without
//! rabbitkit's dead-letter target is refused at start, naming the queue, the argument and the
//! fix; a dead-letter exchange set by a policy counts when the management API is configured;
//! adopting a queue someone else declared declares rabbitkit's own queues beside it.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use lapin::BasicProperties;
use lapin::types::FieldTable;
use rabbitkit_core::{
    ConnectionConfig, Error, Outcome, RetryPolicy, Subscriber, TopologyMode, Worker,
};
use rabbitkit_tests::{Broker, Vhost, http, wait_until};

const WAIT: Duration = Duration::from_secs(20);

fn rejecting(queue: &str) -> Subscriber {
    Subscriber::new(queue, || async { Outcome::Reject }).retry(RetryPolicy::none())
}

async fn start(vh: &Vhost, s: Subscriber) -> Result<rabbitkit_core::WorkerHandle, Error> {
    Worker::new(ConnectionConfig::new(vh.url()))
        .shutdown_deadline(Duration::from_secs(5))
        .subscribe(s)
        .start()
        .await
}

/// Applies `definition` to the queue `queue` of `vh` as a policy through the management API
/// and waits until the queue shows it.
async fn set_policy(vh: &Vhost, queue: &str, definition: &str) {
    let body =
        format!(r#"{{"pattern":"^{queue}$","apply-to":"queues","definition":{definition}}}"#);
    let (status, text) = http(
        &vh.broker.mgmt,
        "PUT",
        &format!("/api/policies/{}/rk-dlx", vh.name),
        Some(&body),
    );
    assert!(status == 201 || status == 204, "policy: {status} {text}");
    let path = format!("/api/queues/{}/{queue}", vh.name);
    wait_until(WAIT, "the policy applies to the queue", || {
        let (_, q) = http(&vh.broker.mgmt, "GET", &path, None);
        async move { q.contains(r#""policy":"rk-dlx""#) }
    })
    .await;
}

fn mismatch(err: Option<Error>) -> (String, String, String, String) {
    match err {
        Some(Error::WorkQueueMismatch {
            queue,
            argument,
            found,
            fix,
        }) => (queue, argument, found, fix),
        other => panic!("expected WorkQueueMismatch, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validate_refuses_work_queue_without_dead_letter_exchange() {
    let vh = Broker::from_env().vhost("validate-nodlx");
    // Provisioned by someone else, without a dead-letter target; the parking queue exists,
    // so existence alone would pass.
    vh.declare_queue("orders", FieldTable::default()).await;
    vh.declare_queue("orders.parking", FieldTable::default())
        .await;
    let s = rejecting("orders").topology_mode(TopologyMode::Validate);
    let (queue, argument, found, fix) = mismatch(start(&vh, s.clone()).await.err());
    assert_eq!(queue, "orders");
    assert_eq!(argument, "x-dead-letter-exchange");
    assert!(found.contains("none"), "{found}");
    assert!(fix.contains("rabbitmqctl set_policy"), "{fix}");
    assert!(
        fix.contains("without the management API"),
        "says what it could not check: {fix}"
    );
    // The same through the management API: the queue has it neither as an argument nor
    // by a policy.
    let s = s.management_url(vh.broker.mgmt.clone());
    let (_, argument, found, fix) = mismatch(start(&vh, s).await.err());
    assert_eq!(argument, "x-dead-letter-exchange");
    assert!(
        found.contains("neither as an argument nor by a policy"),
        "{found}"
    );
    assert!(!fix.contains("without the management API"), "{fix}");
    assert!(fix.contains(&format!("-p '{}'", vh.name)), "{fix}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validate_accepts_dead_letter_exchange_set_by_policy() {
    let vh = Broker::from_env().vhost("validate-policy");
    vh.declare_queue("orders", FieldTable::default()).await;
    vh.declare_queue("orders.parking", FieldTable::default())
        .await;
    let s = rejecting("orders").topology_mode(TopologyMode::Validate);
    set_policy(&vh, "orders", &s.topology().policy_definition()).await;
    // Without the management API the policy cannot be seen: refused, saying so.
    let (_, argument, _, fix) = mismatch(start(&vh, s.clone()).await.err());
    assert_eq!(argument, "x-dead-letter-exchange");
    assert!(fix.contains("without the management API"), "{fix}");
    // With it, the policy counts, and a rejected message reaches the parking queue.
    let w = start(&vh, s.management_url(vh.broker.mgmt.clone()))
        .await
        .unwrap_or_else(|e| panic!("validate with the policy in effect: {e}"));
    vh.publish_raw("", "orders", b"refused", BasicProperties::default())
        .await;
    wait_until(WAIT, "the rejected message is parked", || async {
        vh.depth("orders.parking").await == 1
    })
    .await;
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validate_accepts_the_topology_rabbitkit_declared() {
    let vh = Broker::from_env().vhost("validate-own");
    for quorum in [false, true] {
        let queue = if quorum { "q-orders" } else { "c-orders" };
        let mut s = rejecting(queue).retry(RetryPolicy::new([Duration::from_secs(1)]));
        if quorum {
            s = s.queue_type(rabbitkit_core::QueueType::Quorum);
        }
        start(&vh, s.clone()).await.unwrap().shutdown().await;
        for url in [None, Some(vh.broker.mgmt.clone())] {
            let mut v = s.clone().topology_mode(TopologyMode::Validate);
            if let Some(url) = url.clone() {
                v = v.management_url(url);
            }
            let w = start(&vh, v)
                .await
                .unwrap_or_else(|e| panic!("{queue}, management {url:?}: {e}"));
            w.shutdown().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopt_declares_tiers_and_parking_beside_existing_queue() {
    let vh = Broker::from_env().vhost("adopt");
    vh.declare_queue("orders", FieldTable::default()).await;
    let s = rejecting("orders")
        .retry(RetryPolicy::new([Duration::from_secs(1)]))
        .bind("shop", "order.*")
        .topology_mode(TopologyMode::Adopt)
        .management_url(vh.broker.mgmt.clone());
    set_policy(&vh, "orders", &s.topology().policy_definition()).await;
    let w = start(&vh, s.clone())
        .await
        .unwrap_or_else(|e| panic!("adopt: {e}"));
    assert_eq!(vh.try_depth("orders.parking").await, Some(0));
    let tier = s.topology().tier_queue(Duration::from_secs(1));
    assert_eq!(vh.try_depth(&tier).await, Some(0), "{tier} declared");
    // The binding was declared, and a rejection reaches rabbitkit's parking queue through
    // the policy.
    vh.publish_raw("shop", "order.paid", b"refused", BasicProperties::default())
        .await;
    wait_until(WAIT, "the rejected message is parked", || async {
        vh.depth("orders.parking").await == 1
    })
    .await;
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopt_refuses_a_queue_without_dead_letter_target_with_the_policy_command_that_fixes_it() {
    let broker = Broker::from_env();
    let vh = broker.vhost("adopt-fix");
    vh.declare_queue("orders", FieldTable::default()).await;
    let s = rejecting("orders")
        .retry(RetryPolicy::new([Duration::from_secs(1)]))
        .topology_mode(TopologyMode::Adopt)
        .management_url(vh.broker.mgmt.clone());
    let (queue, argument, _, fix) = mismatch(start(&vh, s.clone()).await.err());
    assert_eq!(
        (queue.as_str(), argument.as_str()),
        ("orders", "x-dead-letter-exchange")
    );
    assert_eq!(
        vh.try_depth("orders.parking").await,
        None,
        "nothing declared"
    );
    // The printed command, run as printed (through the project node's rabbitmqctl), is
    // the whole fix.
    let command = fix
        .split_once("rabbitmqctl ")
        .map(|(_, c)| c.split(" (").next().unwrap_or(c).to_owned())
        .expect("a rabbitmqctl command in the fix");
    assert_eq!(
        format!("rabbitmqctl {command}"),
        s.topology().policy_command(&vh.name)
    );
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/broker");
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "bash {script} ctl --version {} --instance {} {command}",
            broker.version, broker.instance
        ))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{command}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    wait_until(WAIT, "adopted once the policy is applied", || {
        let (vh, s) = (&vh, s.clone());
        async move {
            match start(vh, s).await {
                Ok(w) => {
                    w.shutdown().await;
                    true
                }
                Err(Error::WorkQueueMismatch { .. }) => false,
                Err(e) => panic!("{e}"),
            }
        }
    })
    .await;
    assert_eq!(vh.try_depth("orders.parking").await, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopt_refuses_a_missing_work_queue() {
    let vh = Broker::from_env().vhost("adopt-missing");
    let s = rejecting("orders").topology_mode(TopologyMode::Adopt);
    let err = start(&vh, s).await.err();
    assert!(
        matches!(&err, Some(Error::Topology(m)) if m.contains("exists")),
        "{err:?}"
    );
    assert_eq!(vh.try_depth("orders").await, None);
    assert_eq!(vh.try_depth("orders.parking").await, None);
}
