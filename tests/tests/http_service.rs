//! `WorkerHandle::http_service`: the health and metrics answers as a `tower::Service`, as a
//! user mounts them into an axum or hyper server of their own.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use http_body_util::BodyExt;
use rabbitkit_core::{BoxError, ConnectionConfig, Subscriber, Worker};
use rabbitkit_tests::{Broker, wait_until};
use tower::ServiceExt;

async fn call(
    svc: &rabbitkit_core::observe::HttpEndpoints,
    method: &str,
    path: &str,
) -> (u16, String) {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .body(())
        .unwrap();
    let resp = svc.clone().oneshot(req).await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoints_mount_as_a_tower_service_without_a_listener() {
    assert!(rabbitkit_core::observe::install_prometheus());
    let vh = Broker::from_env().vhost("http-service");
    let w = Worker::new(ConnectionConfig::new(vh.url()))
        .subscribe(Subscriber::new("orders", || async {
            Ok::<_, BoxError>(())
        }))
        .start()
        .await
        .unwrap();
    assert_eq!(w.http_addr(), None, "no listener of its own");
    let svc = w.http_service();
    wait_until(Duration::from_secs(20), "ready", || {
        let svc = svc.clone();
        async move { call(&svc, "GET", "/ops/readyz").await.0 == 200 }
    })
    .await;
    vh.publish_raw("", "orders", b"x", Default::default()).await;
    wait_until(Duration::from_secs(20), "acked", || async {
        w.stats("orders").unwrap().acked == 1
    })
    .await;
    let (status, metrics) = call(&svc, "GET", "/metrics").await;
    assert_eq!(status, 200);
    let line = format!(
        r#"rabbitkit_acked_total{{vhost="{}",queue="orders"}} 1"#,
        vh.name
    );
    assert!(metrics.contains(&line), "{line} in:\n{metrics}");
    assert_eq!(call(&svc, "GET", "/healthz").await, (200, "ok\n".into()));
    assert_eq!(call(&svc, "HEAD", "/healthz").await.0, 200);
    assert_eq!(call(&svc, "POST", "/metrics").await.0, 405);
    assert_eq!(call(&svc, "GET", "/nope").await.0, 404);
    let kept = svc.clone();
    w.shutdown().await;
    assert_eq!(
        call(&kept, "GET", "/readyz").await.0,
        503,
        "not ready once stopped"
    );
}
