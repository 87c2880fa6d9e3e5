//! Shared support of the benchmarks: broker URL, raw lapin helpers, a fast preloader,
//! process CPU time and resident memory from `/proc`, medians and tables.
#![allow(dead_code)]

use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeleteOptions, QueueDeclareOptions,
    QueueDeleteOptions, QueuePurgeOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};

/// Default broker of the benchmarks (the project's 3.10 node).
pub(crate) const DEFAULT_URL: &str = "amqp://guest:guest@127.0.0.1:5680/%2f";

/// Body size of every benchmark message.
pub(crate) const BODY_SIZE: usize = 256;

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

/// A plain lapin connection.
pub(crate) async fn connect(url: &str) -> Connection {
    Connection::connect(url, ConnectionProperties::default())
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e} (is the broker running? `scripts/broker start --version 3`)"))
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

/// Publishes `n` persistent messages to `queue` through the default exchange on a confirm
/// channel, `window` confirms outstanding at most; panics unless every one is acked.
pub(crate) async fn publish_raw_pipelined(
    ch: &Channel,
    queue: &str,
    body: &[u8],
    n: usize,
    window: usize,
    message_ids: bool,
) {
    let mut pending = FuturesUnordered::new();
    for i in 0..n {
        if pending.len() >= window {
            check_confirm(pending.next().await);
        }
        let props = if message_ids {
            persistent(i)
        } else {
            BasicProperties::default().with_delivery_mode(2)
        };
        let confirm = ch
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions {
                    mandatory: true,
                    immediate: false,
                },
                body,
                props,
            )
            .await
            .expect("basic.publish");
        pending.push(confirm);
    }
    while let Some(c) = pending.next().await {
        check_confirm(Some(c));
    }
}

/// Panics unless `c` is a plain broker ack.
pub(crate) fn check_confirm(c: Option<lapin::Result<Confirmation>>) {
    match c {
        Some(Ok(Confirmation::Ack(None))) => {}
        other => panic!("publish not confirmed: {other:?}"),
    }
}

/// Preloads `queue` with `n` messages as fast as possible (window 1000) and checks the depth.
pub(crate) async fn preload(ch: &Channel, queue: &str, body: &[u8], n: usize) {
    publish_raw_pipelined(ch, queue, body, n, 1000, true).await;
    let d = depth(ch, queue).await;
    assert!(
        d as usize >= n,
        "preload: {queue} holds {d} messages, expected {n}"
    );
}

/// Clock ticks per second of `/proc/self/stat` times.
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

/// User + system CPU seconds of this process so far (all threads), from `/proc/self/stat`.
pub(crate) fn cpu_seconds(ticks: f64) -> f64 {
    proc_cpu_seconds("self", ticks).expect("read /proc/self/stat")
}

/// The broker's OS process id, from `RABBITKIT_BENCH_BROKER_PID` (optional: when set, the
/// broker's CPU time is reported too).
pub(crate) fn broker_pid() -> Option<String> {
    std::env::var("RABBITKIT_BENCH_BROKER_PID")
        .ok()
        .filter(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
}

/// CPU seconds of the broker so far, when its pid is known.
pub(crate) fn broker_cpu_seconds(pid: Option<&str>, ticks: f64) -> Option<f64> {
    proc_cpu_seconds(pid?, ticks)
}

/// User + system CPU seconds of process `pid` (`self` for this one), from `/proc/<pid>/stat`.
pub(crate) fn proc_cpu_seconds(pid: &str, ticks: f64) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces) start at field 3.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) / ticks)
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
    /// Process CPU seconds per 10k messages.
    pub(crate) cpu_per_10k: f64,
    /// Peak resident set during the run, MiB.
    pub(crate) peak_mib: f64,
    /// Broker CPU seconds per 10k messages (NaN when the broker pid is unknown).
    pub(crate) broker_cpu_per_10k: f64,
}

/// Samples of one variant across rounds.
#[derive(Debug, Clone)]
pub(crate) struct Series {
    pub(crate) name: String,
    pub(crate) samples: Vec<Sample>,
}

impl Series {
    pub(crate) fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            samples: Vec::new(),
        }
    }

    pub(crate) fn median_rate(&self) -> f64 {
        median(&self.samples.iter().map(|s| s.rate).collect::<Vec<_>>())
    }

    pub(crate) fn median_cpu(&self) -> f64 {
        median(
            &self
                .samples
                .iter()
                .map(|s| s.cpu_per_10k)
                .collect::<Vec<_>>(),
        )
    }

    pub(crate) fn median_broker_cpu(&self) -> f64 {
        median(
            &self
                .samples
                .iter()
                .map(|s| s.broker_cpu_per_10k)
                .collect::<Vec<_>>(),
        )
    }

    pub(crate) fn max_peak(&self) -> f64 {
        self.samples.iter().map(|s| s.peak_mib).fold(0.0, f64::max)
    }
}

/// Prints per-round rates and medians of `series`.
pub(crate) fn print_table(title: &str, series: &[&Series]) {
    println!("\n== {title}");
    let rounds = series.iter().map(|s| s.samples.len()).max().unwrap_or(0);
    print!("{:<38}", "variant");
    for r in 0..rounds {
        print!("{:>10}", format!("r{}", r + 1));
    }
    println!(
        "{:>11}{:>12}{:>14}{:>11}",
        "median/s", "CPU s/10k", "broker s/10k", "peak MiB"
    );
    for s in series {
        print!("{:<38}", s.name);
        for r in 0..rounds {
            match s.samples.get(r) {
                Some(x) => print!("{:>10.0}", x.rate),
                None => print!("{:>10}", "-"),
            }
        }
        println!(
            "{:>11.0}{:>12.3}{:>14.3}{:>11.1}",
            s.median_rate(),
            s.median_cpu(),
            s.median_broker_cpu(),
            s.max_peak()
        );
    }
}

/// Prints the ratio of the medians of `a` over `b`, against `target`.
pub(crate) fn print_ratio(a: &Series, b: &Series, target: f64) {
    let r = a.median_rate() / b.median_rate();
    let verdict = if r >= target { "meets" } else { "BELOW" };
    // Per-round ratios: both ran in the same round, so slow drift of the machine cancels.
    let paired: Vec<f64> = a
        .samples
        .iter()
        .zip(&b.samples)
        .map(|(x, y)| x.rate / y.rate)
        .collect();
    println!(
        "ratio {} / {} = {r:.3} of medians (target >= {target}: {verdict}); median of per-round \
         ratios {:.3}; client CPU ratio {:.2}; broker CPU ratio {:.2}",
        a.name,
        b.name,
        median(&paired),
        a.median_cpu() / b.median_cpu(),
        a.median_broker_cpu() / b.median_broker_cpu()
    );
}

/// Prints one finished run.
pub(crate) fn print_run(round: usize, name: &str, s: &Sample) {
    println!(
        "round {round} {name:<38} {:>8.0} msg/s  cpu {:.3} s/10k  broker {:.3} s/10k  peak {:.1} MiB",
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
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mark {
    pub(crate) at: std::time::Instant,
    pub(crate) cpu: f64,
    pub(crate) broker_cpu: f64,
}

impl Meter {
    pub(crate) fn new() -> Self {
        Self {
            ticks: clock_ticks(),
            broker: broker_pid(),
        }
    }

    pub(crate) fn mark(&self) -> Mark {
        Mark {
            at: std::time::Instant::now(),
            cpu: cpu_seconds(self.ticks),
            broker_cpu: broker_cpu_seconds(self.broker.as_deref(), self.ticks).unwrap_or(f64::NAN),
        }
    }

    /// The sample of `n` messages between `start` and `end`; `peak_mib` is read now.
    pub(crate) fn sample(n: usize, start: Mark, end: Mark) -> Sample {
        let per_10k = 10_000.0 / n as f64;
        Sample {
            rate: rate(n, end.at - start.at),
            cpu_per_10k: (end.cpu - start.cpu) * per_10k,
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
