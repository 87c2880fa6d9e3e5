//! TLS against a real TLS listener: a private node (instance 8) started by
//! `scripts/broker start --tls DIR`, which verifies peers and refuses clients without a
//! certificate; a test CA, server and client certificates made with openssl in DIR.
//! Needs rabbitkit's `tls` feature: `cargo test -p rabbitkit-tests --features tls --test tls`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rabbitkit_core::connection::TlsConfig;
use rabbitkit_core::{
    ConnectionConfig, Envelope, Error, PublishOutcome, Publisher, PublisherConfig, Subscriber,
    Worker,
};
use rabbitkit_tests::{Broker, Vhost, counting_handler, wait_until};

const INSTANCE: u32 = 8;

/// Where the certificates are (made once; the node is restarted only when they change).
fn certs() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("tls-certs")
}

struct Tls {
    vhost: Vhost,
    /// `amqps://guest:guest@localhost:PORT`
    base: String,
    dir: PathBuf,
}

impl Tls {
    fn start(hint: &str) -> Self {
        let dir = certs();
        let (broker, base) = Broker::private_tls(INSTANCE, &dir);
        assert!(base.starts_with("amqps://"), "{base}");
        Self {
            vhost: broker.vhost(hint),
            base,
            dir,
        }
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The vhost's URL over TLS, with the host replaced when `host` is given.
    fn url(&self, host: Option<&str>) -> String {
        let base = match host {
            Some(h) => self.base.replace("@localhost:", &format!("@{h}:")),
            None => self.base.clone(),
        };
        format!("{base}/{}", self.vhost.name)
    }

    /// CA and client certificate: what this broker accepts.
    fn good(&self) -> TlsConfig {
        TlsConfig::new()
            .ca_file(self.file("ca.pem"))
            .client_cert(self.file("client.pem"), self.file("client.key"))
    }

    fn config(&self, host: Option<&str>, tls: TlsConfig) -> ConnectionConfig {
        let mut c = ConnectionConfig::new(self.url(host)).tls(tls);
        // A refused certificate must fail well before this: the test proves it is not retried.
        c.connect_timeout = Duration::from_secs(20);
        c
    }
}

/// Connects with a publisher; the error, and how long it took to come.
async fn try_connect(cfg: ConnectionConfig) -> (Result<(), Error>, Duration) {
    let t0 = Instant::now();
    let r = match Publisher::new(cfg, PublisherConfig::default()) {
        Ok(p) => {
            let r = p.connect().await;
            p.close(Duration::from_secs(1)).await;
            r
        }
        Err(e) => Err(e),
    };
    (r, t0.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_with_the_ca_and_a_client_certificate_publishes_and_consumes_over_tls() {
    let tls = Tls::start("tls-ok");
    let cfg = tls.config(None, tls.good());
    let effects = Arc::new(AtomicU32::new(0));
    let handle = Worker::new(cfg.clone())
        .shutdown_deadline(Duration::from_secs(5))
        .subscribe(Subscriber::new(
            "tls-orders",
            counting_handler(effects.clone()),
        ))
        .start()
        .await
        .unwrap_or_else(|e| panic!("worker start over TLS: {e}"));
    let publisher = Publisher::new(cfg, PublisherConfig::default()).unwrap();
    for i in 0..5 {
        let outcome = publisher
            .publish(Envelope::new("", "tls-orders", format!("order {i}")))
            .await
            .unwrap();
        assert!(
            matches!(outcome, PublishOutcome::Confirmed { .. }),
            "{outcome:?}"
        );
    }
    wait_until(Duration::from_secs(30), "5 deliveries handled", || {
        let n = effects.load(Ordering::SeqCst);
        async move { n == 5 }
    })
    .await;
    publisher.close(Duration::from_secs(5)).await;
    let report = handle.shutdown().await;
    assert_eq!(tls.vhost.depth("tls-orders").await, 0, "{report:?}");
    // The broker saw TLS connections (and nothing else) on this vhost.
    let (status, body) = rabbitkit_tests::http(
        &tls.vhost.broker.mgmt,
        "GET",
        &format!("/api/vhosts/{}/connections", tls.vhost.name),
        None,
    );
    assert_eq!(status, 200, "{body}");
    let conns: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
    assert!(
        conns
            .iter()
            .all(|c| c["ssl"] == serde_json::Value::Bool(true)),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_name_setting_checks_the_certificate_against_it_instead_of_the_host() {
    let tls = Tls::start("tls-name");
    // The certificate names localhost and rabbit.test, not 127.0.0.1.
    let (r, _) =
        try_connect(tls.config(Some("127.0.0.1"), tls.good().server_name("rabbit.test"))).await;
    r.unwrap_or_else(|e| panic!("connect with server-name rabbit.test: {e}"));
    let (r, took) = try_connect(tls.config(Some("127.0.0.1"), tls.good())).await;
    match r {
        Err(Error::Tls { node, reason }) => {
            assert!(node.starts_with("127.0.0.1:"), "{node}");
            assert!(reason.contains("certificate"), "{reason}");
        }
        other => panic!("expected Error::Tls, got {other:?}"),
    }
    assert!(took < Duration::from_secs(5), "not failed fast: {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_certificate_from_another_ca_fails_fast_with_a_tls_error() {
    let tls = Tls::start("tls-ca");
    let wrong = TlsConfig::new()
        .ca_file(tls.file("other-ca.pem"))
        .client_cert(tls.file("client.pem"), tls.file("client.key"));
    let t0 = Instant::now();
    let err = Worker::new(tls.config(None, wrong))
        .subscribe(Subscriber::new(
            "tls-never",
            counting_handler(Arc::default()),
        ))
        .start()
        .await
        .err();
    let took = t0.elapsed();
    let text = err.as_ref().map(ToString::to_string).unwrap_or_default();
    assert!(matches!(err, Some(Error::Tls { .. })), "{err:?}");
    assert!(
        text.contains("localhost:") && text.contains("UnknownIssuer"),
        "{text}"
    );
    assert!(took < Duration::from_secs(5), "not failed fast: {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_client_certificate_the_broker_refusal_is_a_tls_error() {
    let tls = Tls::start("tls-nocert");
    let (r, took) =
        try_connect(tls.config(None, TlsConfig::new().ca_file(tls.file("ca.pem")))).await;
    match r {
        Err(Error::Tls { reason, .. }) => {
            assert!(reason.contains("client certificate"), "{reason}")
        }
        other => panic!("expected Error::Tls, got {other:?}"),
    }
    assert!(took < Duration::from_secs(5), "not failed fast: {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_mismatched_file_stops_the_start_naming_it() {
    let tls = Tls::start("tls-files");
    let missing = tls.file("absent-ca.pem");
    let start = |t: TlsConfig| {
        Worker::new(tls.config(None, t))
            .subscribe(Subscriber::new(
                "tls-never",
                counting_handler(Arc::default()),
            ))
            .start()
    };
    match start(tls.good().ca_file(&missing)).await.err() {
        Some(Error::TlsFile { file, reason }) => {
            assert_eq!(file, missing);
            assert!(reason.contains("cannot read"), "{reason}");
        }
        other => panic!("expected TlsFile, got {other:?}"),
    }
    // The server's key is not the client certificate's.
    let mismatched = TlsConfig::new()
        .ca_file(tls.file("ca.pem"))
        .client_cert(tls.file("client.pem"), tls.file("server.key"));
    match start(mismatched).await.err() {
        Some(Error::TlsFile { file, .. }) => assert_eq!(file, tls.file("server.key")),
        other => panic!("expected TlsFile, got {other:?}"),
    }
    // A certificate file given as the key.
    let not_a_key = TlsConfig::new()
        .ca_file(tls.file("ca.pem"))
        .client_cert(tls.file("client.pem"), tls.file("client.pem"));
    match start(not_a_key).await.err() {
        Some(Error::TlsFile { file, reason }) => {
            assert_eq!(file, tls.file("client.pem"));
            assert!(reason.contains("private key"), "{reason}");
        }
        other => panic!("expected TlsFile, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_cli_takes_the_tls_settings_as_flags() {
    let tls = Tls::start("tls-cli");
    let url = tls.url(Some("127.0.0.1"));
    let path = |f: &str| tls.file(f).to_string_lossy().into_owned();
    let run = |extra: Vec<String>| {
        let mut args: Vec<String> = ["rabbitkit", "topology", "apply", "tls-cli-q", "--url"]
            .map(String::from)
            .into();
        args.push(url.clone());
        args.extend(extra);
        async move {
            let (mut out, mut err) = (Vec::new(), Vec::new());
            let code = rabbitkit::cli::run(args, &mut out, &mut err).await;
            (code, String::from_utf8_lossy(&err).into_owned())
        }
    };
    let good: Vec<String> = vec![
        "--tls-ca-file".into(),
        path("ca.pem"),
        "--tls-cert-file".into(),
        path("client.pem"),
        "--tls-key-file".into(),
        path("client.key"),
        "--tls-server-name".into(),
        "rabbit.test".into(),
    ];
    let (code, err) = run(good.clone()).await;
    assert_eq!(code, rabbitkit::cli::EXIT_OK, "{err}");
    assert_eq!(tls.vhost.depth("tls-cli-q").await, 0);
    // Without the client certificate: refused, said, exit 1.
    let (code, err) = run(good[..2].iter().chain(&good[6..]).cloned().collect()).await;
    assert_eq!(code, rabbitkit::cli::EXIT_FAILED, "{err}");
    assert!(err.contains("TLS with 127.0.0.1:"), "{err}");
}

/// A TLS listener in front of the node's management API: `socat` with the test server
/// certificate (valid for `localhost`), forwarding to the plain management port. Killed on
/// drop. RabbitMQ's own HTTPS listener would need the node's config changed; what is under
/// test is rabbitkit's client: TLS, certificate checks, HTTP over it.
struct HttpsFront {
    child: std::process::Child,
    port: u16,
}

impl HttpsFront {
    fn start(tls: &Tls) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap();
        let mgmt = tls
            .vhost
            .broker
            .mgmt
            .trim_start_matches("http://")
            .to_owned();
        let cert = tls.file("server.pem").display().to_string();
        let key = tls.file("server.key").display().to_string();
        let child = std::process::Command::new("socat")
            .args([
                format!("OPENSSL-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork,verify=0,cert={cert},key={key}"),
                format!("TCP:{mgmt}"),
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("this test needs socat (apt-get install socat)");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "socat did not listen on {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { child, port }
    }
}

impl Drop for HttpsFront {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn management_over_https_verifies_the_certificate_with_the_connections_ca() {
    use rabbitkit_core::topology::ManagementUrl;
    let tls = Tls::start("tls-mgmt");
    tls.vhost
        .declare_queue("tls-mgmt-q", Default::default())
        .await;
    let front = HttpsFront::start(&tls);
    let url = ManagementUrl::new(format!("https://localhost:{}", front.port));
    // The connection's CA signs the listener's certificate: the queues are listed.
    let listed = url.queues(&tls.config(None, tls.good())).await.unwrap();
    assert!(listed.iter().any(|q| q.name == "tls-mgmt-q"), "{listed:?}");
    // Only the system's roots: the test CA is unknown, and said so.
    let plain = ConnectionConfig::new(tls.url(None));
    let err = url.queues(&plain).await.unwrap_err().to_string();
    assert!(err.contains("TLS handshake failed"), "{err}");
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    // A name the certificate does not hold (127.0.0.1): refused too.
    let by_ip = ManagementUrl::new(format!("https://127.0.0.1:{}", front.port));
    let err = by_ip
        .queues(&tls.config(None, tls.good()))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("TLS handshake failed"), "{err}");
}
