//! Shared support for rabbitkit's integration tests: the broker under test, a fresh vhost
//! per test, raw publish/get helpers, queue depths and waiting.
//!
//! The broker comes from the environment `scripts/test` sets (`RABBITKIT_TEST_AMQP`,
//! `RABBITKIT_TEST_MGMT`, `RABBITKIT_TEST_VERSION`). Without it every test fails at once with
//! a message saying how to start one: tests never skip silently.
#![allow(
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used,
    unreachable_pub
)]

use std::future::Future;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use lapin::options::{
    BasicAckOptions, BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions,
    QueueDeclareOptions, QueueDeleteOptions, QueuePurgeOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Confirmation, Connection, ConnectionProperties};

/// Declares a durable queue with `args` on `ch`; panics with the broker's error.
pub async fn declare_durable(ch: &lapin::Channel, queue: &str, args: FieldTable) {
    ch.queue_declare(
        queue.into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        args,
    )
    .await
    .unwrap_or_else(|e| panic!("declare {queue}: {e}"));
}

/// The broker under test.
#[derive(Debug, Clone)]
pub struct Broker {
    /// `amqp://guest:guest@127.0.0.1:5680` (no vhost).
    pub amqp: String,
    /// `http://127.0.0.1:15680`.
    pub mgmt: String,
    /// Major version expected: "3" or "4".
    pub version: String,
    /// Instance (0 is the shared one).
    pub instance: u32,
}

const HOW: &str = "no test broker configured: run `scripts/test`, or start one with \
`scripts/broker start --version 3` and export RABBITKIT_TEST_AMQP=$(scripts/broker url --version 3 --base) \
RABBITKIT_TEST_MGMT=$(scripts/broker mgmt-url --version 3) RABBITKIT_TEST_VERSION=3";

impl Broker {
    /// The shared broker of this test run. Panics (fails the test) when none is configured.
    pub fn from_env() -> Self {
        let get = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set. {HOW}"));
        Self {
            amqp: get("RABBITKIT_TEST_AMQP").trim_end_matches('/').to_owned(),
            mgmt: get("RABBITKIT_TEST_MGMT").trim_end_matches('/').to_owned(),
            version: get("RABBITKIT_TEST_VERSION"),
            instance: 0,
        }
    }

    /// A private node of the same version (for alarms and restarts), started through
    /// `scripts/broker` if it is not running. Instance numbers must be unique per test.
    pub fn private(instance: u32) -> Self {
        let shared = Self::from_env();
        let out = broker_script(&[
            "start",
            "--version",
            &shared.version,
            "--instance",
            &instance.to_string(),
        ]);
        assert!(
            out.status.success(),
            "cannot start private broker {instance}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let url = broker_script(&[
            "url",
            "--version",
            &shared.version,
            "--instance",
            &instance.to_string(),
            "--base",
        ]);
        let mgmt = broker_script(&[
            "mgmt-url",
            "--version",
            &shared.version,
            "--instance",
            &instance.to_string(),
        ]);
        Self {
            amqp: String::from_utf8_lossy(&url.stdout)
                .trim()
                .trim_end_matches('/')
                .to_owned(),
            mgmt: String::from_utf8_lossy(&mgmt.stdout).trim().to_owned(),
            version: shared.version,
            instance,
        }
    }

    /// Runs rabbitmqctl against this node.
    pub fn ctl(&self, args: &[&str]) -> String {
        let inst = self.instance.to_string();
        let mut all = vec!["ctl", "--version", &self.version, "--instance", &inst];
        all.extend_from_slice(args);
        let out = broker_script(&all);
        assert!(
            out.status.success(),
            "rabbitmqctl {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The broker's version string from the management API (`/api/overview`).
    pub fn server_version(&self) -> String {
        let (status, body) = http(&self.mgmt, "GET", "/api/overview", None);
        assert_eq!(status, 200, "overview: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["rabbitmq_version"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// A fresh vhost, deleted on drop (also when the test fails).
    pub fn vhost(&self, hint: &str) -> Vhost {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "rk-{hint}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let path = format!("/api/vhosts/{name}");
        let (status, body) = http(&self.mgmt, "PUT", &path, Some("{}"));
        assert!(
            status == 201 || status == 204,
            "create vhost {name}: {status} {body}"
        );
        let (status, body) = http(
            &self.mgmt,
            "PUT",
            &format!("/api/permissions/{name}/guest"),
            Some(r#"{"configure":".*","write":".*","read":".*"}"#),
        );
        assert!(
            status == 201 || status == 204,
            "permissions on {name}: {status} {body}"
        );
        Vhost {
            broker: self.clone(),
            name,
        }
    }
}

fn broker_script(args: &[&str]) -> std::process::Output {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/broker");
    Command::new("bash")
        .arg(script)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run scripts/broker: {e}"))
}

/// A vhost that exists for one test.
#[derive(Debug)]
pub struct Vhost {
    pub broker: Broker,
    pub name: String,
}

impl Drop for Vhost {
    fn drop(&mut self) {
        let _ = http(
            &self.broker.mgmt,
            "DELETE",
            &format!("/api/vhosts/{}", self.name),
            None,
        );
    }
}

/// A message read back with basic.get.
#[derive(Debug, Clone)]
pub struct Got {
    pub body: Vec<u8>,
    pub routing_key: String,
    pub exchange: String,
    pub redelivered: bool,
    pub properties: BasicProperties,
}

impl Got {
    pub fn header(&self, name: &str) -> Option<&AMQPValue> {
        self.properties.headers().as_ref()?.inner().get(name)
    }

    pub fn header_str(&self, name: &str) -> Option<String> {
        match self.header(name)? {
            AMQPValue::LongString(s) => Some(s.to_string()),
            AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
            _ => None,
        }
    }

    pub fn header_int(&self, name: &str) -> Option<i64> {
        match self.header(name)? {
            AMQPValue::LongLongInt(n) => Some(*n),
            AMQPValue::LongInt(n) => Some(i64::from(*n)),
            _ => None,
        }
    }
}

impl Vhost {
    /// Starts a worker running `s` against this vhost (shutdown deadline 5 s); panics with
    /// the error when it cannot start.
    pub async fn start_worker(
        &self,
        s: rabbitkit_core::Subscriber,
    ) -> rabbitkit_core::WorkerHandle {
        rabbitkit_core::Worker::new(rabbitkit_core::ConnectionConfig::new(self.url()))
            .shutdown_deadline(Duration::from_secs(5))
            .subscribe(s)
            .start()
            .await
            .unwrap_or_else(|e| panic!("worker start: {e}"))
    }

    /// The AMQP URL of this vhost.
    pub fn url(&self) -> String {
        format!("{}/{}", self.broker.amqp, self.name)
    }

    /// A plain lapin connection (for raw setup and inspection).
    pub async fn connect(&self) -> Connection {
        Connection::connect(&self.url(), ConnectionProperties::default())
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}. {HOW}", self.url()))
    }

    /// Declares a durable queue with arguments.
    pub async fn declare_queue(&self, name: &str, args: FieldTable) {
        let c = self.connect().await;
        let ch = c.create_channel().await.unwrap();
        declare_durable(&ch, name, args).await;
        let _ = c.close(200, "".into()).await;
    }

    /// Publishes one persistent message with confirms and asserts it was confirmed.
    pub async fn publish_raw(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        props: BasicProperties,
    ) {
        let c = self.connect().await;
        let ch = c.create_channel().await.unwrap();
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        let confirm = ch
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                BasicPublishOptions {
                    mandatory: true,
                    immediate: false,
                },
                body,
                props.with_delivery_mode(2),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(
            matches!(confirm, Confirmation::Ack(None)),
            "raw publish not confirmed: {confirm:?}"
        );
        let _ = c.close(200, "".into()).await;
    }

    /// Ready messages in `queue` (passive declare; panics if it does not exist).
    pub async fn depth(&self, queue: &str) -> u32 {
        self.try_depth(queue)
            .await
            .unwrap_or_else(|| panic!("queue {queue} does not exist"))
    }

    /// Ready messages in `queue`, `None` if it does not exist.
    pub async fn try_depth(&self, queue: &str) -> Option<u32> {
        let c = self.connect().await;
        let ch = c.create_channel().await.unwrap();
        let r = ch
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .ok()
            .map(|q| q.message_count());
        let _ = c.close(200, "".into()).await;
        r
    }

    /// Takes (and acks) up to `max` messages from `queue`.
    pub async fn get_all(&self, queue: &str, max: usize) -> Vec<Got> {
        let c = self.connect().await;
        let ch = c.create_channel().await.unwrap();
        let mut out = Vec::new();
        while out.len() < max {
            let Some(m) = ch
                .basic_get(queue.into(), BasicGetOptions { no_ack: false })
                .await
                .unwrap()
            else {
                break;
            };
            let d = m.delivery;
            d.acker.ack(BasicAckOptions::default()).await.unwrap();
            out.push(Got {
                body: d.data,
                routing_key: d.routing_key.to_string(),
                exchange: d.exchange.to_string(),
                redelivered: d.redelivered,
                properties: d.properties,
            });
        }
        let _ = c.close(200, "".into()).await;
        out
    }

    pub async fn purge(&self, queue: &str) {
        let c = self.connect().await;
        let ch = c.create_channel().await.unwrap();
        let _ = ch
            .queue_purge(queue.into(), QueuePurgeOptions::default())
            .await;
        let _ = c.close(200, "".into()).await;
    }

    pub async fn delete_queue(&self, queue: &str) {
        let c = self.connect().await;
        let ch = c.create_channel().await.unwrap();
        ch.queue_delete(queue.into(), QueueDeleteOptions::default())
            .await
            .unwrap();
        let _ = c.close(200, "".into()).await;
    }

    /// Binds `queue` to `exchange` with `routing_key`.
    pub async fn bind(&self, exchange: &str, queue: &str, routing_key: &str) {
        let c = self.connect().await;
        let ch = c.create_channel().await.unwrap();
        ch.queue_bind(
            queue.into(),
            exchange.into(),
            routing_key.into(),
            Default::default(),
            FieldTable::default(),
        )
        .await
        .unwrap_or_else(|e| panic!("bind {exchange} -> {queue}: {e}"));
        let _ = c.close(200, "".into()).await;
    }

    /// Removes a binding.
    pub async fn unbind(&self, exchange: &str, queue: &str, routing_key: &str) {
        let c = self.connect().await;
        let ch = c.create_channel().await.unwrap();
        ch.queue_unbind(
            queue.into(),
            exchange.into(),
            routing_key.into(),
            FieldTable::default(),
        )
        .await
        .unwrap_or_else(|e| panic!("unbind {exchange} -> {queue}: {e}"));
        let _ = c.close(200, "".into()).await;
    }

    /// Forces every connection of this vhost closed (`rabbitmqctl close_all_connections`).
    pub fn close_connections(&self) {
        self.broker.ctl(&[
            "close_all_connections",
            "-p",
            &self.name,
            "rabbitkit fault test",
        ]);
    }
}

/// Waits until `check` returns true, polling every 50 ms; panics with `what` after `timeout`.
pub async fn wait_until<F, Fut>(timeout: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return;
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A minimal blocking HTTP/1.0 client with guest:guest basic auth, for the management API.
pub fn http(base: &str, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    let host = base.trim_start_matches("http://");
    let mut s =
        TcpStream::connect(host).unwrap_or_else(|e| panic!("management API at {base}: {e}. {HOW}"));
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let body = body.unwrap_or("");
    let req = format!(
        "{method} {path} HTTP/1.0\r\nHost: {host}\r\nAuthorization: Basic Z3Vlc3Q6Z3Vlc3Q=\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let status = resp
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = resp
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// A handler that succeeds and counts its runs (its "effects") in `effects`.
pub fn counting_handler(
    effects: std::sync::Arc<AtomicU32>,
) -> impl Fn() -> futures_util::future::Ready<Result<(), rabbitkit_core::BoxError>>
+ Clone
+ Send
+ Sync
+ 'static {
    move || {
        effects.fetch_add(1, Ordering::SeqCst);
        futures_util::future::ready(Ok(()))
    }
}

/// A `FieldTable` from pairs.
pub fn table(pairs: &[(&str, AMQPValue)]) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in pairs {
        t.insert((*k).into(), v.clone());
    }
    t
}
