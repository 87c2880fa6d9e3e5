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

pub mod audit;
pub mod logs;
pub mod proxy;

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
    /// The node number when this is a node of a project cluster (see [`Cluster`]).
    pub cluster_node: Option<u32>,
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
            cluster_node: None,
        }
    }

    /// A private node of the same version (for alarms and restarts), started through
    /// `scripts/broker` if it is not running. Instance numbers must be unique per test.
    pub fn private(instance: u32) -> Self {
        Self::private_with(instance, &[])
    }

    /// A private node with a TLS listener (`scripts/broker start --tls DIR`: the test CA and
    /// certificates are made in `dir` when it has none) and its `amqps://` base URL.
    pub fn private_tls(instance: u32, dir: &std::path::Path) -> (Self, String) {
        let dir = dir.to_string_lossy().into_owned();
        let broker = Self::private_with(instance, &["--tls", &dir]);
        let url = broker_script(&[
            "url",
            "--version",
            &broker.version,
            "--instance",
            &instance.to_string(),
            "--base",
            "--tls",
        ]);
        let url = String::from_utf8_lossy(&url.stdout).trim().to_owned();
        (broker, url)
    }

    fn private_with(instance: u32, extra: &[&str]) -> Self {
        let shared = Self::from_env();
        let inst = instance.to_string();
        let mut args = vec!["start", "--version", &shared.version, "--instance", &inst];
        args.extend_from_slice(extra);
        let out = broker_script(&args);
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
            cluster_node: None,
        }
    }

    /// Runs rabbitmqctl against this node; false when it fails (e.g. the node is down).
    pub fn try_ctl(&self, args: &[&str]) -> bool {
        self.run_ctl(args).status.success()
    }

    /// Runs rabbitmqctl against this node: its output, `None` when it fails.
    pub fn try_ctl_output(&self, args: &[&str]) -> Option<String> {
        let out = self.run_ctl(args);
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `scripts/broker ctl` (or `cluster ctl N`) for this node with `args`.
    fn run_ctl(&self, args: &[&str]) -> std::process::Output {
        let inst = self.instance.to_string();
        let node = self.cluster_node.unwrap_or(0).to_string();
        let mut all = if self.cluster_node.is_some() {
            vec!["cluster", "ctl", &node, "--version", &self.version]
        } else {
            vec!["ctl", "--version", &self.version, "--instance", &inst]
        };
        all.extend_from_slice(args);
        broker_script(&all)
    }

    /// Runs rabbitmqctl against this node.
    pub fn ctl(&self, args: &[&str]) -> String {
        let out = self.run_ctl(args);
        assert!(
            out.status.success(),
            "rabbitmqctl {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Kills this private node's Erlang VM with SIGKILL (no shutdown, no flush): the
    /// whole process group `scripts/broker` started it in (launcher, chroot, beam). Bring it
    /// back with [`Broker::private`] on the same instance.
    pub fn kill9(&self) {
        assert!(self.instance != 0, "never kill the shared broker");
        // Asked of `scripts/broker`, which knows where the node's state is (it depends on
        // RABBITKIT_PORT_OFFSET).
        let inst = self.instance.to_string();
        let out = broker_script(&["pid", "--version", &self.version, "--instance", &inst]);
        assert!(
            out.status.success(),
            "no launcher pid for instance {}: {}",
            self.instance,
            String::from_utf8_lossy(&out.stderr)
        );
        let pid: i32 = String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("launcher pid");
        // `scripts/broker` starts the node with setsid: the launcher's pid is the group id.
        let st = Command::new("kill")
            .args(["-KILL", "--", &format!("-{pid}")])
            .status()
            .expect("run kill");
        assert!(st.success(), "kill -9 of process group {pid} failed");
        let start = Instant::now();
        while Command::new("kill")
            .args(["-0", &pid.to_string()])
            .stderr(std::process::Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
        {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "node {pid} survived kill -9"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
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
        self.vhost_named(&name)
    }

    /// The vhost `name` on this node, created with guest's permissions and deleted on
    /// drop (two nodes of a failover test need the same vhost name).
    pub fn vhost_named(&self, name: &str) -> Vhost {
        let name = name.to_owned();
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

/// A project cluster (`scripts/broker cluster ...`) of the version under test, or of
/// `RABBITKIT_TEST_CLUSTER_VERSION` when set. Nodes are numbered from 1.
#[derive(Debug, Clone)]
pub struct Cluster {
    /// "3", "4" or "4.3".
    pub version: String,
    /// One entry per node, node `n` at index `n - 1`.
    pub nodes: Vec<Broker>,
}

impl Cluster {
    /// The cluster of `nodes` nodes, formed through `scripts/broker cluster start` when it is
    /// not running (nodes that are down are started again). Panics with the script's output
    /// when it cannot be formed: a cluster test never skips.
    pub fn ensure(nodes: u32) -> Self {
        let version = std::env::var("RABBITKIT_TEST_CLUSTER_VERSION")
            .or_else(|_| std::env::var("RABBITKIT_TEST_VERSION"))
            .unwrap_or_else(|_| panic!("RABBITKIT_TEST_VERSION is not set. {HOW}"));
        Self::ensure_version(&version, nodes)
    }

    /// [`Cluster::ensure`] for an explicit version.
    pub fn ensure_version(version: &str, nodes: u32) -> Self {
        let n = nodes.to_string();
        let out = broker_script(&["cluster", "start", "--version", version, "--nodes", &n]);
        assert!(
            out.status.success(),
            "cannot form the {version} cluster of {nodes} nodes: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let list = |what: &str| -> Vec<String> {
            let out = broker_script(&["cluster", what, "--version", version]);
            assert!(out.status.success(), "cluster {what}: {out:?}");
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .split(',')
                .map(|u| u.trim_end_matches('/').to_owned())
                .collect()
        };
        let amqp = list("url");
        let mgmt = list("mgmt-url");
        assert_eq!(amqp.len(), nodes as usize, "cluster urls: {amqp:?}");
        let nodes = amqp
            .into_iter()
            .zip(mgmt)
            .enumerate()
            .map(|(i, (amqp, mgmt))| Broker {
                amqp,
                mgmt,
                version: version.to_owned(),
                instance: 0,
                cluster_node: Some(i as u32 + 1),
            })
            .collect();
        Self {
            version: version.to_owned(),
            nodes,
        }
    }

    /// Node `n` (1-based).
    pub fn node(&self, n: u32) -> &Broker {
        &self.nodes[n as usize - 1]
    }

    /// Every node's AMQP URL for `vhost`, comma-separated (the `RABBITKIT_URL` form).
    pub fn urls(&self, vhost: &str) -> String {
        self.nodes
            .iter()
            .map(|b| format!("{}/{vhost}", b.amqp))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The first node whose management API answers.
    pub fn any_up(&self) -> &Broker {
        self.nodes
            .iter()
            .find(|b| mgmt_up(&b.mgmt))
            .unwrap_or_else(|| panic!("no node of the {} cluster answers", self.version))
    }

    /// A fresh vhost (cluster-wide), talked to through the first node that answers.
    pub fn vhost(&self, hint: &str) -> Vhost {
        self.any_up().vhost(hint)
    }

    fn script(&self, cmd: &str, n: u32) {
        let node = n.to_string();
        let out = broker_script(&["cluster", cmd, &node, "--version", &self.version]);
        assert!(
            out.status.success(),
            "cluster {cmd} {n}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `kill -9` of node `n`'s Erlang VM.
    pub fn kill_node(&self, n: u32) {
        self.script("kill-node", n);
    }

    /// Stops node `n` cleanly (its data is kept).
    pub fn stop_node(&self, n: u32) {
        self.script("stop-node", n);
    }

    /// Boots node `n` again; it rejoins the cluster with its data. Returns once it answers.
    pub fn start_node(&self, n: u32) {
        self.script("start-node", n);
    }

    /// rabbitmqctl against node `n`.
    pub fn ctl(&self, n: u32, args: &[&str]) -> String {
        self.node(n).ctl(args)
    }

    /// The number (1-based) of the node leading quorum queue `queue` in `vhost`, asked of the
    /// first node that answers; `None` while it has no leader (or the queue is unknown).
    pub fn quorum_leader(&self, vhost: &str, queue: &str) -> Option<u32> {
        let b = self.any_up();
        let (status, body) = http(
            &b.mgmt,
            "GET",
            &format!("/api/queues/{vhost}/{queue}"),
            None,
        );
        if status != 200 {
            return None;
        }
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        let leader = v["leader"].as_str()?;
        self.node_number(leader)
    }

    /// The members of quorum queue `queue` that are online, as node numbers.
    pub fn quorum_online(&self, vhost: &str, queue: &str) -> Vec<u32> {
        let b = self.any_up();
        let (status, body) = http(
            &b.mgmt,
            "GET",
            &format!("/api/queues/{vhost}/{queue}"),
            None,
        );
        if status != 200 {
            return Vec::new();
        }
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        let mut out: Vec<u32> = v["online"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|n| n.as_str().and_then(|n| self.node_number(n)))
                    .collect()
            })
            .unwrap_or_default();
        out.sort_unstable();
        out
    }

    /// `rkc43-2@localhost` -> 2.
    fn node_number(&self, erlang_node: &str) -> Option<u32> {
        let short = erlang_node.split('@').next()?;
        short.rsplit('-').next()?.parse().ok()
    }
}

fn mgmt_up(base: &str) -> bool {
    let host = base.trim_start_matches("http://");
    let Ok(addr) = host.parse::<std::net::SocketAddr>() else {
        return false;
    };
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let req = format!(
        "GET /api/overview HTTP/1.0\r\nHost: {host}\r\nAuthorization: Basic Z3Vlc3Q6Z3Vlc3Q=\r\n\r\n"
    );
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut resp = String::new();
    let _ = s.read_to_string(&mut resp);
    resp.starts_with("HTTP/1.1 200") || resp.starts_with("HTTP/1.0 200")
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
    /// Talks to this vhost through another node of the same cluster from now on (e.g. after
    /// the node it used was killed). The vhost itself is unchanged.
    pub fn use_node(&mut self, broker: &Broker) {
        self.broker = broker.clone();
    }

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
        publish_confirmed(&self.url(), exchange, routing_key, [(body.to_vec(), props)]).await;
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

    /// `host:port` of the node's AMQP listener.
    pub fn hostport(&self) -> String {
        let rest = self
            .broker
            .amqp
            .rsplit_once('@')
            .map_or(&*self.broker.amqp, |(_, r)| r);
        rest.trim_start_matches("amqp://")
            .trim_end_matches('/')
            .to_owned()
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

/// Publishes every `(body, properties)` persistent, mandatory, one at a time on one
/// connection to `url`, and asserts each was confirmed (not returned).
pub async fn publish_confirmed(
    url: &str,
    exchange: &str,
    routing_key: &str,
    messages: impl IntoIterator<Item = (Vec<u8>, BasicProperties)>,
) {
    let c = Connection::connect(url, ConnectionProperties::default())
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}. {HOW}"));
    let ch = c.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    for (body, props) in messages {
        let confirm = ch
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                BasicPublishOptions {
                    mandatory: true,
                    immediate: false,
                },
                &body,
                props.with_delivery_mode(2),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(
            matches!(confirm, Confirmation::Ack(None)),
            "raw publish of {:?} not confirmed: {confirm:?}",
            String::from_utf8_lossy(&body)
        );
    }
    let _ = c.close(200, "".into()).await;
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
