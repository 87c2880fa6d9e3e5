//! The demo (`scripts/demo`): a config-driven worker settles a mixed workload, and the
//! settlement summary is counted from the broker.
//!
//! 1. Loads `examples/demo.toml` (RABBITKIT_URL overrides its URL) and starts the worker
//!    with its metrics endpoint.
//! 2. Publishes `DEMO_MESSAGES` (1000) orders through the confirmed publisher: 80 % succeed
//!    at once, 10 % fail once or twice and succeed from a retry tier, 5 % hit a "broken
//!    downstream" and are parked after 3 attempts, 5 % are not JSON (parked at once).
//! 3. Shows a live progress line until everything is settled, then a summary counted from
//!    the broker (work queue, tiers and parking queue depths, parked messages by reason)
//!    and from the handler, and checks the metrics endpoint reports the same counts.
//! 4. "Deploys the fix" and replays the parked broken-downstream orders back into the work
//!    queue, with the operator CLI (`RABBITKIT_CLI`, which `scripts/demo` sets) or the
//!    library when it is not set; they succeed, and only the poison stays parked.
//!
//! Exits non-zero if any message is lost or a count disagrees.

use std::collections::HashSet;
use std::io::{IsTerminal, Read, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use rabbitkit::config::{Handlers, WorkerConfig};
use rabbitkit::prelude::*;
use rabbitkit::{Parking, WorkerHandle};
use rabbitkit_examples::check;
use serde::{Deserialize, Serialize};

const QUEUE: &str = "demo.orders";
const TIERS: [&str; 2] = ["demo.orders.delay.500ms", "demo.orders.delay.2s"];
const PARKING: &str = "demo.orders.parking";

#[derive(Debug, Serialize, Deserialize)]
struct Order {
    id: u32,
    /// `ok`, `flaky` (fails `fail` times) or `broken` (fails until the fix).
    kind: String,
    fail: u32,
}

/// What the handler shares with the demo.
#[derive(Clone, Default)]
struct Demo {
    succeeded: Arc<Mutex<HashSet<u32>>>,
    fixed: Arc<AtomicBool>,
}

async fn orders(
    a: Attempt,
    State(demo): State<Demo>,
    Json(o): Json<Order>,
) -> Result<(), BoxError> {
    match o.kind.as_str() {
        "flaky" if a.number <= o.fail => {
            return Err(format!("inventory service busy (attempt {})", a.number).into());
        }
        "broken" if !demo.fixed.load(Ordering::SeqCst) => {
            return Err("payment provider rejects the request (v1 API retired)".into());
        }
        _ => {}
    }
    if let Ok(mut s) = demo.succeeded.lock() {
        s.insert(o.id);
    }
    Ok(())
}

/// The published mix, by order id.
fn kind(i: u32) -> (&'static str, u32) {
    match i % 20 {
        0..=15 => ("ok", 0),
        16 => ("flaky", 1),
        17 => ("flaky", 2),
        18 => ("broken", 0),
        _ => ("poison", 0),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("\ndemo: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), BoxError> {
    let n: u32 = std::env::var("DEMO_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let config = WorkerConfig::load("examples/demo.toml")?;
    tracing_subscriber::fmt()
        .with_max_level(config.observability.log_level.as_tracing())
        .with_target(false)
        // Colour only on a terminal: scripts/examples writes this to a log file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .compact()
        .init();
    let conn_cfg = config.connection.to_connection_config();
    let url = conn_cfg.urls[0].clone();
    let vhost = conn_cfg.validate()?.vhost;
    let broker = lapin::Connection::connect(&url, Default::default()).await?;
    let admin = broker.create_channel().await?;
    // A fresh start: what an earlier run left is not this run's evidence.
    for q in [QUEUE, PARKING].iter().chain(TIERS.iter()) {
        admin
            .queue_delete((*q).into(), QueueDeleteOptions::default())
            .await?;
    }

    let demo = Demo::default();
    let handlers = Handlers::new().handler("orders", orders);
    let worker = rabbitkit::worker::from_config(&config, &handlers)?
        .state(demo.clone())
        .start()
        .await?;
    let metrics_addr = worker
        .http_addr()
        .ok_or("demo.toml sets http-listen: the endpoint should be up")?;
    println!(
        "worker up: queue {QUEUE}, tiers 500ms and 2s, 3 attempts; metrics on http://{metrics_addr}/metrics"
    );

    let started = Instant::now();
    let envelopes = (0..n).map(|i| {
        let (k, fail) = kind(i);
        let id = format!("demo-{i}");
        if k == "poison" {
            Envelope::new(
                "demo",
                "order.created",
                format!("{{not json #{i}").into_bytes(),
            )
            .message_id(id)
        } else {
            let o = Order {
                id: i,
                kind: k.into(),
                fail,
            };
            match Envelope::json("demo", "order.created", &o) {
                Ok(e) => e.message_id(id),
                Err(_) => Envelope::new("demo", "order.created", Vec::new()),
            }
        }
    });
    let outcomes: Vec<_> = worker.publisher().publish_many(envelopes).collect().await;
    let confirmed = outcomes
        .iter()
        .filter(|(_, o)| matches!(o, Ok(o) if o.is_confirmed()))
        .count() as u32;
    check(confirmed == n, "every order published and confirmed")?;
    let count = |k: &str| (0..n).filter(|i| kind(*i).0 == k).count() as u32;
    let (ok, flaky, broken, poison) = (
        count("ok"),
        count("flaky"),
        count("broken"),
        count("poison"),
    );
    println!(
        "published {n} orders in {:.1?}: {ok} fine, {flaky} flaky, {broken} hit a broken downstream, {poison} not JSON",
        started.elapsed()
    );

    let depth = |q: &'static str| {
        let admin = admin.clone();
        async move {
            admin
                .queue_declare(
                    q.into(),
                    QueueDeclareOptions {
                        passive: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await
                .map(|q| q.message_count())
        }
    };
    let succeeded = || demo.succeeded.lock().map(|s| s.len() as u32).unwrap_or(0);
    let tty = std::io::stdout().is_terminal();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last_line = Instant::now();
    loop {
        let s = worker.stats(QUEUE).unwrap_or_default();
        let (work, t1, t2, parked) = (
            depth(QUEUE).await?,
            depth(TIERS[0]).await?,
            depth(TIERS[1]).await?,
            depth(PARKING).await?,
        );
        let line = format!(
            "  consumed {:>5} | succeeded {:>4} | retried {:>4} | parked {:>3} | waiting: work {:>4}, tiers {:>3}",
            s.consumed,
            succeeded(),
            s.retried,
            parked,
            work,
            t1 + t2
        );
        // Quiet: every delivery settled (acked), nothing waiting anywhere.
        let done = succeeded() == ok + flaky
            && parked == broken + poison
            && work + t1 + t2 == 0
            && s.acked == s.consumed;
        if tty {
            print!("\r{line}");
            let _ = std::io::stdout().flush();
        } else if done || last_line.elapsed() > Duration::from_secs(2) {
            println!("{line}");
            last_line = Instant::now();
        }
        if done {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("not settled after 120 s: {line}").into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    if tty {
        println!();
    }

    // The summary, counted from the broker.
    let parking = Parking::new(conn_cfg.clone(), QUEUE)?;
    let parked_msgs = parking.peek(n as usize).await?;
    let reason = |r: &str| {
        parked_msgs
            .iter()
            .filter(|m| m.reason.as_deref() == Some(r))
            .count()
    };
    let parked_ids: HashSet<String> = parked_msgs
        .iter()
        .filter_map(|m| m.message_id().map(str::to_owned))
        .collect();
    let ok_ids: HashSet<String> = demo
        .succeeded
        .lock()
        .map(|s| s.iter().map(|i| format!("demo-{i}")).collect())
        .unwrap_or_default();
    let lost = (0..n)
        .map(|i| format!("demo-{i}"))
        .filter(|id| !ok_ids.contains(id) && !parked_ids.contains(id))
        .count();
    let stats = worker.stats(QUEUE).unwrap_or_default();
    println!(
        "\nsettlement summary ({:.1?}), counted from the broker:",
        started.elapsed()
    );
    println!("  published and confirmed  {n:>5}");
    println!(
        "  succeeded                {:>5}  ({} of them after a retry; {} retry copies in all)",
        ok_ids.len(),
        flaky,
        stats.retried
    );
    println!(
        "  parked                   {:>5}  ({} decode: not JSON, {} max-attempts: broken downstream)",
        parked_msgs.len(),
        reason("decode"),
        reason("max-attempts")
    );
    println!("  left in work queue       {:>5}", depth(QUEUE).await?);
    println!(
        "  left in retry tiers      {:>5}",
        depth(TIERS[0]).await? + depth(TIERS[1]).await?
    );
    println!("  lost                     {lost:>5}");
    check(lost == 0, "no message lost")?;
    check(
        reason("decode") as u32 == poison && reason("max-attempts") as u32 == broken,
        "parked messages carry their reason",
    )?;
    metrics_agree(&worker, metrics_addr, &vhost)?;

    // The fix is deployed: replay what the broken downstream parked.
    demo.fixed.store(true, Ordering::SeqCst);
    let replayed = replay(&parking, &conn_cfg).await?;
    println!("fix deployed; replayed {replayed} parked orders into {QUEUE}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while succeeded() < ok + flaky + broken || depth(PARKING).await? != poison {
        if Instant::now() > deadline {
            return Err(format!(
                "replayed orders not processed: {} succeeded, {} parked",
                succeeded(),
                depth(PARKING).await?
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "after the replay: succeeded {}, parked {} (only the poison), lost 0",
        succeeded(),
        depth(PARKING).await?
    );
    parking.close().await;
    let report = worker.shutdown().await;
    let s = report.subscribers.get(QUEUE).copied().unwrap_or_default();
    println!(
        "worker stopped: consumed {}, acked {}, retried {}, parked {}, copies not confirmed {}",
        s.consumed, s.acked, s.retried, s.parked, s.settlement_failures
    );
    let _ = broker.close(200, "demo done".into()).await;
    Ok(())
}

/// Replays the parked broken-downstream orders: through the operator CLI when
/// `RABBITKIT_CLI` names its binary, else through the library.
async fn replay(parking: &Parking, conn: &ConnectionConfig) -> Result<usize, BoxError> {
    if let Some(cli) = std::env::var_os("RABBITKIT_CLI") {
        let args = ["parking", "replay", QUEUE, "--error-kind", "error"];
        println!("$ rabbitkit {}", args.join(" "));
        let out = std::process::Command::new(cli)
            .args(args)
            .env("RABBITKIT_URL", conn.urls.join(","))
            .output()?;
        print!("{}", String::from_utf8_lossy(&out.stdout));
        check(out.status.success(), "the CLI replay succeeded")?;
        let text = String::from_utf8_lossy(&out.stdout);
        // "N replayed into QUEUE, ..."
        let n = text
            .split_whitespace()
            .next()
            .and_then(|w| w.parse().ok())
            .ok_or("the CLI did not say how many it replayed")?;
        return Ok(n);
    }
    let report = parking
        .replay_matching(usize::MAX, |m| m.reason.as_deref() == Some("max-attempts"))
        .await?;
    Ok(report.replayed as usize)
}

/// Scrapes the worker's `/metrics` and compares it with the worker's own counters.
fn metrics_agree(
    worker: &WorkerHandle,
    addr: std::net::SocketAddr,
    vhost: &str,
) -> Result<(), BoxError> {
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    // Summed over the other labels: parked has one series per reason.
    let value = |name: &str| {
        let values: Vec<f64> = text
            .lines()
            .filter(|l| l.split(['{', ' ']).next() == Some(name))
            .filter(|l| l.contains(&format!(r#"queue="{QUEUE}""#)))
            .filter(|l| l.contains(&format!(r#"vhost="{vhost}""#)))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .collect();
        (!values.is_empty()).then(|| values.iter().sum::<f64>() as u64)
    };
    let st = worker.stats(QUEUE).unwrap_or_default();
    let pairs = [
        ("rabbitkit_acked_total", st.acked),
        ("rabbitkit_retried_total", st.retried),
        ("rabbitkit_parked_total", st.parked),
        (
            "rabbitkit_settlement_failures_total",
            st.settlement_failures,
        ),
    ];
    for (name, want) in pairs {
        check(
            value(name) == Some(want),
            &format!("/metrics {name} = {want}"),
        )?;
    }
    Ok(())
}
