//! The worker's log output, captured from a real run: one WARN per failed attempt with its
//! reason and what happens next, an INFO when a message is parked, the shutdown drain, and
//! nothing per message on the success path.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use lapin::BasicProperties;
use rabbitkit_core::extract::Json;
use rabbitkit_core::headers::Attempt;
use rabbitkit_core::{BoxError, ConnectionConfig, RetryPolicy, Subscriber, Worker};
use rabbitkit_tests::logs::{capture, lines_with};
use rabbitkit_tests::{Broker, wait_until};

const WAIT: Duration = Duration::from_secs(20);

#[derive(serde::Deserialize)]
struct Order {
    id: u32,
}

fn props(id: &str) -> BasicProperties {
    BasicProperties::default()
        .with_content_type("application/json".into())
        .with_message_id(id.into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_failed_attempt_is_logged_once_with_what_happens_next() {
    capture(tracing::Level::INFO);
    let vh = Broker::from_env().vhost("logs-failures");
    // Order 2 fails twice and parks (max 2 attempts); order 3 fails once, then succeeds
    // from the retry tier; order 1 succeeds; the last message does not decode.
    let sub = Subscriber::new("orders", |a: Attempt, Json(o): Json<Order>| async move {
        match (o.id, a.number) {
            (2, _) => Err::<(), BoxError>(format!("card declined {}", "x".repeat(400)).into()),
            (3, 1) => Err("stock service unavailable".into()),
            _ => Ok(()),
        }
    })
    .retry(RetryPolicy::new([Duration::from_millis(200)]).max_attempts(2));
    let w = Worker::new(ConnectionConfig::new(vh.url()))
        .shutdown_deadline(Duration::from_secs(5))
        .subscribe(sub)
        .start()
        .await
        .unwrap();
    for id in 1..=3 {
        let body = format!(r#"{{"id":{id}}}"#);
        vh.publish_raw("", "orders", body.as_bytes(), props(&format!("logs-{id}")))
            .await;
    }
    vh.publish_raw("", "orders", b"not json", props("logs-poison"))
        .await;
    wait_until(WAIT, "every delivery settled", || async {
        let s = w.stats("orders").unwrap();
        (s.retried, s.parked, s.acked) == (2, 2, 6)
    })
    .await;
    w.shutdown().await;

    // Shown with --nocapture (docs/OBSERVABILITY.md quotes it).
    for id in ["logs-1", "logs-2", "logs-3", "logs-poison"] {
        for l in lines_with(&format!("message_id=\"{id}\"")) {
            println!("{l}");
        }
    }

    // Order 3: one WARN (attempt 1, retried into the 200ms tier), nothing at INFO after.
    let three = lines_with("message_id=\"logs-3\"");
    assert_eq!(three.len(), 1, "{three:#?}");
    let l = &three[0];
    for part in [
        " WARN ",
        "handler failed; retrying",
        "handler=orders",
        "queue=orders",
        "attempt=1",
        "error.kind=error",
        "error.message=stock service unavailable",
        "next=\"retry\"",
        "retry.tier=200ms",
        "retry.attempt=2",
    ] {
        assert!(l.contains(part), "{part:?} missing in {l}");
    }

    // Order 2: a WARN per attempt (retry, then park), then one INFO when parked.
    let two = lines_with("message_id=\"logs-2\"");
    assert_eq!(two.len(), 3, "{two:#?}");
    assert!(
        two[0].contains(" WARN ") && two[0].contains("next=\"retry\""),
        "{}",
        two[0]
    );
    assert!(
        two[1].contains(" WARN ")
            && two[1].contains("attempt=2")
            && two[1].contains("next=\"park\"")
            && two[1].contains("park.reason=\"max-attempts\""),
        "{}",
        two[1]
    );
    let text = two[1].split("error.message=").nth(1).unwrap();
    let text = text.split(" next=").next().unwrap();
    assert!(
        text.ends_with('…') && text.len() <= 256 + '…'.len_utf8(),
        "error text truncated: {text}"
    );
    assert!(
        two[2].contains(" INFO ")
            && two[2].contains("message parked")
            && two[2].contains("parking_queue=orders.parking"),
        "{}",
        two[2]
    );

    // Poison: parked at once for `decode`.
    let poison = lines_with("message_id=\"logs-poison\"");
    assert_eq!(poison.len(), 2, "{poison:#?}");
    assert!(
        poison[0].contains("error.kind=decode") && poison[0].contains("park.reason=\"decode\"")
    );
    assert!(poison[1].contains("message parked"));

    // Success path: nothing about order 1 at INFO or above.
    assert_eq!(lines_with("message_id=\"logs-1\""), Vec::<String>::new());

    // The shutdown drain.
    assert!(
        !lines_with("shutdown: consuming stopped, draining in-flight handlers").is_empty(),
        "drain start logged"
    );
    assert!(
        !lines_with("shutdown complete").is_empty(),
        "drain end logged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_straggler_cut_off_at_the_shutdown_deadline_is_logged_and_requeued() {
    capture(tracing::Level::INFO);
    let vh = Broker::from_env().vhost("logs-straggler");
    let sub = Subscriber::new("stuck", || async {
        tokio::time::sleep(Duration::from_secs(60)).await;
        Ok::<_, BoxError>(())
    });
    let w = Worker::new(ConnectionConfig::new(vh.url()))
        .shutdown_deadline(Duration::from_millis(500))
        .subscribe(sub)
        .start()
        .await
        .unwrap();
    vh.publish_raw("", "stuck", b"{}", props("logs-stuck"))
        .await;
    wait_until(WAIT, "handler running", || async {
        w.stats("stuck").unwrap().consumed == 1
    })
    .await;
    let report = w.shutdown().await;
    assert_eq!(report.subscribers["stuck"].requeued, 1);
    let cut = lines_with("message_id=\"logs-stuck\"");
    assert_eq!(cut.len(), 1, "{cut:#?}");
    assert!(cut[0].contains(" WARN ") && cut[0].contains("cut off at the shutdown deadline"));
    let drain = lines_with("draining in-flight handlers");
    assert!(
        drain
            .iter()
            .any(|l| l.contains("in_flight=1") && l.contains("deadline=500ms")),
        "{drain:#?}"
    );
    assert!(
        lines_with("shutdown complete")
            .iter()
            .any(|l| l.contains("stragglers_requeued=1")),
        "{:#?}",
        lines_with("shutdown complete")
    );
    assert_eq!(
        vh.depth("stuck").await,
        1,
        "the straggler is back in the queue"
    );
}
