//! rabbitkit against the Python frameworks users would otherwise pick, same broker, same
//! process driving them, alternating rounds: the `rabbitkit` package (PyPI; the settlement
//! design this project follows) and FastStream, from the virtualenv `scripts/bench`
//! creates (`PEER_PYTHON`). The peers' scripts are `tests/benches/peers/*.py`.
//!
//! Workloads (256-byte persistent messages, N preloaded untimed, prefetch 200, window from
//! the handler's first call to the N-th ack written):
//! - success: the handler returns, the framework acks;
//! - failure: the handler fails; a copy is published (mandatory, confirmed) and the
//!   original acked only after the confirm. rabbitkit: one retry tier of 1 h, classic
//!   tiers (like-for-like with the peers' classic queues) and quorum tiers (the default).
//!   Python rabbitkit: its RetryMiddleware (`max_retries=1, delays=(3600,)`). FastStream: a
//!   republish middleware (it has no confirmed retry of its own).
//!
//! Each peer run is a fresh Python process (start-up and topology untimed); it measures its
//! own window (process CPU from getrusage, broker CPU from the same /proc file, peak RSS)
//! and prints `PEER_RESULT {json}`.
//!
//! Settings (environment): `PEER_PYTHON` (required; without it the report says the peers
//! were not run), `RABBITKIT_BENCH_URL`, `RABBITKIT_BENCH_BROKER_PID`, `BENCH_ROUNDS` (5),
//! `BENCH_PEER_MESSAGES` (20000), `BENCH_REPORT_DIR` (where `peers.md` goes).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use lapin::Channel;
use rabbitkit_core::QueueType;
use serde::Deserialize;

use common::kit::{self, Spec};
use common::report::Report;
use common::{Flavor, Meter, PREFETCH, Runtimes, Sample, Series};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Peer {
    PyRabbitkit,
    FastStream,
}

impl Peer {
    fn script(self) -> &'static str {
        match self {
            Peer::PyRabbitkit => "rabbitkit_peer.py",
            Peer::FastStream => "faststream_peer.py",
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Peer::PyRabbitkit => "py-rabbitkit",
            Peer::FastStream => "faststream",
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Variant {
    Kit(Spec),
    Peer(Peer, bool),
}

impl Variant {
    fn label(self) -> String {
        match self {
            Variant::Kit(s) if !s.fail => "rabbitkit (Rust) Ok, multi-thread".into(),
            Variant::Kit(s) => format!(
                "rabbitkit (Rust) retry, {} tiers, multi-thread",
                match s.tiers {
                    QueueType::Classic => "classic",
                    QueueType::Quorum => "quorum",
                }
            ),
            Variant::Peer(Peer::PyRabbitkit, false) => "rabbitkit 0.19 (Python) AsyncBroker".into(),
            Variant::Peer(Peer::PyRabbitkit, true) => {
                "rabbitkit 0.19 (Python) RetryMiddleware".into()
            }
            Variant::Peer(Peer::FastStream, false) => "FastStream 0.7 RabbitBroker".into(),
            Variant::Peer(Peer::FastStream, true) => "FastStream 0.7 + republish middleware".into(),
        }
    }
}

/// The queues of one peer workload, as its `declare` printed them.
#[derive(Debug, Clone, Deserialize)]
struct PeerQueues {
    work: String,
    copies: Option<String>,
}

/// A peer's `PEER_RESULT`.
#[derive(Debug, Deserialize)]
struct PeerResult {
    rate: f64,
    cpu_per_10k: f64,
    broker_cpu_per_10k: Option<f64>,
    peak_mib: f64,
}

struct Ctx {
    url: String,
    python: PathBuf,
    scripts: PathBuf,
    base: String,
    body: Vec<u8>,
    admin: Channel,
    loader: Channel,
    meter: Arc<Meter>,
}

impl Ctx {
    fn kit_queue(&self) -> String {
        format!("{}.rust", self.base)
    }

    fn peer_queue(&self, p: Peer, fail: bool) -> String {
        format!(
            "{}.{}.{}",
            self.base,
            p.tag(),
            if fail { "failure" } else { "success" }
        )
    }

    /// Runs a peer script; returns the JSON after `tag` on its stdout.
    fn python<T: for<'de> Deserialize<'de>>(&self, p: Peer, args: &[String], tag: &str) -> T {
        let out = Command::new(&self.python)
            .arg(self.scripts.join(p.script()))
            .args(args)
            .current_dir(&self.scripts)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.python.display()));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{} {args:?} failed ({}):\n{stdout}\n{}",
            p.script(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let line = stdout
            .lines()
            .find_map(|l| l.strip_prefix(tag))
            .unwrap_or_else(|| panic!("{} printed no {tag}:\n{stdout}", p.script()));
        serde_json::from_str(line.trim()).unwrap_or_else(|e| panic!("{tag} {line}: {e}"))
    }

    fn args(&self, cmd: &str, p: Peer, fail: bool) -> Vec<String> {
        vec![
            cmd.into(),
            "--url".into(),
            self.url.clone(),
            "--queue".into(),
            self.peer_queue(p, fail),
            "--path".into(),
            if fail { "failure" } else { "success" }.into(),
            "--prefetch".into(),
            PREFETCH.to_string(),
        ]
    }

    fn declare_peer(&self, p: Peer, fail: bool) -> PeerQueues {
        self.python(p, &self.args("declare", p, fail), "PEER_QUEUES ")
    }

    fn queues(&self, v: Variant, peers: &[(Peer, bool, PeerQueues)]) -> (String, Option<String>) {
        match v {
            Variant::Kit(s) => (
                self.kit_queue(),
                s.fail
                    .then(|| kit::copies_queue(&self.kit_queue(), s.tiers)),
            ),
            Variant::Peer(p, fail) => {
                let q = peers
                    .iter()
                    .find(|(pp, f, _)| *pp == p && *f == fail)
                    .map(|(_, _, q)| q.clone())
                    .expect("declared peer");
                (q.work, q.copies)
            }
        }
    }
}

fn main() {
    let url = common::url();
    let rounds = common::env_usize("BENCH_ROUNDS", 5);
    let n = common::env_usize("BENCH_PEER_MESSAGES", 20_000);
    let mut report = Report::open("peers");
    let Some(python) = std::env::var_os("PEER_PYTHON")
        .map(PathBuf::from)
        .filter(|p| p.exists())
    else {
        report.line("");
        report.line(
            "**Peers not run**: `PEER_PYTHON` is not set or does not exist (`scripts/bench` \
             sets it to the virtualenv it creates; see the install log above).",
        );
        eprintln!("PEER_PYTHON not set: peers not run");
        return;
    };
    let rts = Runtimes::new();
    let started = Instant::now();
    let base = format!("rk-bench-peers-{}", common::unique());

    let (ctx, conns) = rts.block_on(Flavor::Multi, async {
        let admin_conn = common::connect(&url).await;
        let loader_conn = common::connect(&url).await;
        let ctx = Ctx {
            url: url.clone(),
            python,
            scripts: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/peers"),
            base: base.clone(),
            body: common::body(),
            admin: admin_conn.create_channel().await.expect("admin channel"),
            loader: common::confirm_channel(&loader_conn).await,
            meter: Arc::new(Meter::new()),
        };
        kit::declare(&url, &ctx.kit_queue(), Spec::fail(QueueType::Classic)).await;
        kit::declare(&url, &ctx.kit_queue(), Spec::fail(QueueType::Quorum)).await;
        (ctx, (admin_conn, loader_conn))
    });
    let mut peers = Vec::new();
    for p in [Peer::PyRabbitkit, Peer::FastStream] {
        for fail in [false, true] {
            peers.push((p, fail, ctx.declare_peer(p, fail)));
        }
    }
    println!(
        "peers bench: broker {}, {rounds} rounds x {n} msgs, python {}",
        rabbitkit_core::connection::redact(&url),
        ctx.python.display()
    );

    let run = |v: Variant, n: usize| -> Sample {
        let (work, copies) = ctx.queues(v, &peers);
        rts.block_on(Flavor::Multi, async {
            common::purge(&ctx.admin, &work).await;
            if let Some(c) = &copies {
                common::purge(&ctx.admin, c).await;
            }
            common::preload(&ctx.loader, &work, &ctx.body, n).await;
        });
        let s = match v {
            Variant::Kit(spec) => rts.block_on(Flavor::Multi, async {
                common::reset_peak();
                let r = kit::run(&ctx.url, &work, spec, n, ctx.meter.clone(), None).await;
                Meter::sample(n, &r.start, &r.end)
            }),
            Variant::Peer(p, fail) => {
                let mut args = ctx.args("run", p, fail);
                args.extend(["-n".into(), n.to_string()]);
                let r: PeerResult = ctx.python(p, &args, "PEER_RESULT ");
                Sample {
                    rate: r.rate,
                    cpu_per_10k: r.cpu_per_10k,
                    peak_mib: r.peak_mib,
                    broker_cpu_per_10k: r.broker_cpu_per_10k.unwrap_or(f64::NAN),
                }
            }
        };
        rts.block_on(Flavor::Multi, async {
            let left = common::depth(&ctx.admin, &work).await;
            assert_eq!(left, 0, "{v:?}: {left} left in {work}");
            if let Some(c) = &copies {
                let d = common::depth(&ctx.admin, c).await as usize;
                assert_eq!(d, n, "{v:?}: {d} copies in {c}, expected {n}");
            }
        });
        s
    };

    let ok: Vec<(Variant, Series)> = [
        Variant::Kit(Spec::OK),
        Variant::Peer(Peer::PyRabbitkit, false),
        Variant::Peer(Peer::FastStream, false),
    ]
    .into_iter()
    .map(|v| (v, Series::new(v.label(), false)))
    .collect();
    let fail: Vec<(Variant, Series)> = [
        Variant::Kit(Spec::fail(QueueType::Classic)),
        Variant::Peer(Peer::PyRabbitkit, true),
        Variant::Peer(Peer::FastStream, true),
        Variant::Kit(Spec::fail(QueueType::Quorum)),
    ]
    .into_iter()
    .map(|v| (v, Series::new(v.label(), false)))
    .collect();
    // Warm-up (untimed): one short run of each.
    for (v, _) in ok.iter().chain(fail.iter()) {
        run(*v, n.min(1_000));
    }
    let ok_series = common::rounds(&ok, rounds, |v| run(v, n));
    let fail_series = common::rounds(&fail, rounds, |v| run(v, n));

    rts.block_on(Flavor::Multi, async {
        kit::cleanup(&ctx.admin, &ctx.kit_queue()).await;
        for (_, _, q) in &peers {
            common::delete_queue(&ctx.admin, &q.work).await;
            if let Some(c) = &q.copies {
                common::delete_queue(&ctx.admin, c).await;
            }
            // Python rabbitkit also provisions a dead-letter queue per route.
            common::delete_queue(&ctx.admin, &format!("{}.dlq", q.work)).await;
        }
        common::close(conns.0).await;
        common::close(conns.1).await;
    });

    report.table(
        &format!(
            "Peers, success path: {n} messages, prefetch {PREFETCH} — first handler call → N-th ack"
        ),
        &ok_series,
    );
    // The Python frameworks are client-CPU-bound; rabbitkit is expected at 6× or more.
    for peer in &ok_series[1..] {
        let w = format!("success path vs {}", peer.name);
        report.compare(&w, &ok_series[0], peer, Some(6.0), None);
    }
    report.table(
        &format!(
            "Peers, failure path: {n} messages, prefetch {PREFETCH}, confirmed copy then ack — first handler call → N-th ack"
        ),
        &fail_series,
    );
    for peer in &fail_series[1..3] {
        let w = format!("failure path vs {}", peer.name);
        report.compare(&w, &fail_series[0], peer, Some(6.0), None);
        report.compare(&w, &fail_series[3], peer, None, None);
    }
    report.line(format!(
        "\nTotal bench time {:.0} s.",
        started.elapsed().as_secs_f64()
    ));
}
