//! Shared support of the benchmarks: broker URL, raw lapin helpers, a fast preloader, the
//! two tokio runtimes, CPU time (this process and the broker) and resident memory from
//! `/proc`, medians, and the Markdown report `scripts/bench` assembles.
#![allow(dead_code, unreachable_pub)]

pub(crate) mod kit;
pub(crate) mod report;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeleteOptions, QueueDeclareOptions,
    QueueDeleteOptions, QueuePurgeOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};

/// Default broker of the benchmarks (the project's 3.10 node).
pub(crate) const DEFAULT_URL: &str = "amqp://guest:guest@127.0.0.1:5680/%2f";

/// Body size of every benchmark message.
pub(crate) const BODY_SIZE: usize = 256;

/// Prefetch of every consumer (raw and rabbitkit).
pub(crate) const PREFETCH: u16 = 200;

/// The broker URL: `RABBITKIT_BENCH_URL`, else [`DEFAULT_URL`].
pub(crate) fn url() -> String {
    std::env::var("RABBITKIT_BENCH_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// A numeric setting from the environment (`name`), else `default`.
pub(crate) fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A 256-byte body.
pub(crate) fn body() -> Vec<u8> {
    (0..BODY_SIZE).map(|i| (i % 251) as u8).collect()
}

/// The runtime a variant runs on. lapin binds a connection's tasks to the runtime it was
/// opened on, so every run opens its connections inside its own runtime.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Flavor {
    /// `tokio::runtime::Builder::new_current_thread` (lapin's I/O loop still has its own thread).
    Current,
    /// A 2-worker multi-thread runtime (what `#[tokio::main]` gives on this machine).
    Multi,
}

impl Flavor {
    /// Short label for tables.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Flavor::Current => "current-thread",
            Flavor::Multi => "multi-thread",
        }
    }
}

/// Both runtimes, built once per bench process.
pub(crate) struct Runtimes {
    current: tokio::runtime::Runtime,
    multi: tokio::runtime::Runtime,
}

impl Runtimes {
    pub(crate) fn new() -> Self {
        Self {
            current: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("current-thread runtime"),
            multi: tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("multi-thread runtime"),
        }
    }

    /// Runs `f` to completion on the runtime of `flavor`, on the calling thread (as a
    /// `#[tokio::main]` body does).
    pub(crate) fn block_on<F: std::future::Future>(&self, flavor: Flavor, f: F) -> F::Output {
        match flavor {
            Flavor::Current => self.current.block_on(f),
            Flavor::Multi => self.multi.block_on(f),
        }
    }
}

/// A plain lapin connection.
pub(crate) async fn connect(url: &str) -> Connection {
    Connection::connect(url, ConnectionProperties::default())
        .await
        .unwrap_or_else(|e| {
            panic!(
                "cannot connect to {}: {e} (is the broker running? `scripts/broker start --version 3`)",
                rabbitkit_core::connection::redact(url)
            )
        })
}

/// Closes `conn`, ignoring errors (end of a run).
pub(crate) async fn close(conn: Connection) {
    let _ = conn.close(200, "bench run done".into()).await;
}

/// A channel in confirm mode.
pub(crate) async fn confirm_channel(conn: &Connection) -> Channel {
    let ch = conn.create_channel().await.expect("create channel");
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirm.select");
    ch
}

pub(crate) use rabbitkit_tests::declare_durable;

/// Declares a durable quorum queue.
pub(crate) async fn declare_quorum(ch: &Channel, queue: &str) {
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    declare_durable(ch, queue, args).await;
}

/// Ready messages in `queue`.
pub(crate) async fn depth(ch: &Channel, queue: &str) -> u32 {
    ch.queue_declare(
        queue.into(),
        QueueDeclareOptions {
            passive: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap_or_else(|e| panic!("passive declare {queue}: {e}"))
    .message_count()
}

/// Ready messages in `queue` once it holds `want`, or after `within` (whatever it holds
/// then). A quorum queue applies settlements through its log, so its count can lag the
/// acks just written by a few milliseconds.
pub(crate) async fn depth_settled(ch: &Channel, queue: &str, want: u32, within: Duration) -> u32 {
    let until = Instant::now() + within;
    loop {
        let d = depth(ch, queue).await;
        if d == want || Instant::now() >= until {
            return d;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Empties `queue`.
pub(crate) async fn purge(ch: &Channel, queue: &str) {
    ch.queue_purge(queue.into(), QueuePurgeOptions::default())
        .await
        .unwrap_or_else(|e| panic!("purge {queue}: {e}"));
}

/// Deletes `queue`, reporting (not failing on) errors.
pub(crate) async fn delete_queue(ch: &Channel, queue: &str) {
    if let Err(e) = ch
        .queue_delete(queue.into(), QueueDeleteOptions::default())
        .await
    {
        eprintln!("cleanup: cannot delete queue {queue}: {e}");
    }
}

/// Deletes `exchange`, reporting (not failing on) errors.
pub(crate) async fn delete_exchange(ch: &Channel, exchange: &str) {
    if let Err(e) = ch
        .exchange_delete(exchange.into(), ExchangeDeleteOptions::default())
        .await
    {
        eprintln!("cleanup: cannot delete exchange {exchange}: {e}");
    }
}

/// Persistent properties with a message id (what every preloaded message carries).
pub(crate) fn persistent(id: usize) -> BasicProperties {
    BasicProperties::default()
        .with_delivery_mode(2)
        .with_message_id(format!("bench-{id}").into())
}

/// Panics unless `c` is a plain broker ack.
pub(crate) fn check_confirm(c: lapin::Result<Confirmation>) {
    match c {
        Ok(Confirmation::Ack(None)) => {}
        other => panic!("publish not confirmed: {other:?}"),
    }
}

/// Preloads `queue` with `n` persistent messages carrying message ids (window 1000,
/// default exchange, every publish confirmed) and checks the depth.
pub(crate) async fn preload(ch: &Channel, queue: &str, body: &[u8], n: usize) {
    let mut pending = FuturesUnordered::new();
    for i in 0..n {
        if pending.len() >= 1000
            && let Some(c) = pending.next().await
        {
            check_confirm(c);
        }
        let confirm = ch
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                body,
                persistent(i),
            )
            .await
            .expect("basic.publish");
        pending.push(confirm);
    }
    while let Some(c) = pending.next().await {
        check_confirm(c);
    }
    let d = depth(ch, queue).await;
    assert!(
        d as usize >= n,
        "preload: {queue} holds {d} messages, expected {n}"
    );
}

/// Clock ticks per second of `/proc/<pid>/stat` times.
pub(crate) fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .trim()
                .parse::<f64>()
                .ok()
        })
        .filter(|t| *t > 0.0)
        .unwrap_or(100.0)
}

/// User + system CPU seconds of process `pid` (`self` for this one), from
/// `/proc/<pid>/stat` (clock-tick resolution).
pub(crate) fn proc_cpu_seconds(pid: &str, ticks: f64) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces) start at field 3.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) / ticks)
}

/// CPU nanoseconds of each of this process's threads, from `/proc/self/task/*/schedstat`
/// (nanosecond resolution; `/proc/self/stat` counts 10 ms ticks, too coarse for a run
/// that uses a tenth of a second). `None` when the kernel does not expose it.
fn thread_cpu_ns() -> Option<HashMap<u32, u64>> {
    let mut out = HashMap::new();
    for entry in std::fs::read_dir("/proc/self/task").ok()? {
        let Ok(entry) = entry else { continue };
        let Some(tid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        // A thread may exit between the listing and the read: skip it.
        let Ok(s) = std::fs::read_to_string(entry.path().join("schedstat")) else {
            continue;
        };
        let ns = s.split_whitespace().next()?.parse().ok()?;
        out.insert(tid, ns);
    }
    Some(out)
}

/// The broker's OS process id (its Erlang VM, `beam.smp`), from
/// `RABBITKIT_BENCH_BROKER_PID`; `scripts/bench` sets it.
pub(crate) fn broker_pid() -> Option<String> {
    std::env::var("RABBITKIT_BENCH_BROKER_PID")
        .ok()
        .filter(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
}

/// Waits (untimed, at most 20 s) until the broker is idle: under 5 % of one core over a
/// 400 ms window. The broker goes on deleting and paging persistent messages after a round
/// or a preload; a round started during that work would pay for the one before it. Every
/// variant starts from an idle broker. Returns how long it waited; without a broker pid,
/// does nothing.
pub(crate) async fn quiesce() -> Duration {
    let started = std::time::Instant::now();
    let Some(pid) = broker_pid() else {
        return Duration::ZERO;
    };
    let ticks = clock_ticks();
    let window = Duration::from_millis(400);
    while started.elapsed() < Duration::from_secs(20) {
        let Some(a) = proc_cpu_seconds(&pid, ticks) else {
            break;
        };
        tokio::time::sleep(window).await;
        let Some(b) = proc_cpu_seconds(&pid, ticks) else {
            break;
        };
        if b - a < 0.05 * window.as_secs_f64() {
            break;
        }
    }
    started.elapsed()
}

/// A `/proc/self/status` field in KiB (`VmRSS`, `VmHWM`).
pub(crate) fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Current resident set, MiB.
pub(crate) fn rss_mib() -> f64 {
    status_kib("VmRSS") as f64 / 1024.0
}

/// Peak resident set so far (since start or the last [`reset_peak`]), MiB.
pub(crate) fn hwm_mib() -> f64 {
    status_kib("VmHWM") as f64 / 1024.0
}

/// Resets the peak resident set to the current one (Linux `clear_refs` value 5).
pub(crate) fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// The median (mean of the two middle values for an even count).
pub(crate) fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// Messages per second.
pub(crate) fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

/// One measured run of a variant.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sample {
    /// Messages per second.
    pub(crate) rate: f64,
    /// Process CPU seconds per 10k messages over the timed window (all threads).
    pub(crate) cpu_per_10k: f64,
    /// Peak resident set during the run, MiB.
    pub(crate) peak_mib: f64,
    /// Broker CPU seconds per 10k messages over the timed window (NaN when the broker
    /// pid is unknown).
    pub(crate) broker_cpu_per_10k: f64,
}

/// Samples of one variant across rounds.
#[derive(Debug, Clone)]
pub(crate) struct Series {
    pub(crate) name: String,
    /// A raw lapin baseline (a candidate for "best raw").
    pub(crate) raw: bool,
    pub(crate) samples: Vec<Sample>,
}

impl Series {
    pub(crate) fn new(name: impl Into<String>, raw: bool) -> Self {
        Self {
            name: name.into(),
            raw,
            samples: Vec::new(),
        }
    }

    fn column(&self, f: impl Fn(&Sample) -> f64) -> Vec<f64> {
        self.samples.iter().map(f).collect()
    }

    pub(crate) fn median_rate(&self) -> f64 {
        median(&self.column(|s| s.rate))
    }

    pub(crate) fn min_rate(&self) -> f64 {
        self.column(|s| s.rate).into_iter().fold(f64::NAN, f64::min)
    }

    pub(crate) fn max_rate(&self) -> f64 {
        self.column(|s| s.rate).into_iter().fold(f64::NAN, f64::max)
    }

    pub(crate) fn median_cpu(&self) -> f64 {
        median(&self.column(|s| s.cpu_per_10k))
    }

    pub(crate) fn median_broker_cpu(&self) -> f64 {
        median(&self.column(|s| s.broker_cpu_per_10k))
    }

    pub(crate) fn max_peak(&self) -> f64 {
        self.column(|s| s.peak_mib).into_iter().fold(0.0, f64::max)
    }
}

/// Prints one finished run.
pub(crate) fn print_run(round: usize, name: &str, s: &Sample) {
    println!(
        "round {round} {name:<52} {:>8.0} msg/s  cpu {:.3} s/10k  broker {:.3} s/10k  peak {:.1} MiB",
        s.rate, s.cpu_per_10k, s.broker_cpu_per_10k, s.peak_mib
    );
}

/// CPU meter of this process and, when known, the broker.
#[derive(Debug, Clone)]
pub(crate) struct Meter {
    pub(crate) ticks: f64,
    pub(crate) broker: Option<String>,
}

/// A reading of a [`Meter`] at one instant.
#[derive(Debug, Clone)]
pub(crate) struct Mark {
    pub(crate) at: Instant,
    /// Per-thread CPU nanoseconds (None: fall back to `cpu`).
    threads: Option<HashMap<u32, u64>>,
    /// Process CPU seconds from `/proc/self/stat`.
    cpu: f64,
    /// Broker CPU seconds (NaN when unknown).
    broker_cpu: f64,
}

impl Meter {
    pub(crate) fn new() -> Self {
        let broker = broker_pid();
        if broker.is_none() {
            eprintln!(
                "RABBITKIT_BENCH_BROKER_PID is not set: the broker CPU column will be NaN \
                 (scripts/bench sets it to the node's beam.smp pid)"
            );
        }
        Self {
            ticks: clock_ticks(),
            broker,
        }
    }

    pub(crate) fn mark(&self) -> Mark {
        Mark {
            at: Instant::now(),
            threads: thread_cpu_ns(),
            cpu: proc_cpu_seconds("self", self.ticks).unwrap_or(f64::NAN),
            broker_cpu: self
                .broker
                .as_deref()
                .and_then(|p| proc_cpu_seconds(p, self.ticks))
                .unwrap_or(f64::NAN),
        }
    }

    /// Process CPU seconds between two marks: the sum over the threads alive at `end` of
    /// their time since `start` (a thread born in between counts from zero; a thread that
    /// exited in between is lost, which is why runs open their connections before
    /// `start` and close them after `end`).
    pub(crate) fn cpu_between(start: &Mark, end: &Mark) -> f64 {
        match (&start.threads, &end.threads) {
            (Some(a), Some(b)) => {
                let ns: u64 = b
                    .iter()
                    .map(|(tid, e)| e.saturating_sub(a.get(tid).copied().unwrap_or(0)))
                    .sum();
                ns as f64 / 1e9
            }
            _ => end.cpu - start.cpu,
        }
    }

    /// The sample of `n` messages between `start` and `end`; `peak_mib` is read now.
    pub(crate) fn sample(n: usize, start: &Mark, end: &Mark) -> Sample {
        let per_10k = 10_000.0 / n as f64;
        Sample {
            rate: rate(n, end.at - start.at),
            cpu_per_10k: Self::cpu_between(start, end) * per_10k,
            peak_mib: hwm_mib(),
            broker_cpu_per_10k: (end.broker_cpu - start.broker_cpu) * per_10k,
        }
    }
}

/// A unique suffix for this run's queue names.
pub(crate) fn unique() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    format!("{}-{t:x}", std::process::id())
}

/// Runs `variants` for `rounds` rounds, rotating the order each round so no variant always
/// runs first (slow drift of a shared machine then spreads over all of them).
pub(crate) fn rounds<V: Copy>(
    variants: &[(V, Series)],
    rounds: usize,
    mut run: impl FnMut(V) -> Sample,
) -> Vec<Series> {
    let mut out: Vec<Series> = variants.iter().map(|(_, s)| s.clone()).collect();
    for r in 0..rounds {
        for k in 0..variants.len() {
            let idx = (k + r) % variants.len();
            let s = run(variants[idx].0);
            print_run(r + 1, &out[idx].name, &s);
            out[idx].samples.push(s);
        }
    }
    out
}
