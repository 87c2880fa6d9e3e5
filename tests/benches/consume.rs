//! Consume throughput: a rabbitkit `Worker` against hand-written lapin consumers, same queue,
//! same run, alternating rounds. 256-byte persistent messages, prefetch 200.
//!
//! Each run preloads the work queue with N messages (untimed, raw pipelined publisher), then
//! starts the consumer. The clock (and the CPU meters) start at the first delivery the
//! consumer sees and stop when the N-th message is settled:
//! - (a) success path — settled = acked. rabbitkit: a `Subscriber` whose handler returns
//!   `Ok`, done when `SubscriberStats.acked == N`. raw: `basic_consume`, then `ack` each,
//!   either awaited in the consume loop or in a task spawned per delivery (as the worker
//!   does).
//! - (b) failure path — settled = a confirmed retry copy published **and** the original
//!   acked after that confirm. rabbitkit: the handler always fails, one retry tier of 1m
//!   (copies stay in the tier during the run), done when `retried == N && acked == N`. raw:
//!   consume → publish a copy on a confirm channel of a second connection → ack the original
//!   once its confirm is in, up to prefetch deliveries in flight. Raw variants:
//!   - `plain copy`: body and properties plus one header, default exchange, one channel;
//!   - `kit-shaped copy`: the headers of a real rabbitkit retry copy, through the retry
//!     exchange into the tier queue (what the broker gets from rabbitkit), one channel;
//!   - `kit-shaped, 64 ch x 1`: the same through 64 confirm channels with one publish in
//!     flight each (the publisher's design).
//!
//! rabbitkit runs twice per round on the failure path: with `.prefetch(200)` only, and with
//! `.concurrency(200)` plus a 200-wide publisher window.
//!
//! Settings (environment): `RABBITKIT_BENCH_URL`, `RABBITKIT_BENCH_BROKER_PID` (optional:
//! also report the broker's CPU), `BENCH_ROUNDS` (5), `BENCH_OK_MESSAGES` (20000),
//! `BENCH_FAIL_MESSAGES` (10000).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicGetOptions, BasicPublishOptions, BasicQosOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection};
use rabbitkit_core::{
    BoxError, ConnectionConfig, PublisherConfig, RetryPolicy, SubscriberStats, Worker,
};
use tokio::sync::{Notify, mpsc};

use common::{Mark, Meter, Sample, Series};

const PREFETCH: u16 = 200;
/// The one retry tier: long enough that no copy comes back during a run.
const TIER: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Variant {
    RawAck { spawned: bool },
    KitOk,
    RawRetry { shaped: bool, pool: bool },
    KitRetry { tuned: bool },
}

impl Variant {
    fn label(self) -> &'static str {
        match self {
            Variant::RawAck { spawned: false } => "raw lapin consume+ack (awaited)",
            Variant::RawAck { spawned: true } => "raw lapin consume+ack (spawned)",
            Variant::KitOk => "rabbitkit Ok (prefetch 200)",
            Variant::RawRetry {
                shaped: false,
                pool: _,
            } => "raw plain copy, 1 ch",
            Variant::RawRetry {
                shaped: true,
                pool: false,
            } => "raw kit-shaped copy, 1 ch",
            Variant::RawRetry {
                shaped: true,
                pool: true,
            } => "raw kit-shaped copy, 64 ch x 1",
            Variant::KitRetry { tuned: false } => "rabbitkit retry (prefetch 200)",
            Variant::KitRetry { tuned: true } => "rabbitkit retry (+conc/window 200)",
        }
    }

    fn fails(self) -> bool {
        matches!(self, Variant::RawRetry { .. } | Variant::KitRetry { .. })
    }

    /// Where this variant's copies land.
    fn copies(self, ctx: &Ctx) -> &str {
        match self {
            Variant::RawRetry { shaped: false, .. } => &ctx.raw_copies,
            _ => &ctx.tier_queue,
        }
    }
}

struct Ctx {
    url: String,
    queue: String,
    tier_queue: String,
    retry_exchange: String,
    raw_copies: String,
    body: Vec<u8>,
    admin: Channel,
    loader: Channel,
    meter: Arc<Meter>,
    /// The headers of a real rabbitkit retry copy (taken after the warm-up).
    template: OnceLock<FieldTable>,
}

/// Completion of the N-th settlement, recorded by whichever task gets there.
struct Done {
    count: AtomicUsize,
    n: usize,
    end: OnceLock<Mark>,
    finished: Notify,
    meter: Arc<Meter>,
}

impl Done {
    fn new(n: usize, meter: Arc<Meter>) -> Arc<Self> {
        Arc::new(Self {
            count: AtomicUsize::new(0),
            n,
            end: OnceLock::new(),
            finished: Notify::new(),
            meter,
        })
    }

    fn one(&self) {
        if self.count.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
            let _ = self.end.set(self.meter.mark());
            self.finished.notify_one();
        }
    }

    async fn wait(&self) -> Mark {
        self.finished.notified().await;
        *self.end.get().expect("end mark")
    }
}

impl Ctx {
    async fn run(&self, v: Variant, n: usize) -> Sample {
        for q in [&self.queue, &self.tier_queue, &self.raw_copies] {
            common::purge(&self.admin, q).await;
        }
        common::preload(&self.loader, &self.queue, &self.body, n).await;
        common::reset_peak();
        let (start, end) = match v {
            Variant::RawAck { spawned } => self.raw_ack(n, spawned).await,
            Variant::RawRetry { shaped, pool } => self.raw_retry(n, shaped, pool).await,
            Variant::KitOk => self.kit(n, false, false).await,
            Variant::KitRetry { tuned } => self.kit(n, true, tuned).await,
        };
        let sample = Meter::sample(n, start, end);
        let left = common::depth(&self.admin, &self.queue).await;
        assert_eq!(left, 0, "{v:?}: {left} messages left in the work queue");
        if v.fails() {
            let copies = v.copies(self);
            let c = common::depth(&self.admin, copies).await as usize;
            assert_eq!(c, n, "{v:?}: {c} copies in {copies}, expected {n}");
        }
        sample
    }

    async fn consumer(&self, conn: &Connection) -> (Channel, lapin::Consumer) {
        let ch = conn.create_channel().await.expect("channel");
        ch.basic_qos(PREFETCH, BasicQosOptions { global: false })
            .await
            .expect("basic.qos");
        let consumer = ch
            .basic_consume(
                self.queue.as_str().into(),
                "rk-bench-raw".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("basic.consume");
        (ch, consumer)
    }

    async fn raw_ack(&self, n: usize, spawned: bool) -> (Mark, Mark) {
        let conn = common::connect(&self.url).await;
        let (_ch, mut consumer) = self.consumer(&conn).await;
        let done = Done::new(n, self.meter.clone());
        let mut start = None;
        let mut count = 0;
        while let Some(d) = consumer.next().await {
            let d = d.expect("delivery");
            if start.is_none() {
                start = Some(self.meter.mark());
            }
            if spawned {
                let done = done.clone();
                tokio::spawn(async move {
                    d.ack(BasicAckOptions::default()).await.expect("ack");
                    done.one();
                });
            } else {
                d.ack(BasicAckOptions::default()).await.expect("ack");
                done.one();
            }
            count += 1;
            if count == n {
                break;
            }
        }
        let end = done.wait().await;
        let _ = conn.close(200, "bench run done".into()).await;
        (start.expect("no delivery"), end)
    }

    async fn raw_retry(&self, n: usize, shaped: bool, pool: bool) -> (Mark, Mark) {
        let conn = common::connect(&self.url).await;
        let pub_conn = common::connect(&self.url).await;
        let width = if pool {
            PublisherConfig::default().max_in_flight
        } else {
            1
        };
        // Idle confirm channels; with one channel it is shared by every publish in flight.
        let (idle_tx, mut idle_rx) = mpsc::unbounded_channel();
        let mut channels = Vec::new();
        for _ in 0..width {
            let ch = common::confirm_channel(&pub_conn).await;
            if pool {
                idle_tx.send(ch.clone()).expect("pool");
            }
            channels.push(ch);
        }
        let (exchange, routing_key) = if shaped {
            (self.retry_exchange.as_str(), self.tier_queue.as_str())
        } else {
            ("", self.raw_copies.as_str())
        };
        let template = self.template.get().cloned().unwrap_or_default();
        let (_ch, mut consumer) = self.consumer(&conn).await;
        let done = Done::new(n, self.meter.clone());
        let mut start = None;
        let mut count = 0;
        while let Some(d) = consumer.next().await {
            let d = d.expect("delivery");
            if start.is_none() {
                start = Some(self.meter.mark());
            }
            let mut headers = d.properties.headers().clone().unwrap_or_default();
            if shaped {
                for (k, v) in template.inner() {
                    headers.insert(k.clone(), v.clone());
                }
            } else {
                headers.insert("x-bench-attempt".into(), AMQPValue::LongLongInt(2));
            }
            let props = d.properties.clone().with_headers(headers);
            let ch = if pool {
                idle_rx.recv().await.expect("idle channel")
            } else {
                channels[0].clone()
            };
            let confirm = ch
                .basic_publish(
                    exchange.into(),
                    routing_key.into(),
                    BasicPublishOptions {
                        mandatory: true,
                        immediate: false,
                    },
                    &d.data,
                    props,
                )
                .await
                .expect("publish copy");
            let done = done.clone();
            let idle = idle_tx.clone();
            tokio::spawn(async move {
                common::check_confirm(Some(confirm.await));
                if pool {
                    let _ = idle.send(ch);
                }
                d.ack(BasicAckOptions::default()).await.expect("ack");
                done.one();
            });
            count += 1;
            if count == n {
                break;
            }
        }
        let end = done.wait().await;
        let _ = conn.close(200, "bench run done".into()).await;
        let _ = pub_conn.close(200, "bench run done".into()).await;
        (start.expect("no delivery"), end)
    }

    async fn kit(&self, n: usize, fail: bool, tuned: bool) -> (Mark, Mark) {
        let first: Arc<OnceLock<Mark>> = Arc::new(OnceLock::new());
        let f = first.clone();
        let meter = self.meter.clone();
        let handler = move || {
            let f = f.clone();
            let meter = meter.clone();
            async move {
                f.get_or_init(|| meter.mark());
                if fail {
                    Err::<(), BoxError>("bench failure".into())
                } else {
                    Ok(())
                }
            }
        };
        let mut sub = rabbitkit_core::Subscriber::new(self.queue.as_str(), handler)
            .retry(RetryPolicy::new([TIER]))
            .prefetch(PREFETCH);
        let mut worker = Worker::new(ConnectionConfig::new(self.url.clone()));
        if tuned {
            sub = sub.concurrency(usize::from(PREFETCH));
            worker = worker.publisher_config(PublisherConfig {
                max_in_flight: usize::from(PREFETCH),
                ..Default::default()
            });
        }
        let handle = worker.subscribe(sub).start().await.expect("worker start");
        let settled =
            |s: &SubscriberStats| s.acked as usize >= n && (!fail || s.retried as usize >= n);
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let s = handle.stats(&self.queue).expect("stats");
            if settled(&s) {
                break;
            }
            assert!(Instant::now() < deadline, "worker stalled: {s:?}");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let end = self.meter.mark();
        let report = handle.shutdown().await;
        let s = report.subscribers[&self.queue];
        assert_eq!(s.consumed as usize, n, "consumed: {s:?}");
        assert_eq!(s.settlement_failures, 0, "{s:?}");
        (*first.get().expect("handler never ran"), end)
    }

    /// Starts and stops a worker on the empty queue: declares the whole topology.
    async fn declare(&self) {
        let sub = rabbitkit_core::Subscriber::new(self.queue.as_str(), || async {
            Ok::<(), BoxError>(())
        })
        .retry(RetryPolicy::new([TIER]))
        .prefetch(PREFETCH);
        let h = Worker::new(ConnectionConfig::new(self.url.clone()))
            .subscribe(sub)
            .start()
            .await
            .expect("worker start (topology)");
        h.shutdown().await;
        let mut args = FieldTable::default();
        args.insert("x-message-ttl".into(), AMQPValue::LongInt(60_000));
        common::declare_durable(&self.admin, &self.raw_copies, args).await;
    }

    /// Keeps the headers of one rabbitkit retry copy from the tier queue.
    async fn take_template(&self) {
        let got = self
            .admin
            .basic_get(
                self.tier_queue.as_str().into(),
                BasicGetOptions { no_ack: true },
            )
            .await
            .expect("basic.get")
            .expect("a rabbitkit retry copy in the tier queue");
        let headers = got
            .delivery
            .properties
            .headers()
            .clone()
            .unwrap_or_default();
        let _ = self.template.set(headers);
    }

    async fn cleanup(&self) {
        let t = rabbitkit_core::Topology::new(self.queue.as_str());
        for q in [
            self.queue.clone(),
            self.tier_queue.clone(),
            t.parking_queue(),
            self.raw_copies.clone(),
        ] {
            common::delete_queue(&self.admin, &q).await;
        }
        common::delete_exchange(&self.admin, &self.retry_exchange).await;
    }
}

/// About the encoded size of a header table, in bytes.
fn table_size(t: &FieldTable) -> usize {
    fn value(v: &AMQPValue) -> usize {
        1 + match v {
            AMQPValue::LongString(s) => 4 + s.as_bytes().len(),
            AMQPValue::ShortString(s) => 1 + s.as_str().len(),
            AMQPValue::FieldTable(t) => table_size(t),
            AMQPValue::FieldArray(a) => 4 + a.as_slice().iter().map(value).sum::<usize>(),
            _ => 8,
        }
    }
    4 + t
        .inner()
        .iter()
        .map(|(k, v)| 1 + k.as_str().len() + value(v))
        .sum::<usize>()
}

fn report(title: &str, s: &[Series], baseline: usize, kits: &[usize], target: f64) {
    common::print_table(title, &s.iter().collect::<Vec<_>>());
    for &k in kits {
        common::print_ratio(&s[k], &s[baseline], target);
    }
}

async fn phase(ctx: &Ctx, variants: &[Variant], rounds: usize, n: usize) -> Vec<Series> {
    let mut series: Vec<Series> = variants.iter().map(|v| Series::new(v.label())).collect();
    for r in 0..rounds {
        // Rotate the order each round so no variant always runs first.
        for k in 0..variants.len() {
            let idx = (k + r) % variants.len();
            let s = ctx.run(variants[idx], n).await;
            common::print_run(r + 1, &series[idx].name, &s);
            series[idx].samples.push(s);
        }
    }
    series
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let url = common::url();
    let rounds = common::env_usize("BENCH_ROUNDS", 5);
    let ok_n = common::env_usize("BENCH_OK_MESSAGES", 20_000);
    let fail_n = common::env_usize("BENCH_FAIL_MESSAGES", 10_000);
    let rss_start = common::rss_mib();
    let started = Instant::now();

    let admin_conn = common::connect(&url).await;
    let loader_conn = common::connect(&url).await;
    let queue = format!("rk-bench-consume-{}", common::unique());
    let ctx = Ctx {
        url: url.clone(),
        tier_queue: rabbitkit_core::retry::tier_queue(&queue, TIER),
        retry_exchange: rabbitkit_core::retry::retry_exchange(&queue),
        raw_copies: format!("{queue}.raw-copies"),
        queue: queue.clone(),
        body: common::body(),
        admin: admin_conn.create_channel().await.expect("admin channel"),
        loader: common::confirm_channel(&loader_conn).await,
        meter: Arc::new(Meter::new()),
        template: OnceLock::new(),
    };
    println!(
        "consume bench: broker {}, queue {queue}, {rounds} rounds, success {ok_n} msgs, \
         failure {fail_n} msgs, {} B persistent, prefetch {PREFETCH}, retry tier {}",
        rabbitkit_core::connection::redact(&url),
        common::BODY_SIZE,
        rabbitkit_core::retry::tier_label(TIER)
    );
    ctx.declare().await;

    let ok = [
        Variant::RawAck { spawned: false },
        Variant::RawAck { spawned: true },
        Variant::KitOk,
    ];
    let fail = [
        Variant::RawRetry {
            shaped: false,
            pool: false,
        },
        Variant::KitRetry { tuned: false },
        Variant::RawRetry {
            shaped: true,
            pool: false,
        },
        Variant::RawRetry {
            shaped: true,
            pool: true,
        },
        Variant::KitRetry { tuned: true },
    ];
    // Warm-up (untimed); the first rabbitkit retry run leaves the copy whose headers the
    // kit-shaped raw variants reuse.
    ctx.run(Variant::KitRetry { tuned: false }, 2_000).await;
    ctx.take_template().await;
    for v in ok.iter().chain(fail.iter()) {
        ctx.run(*v, 2_000).await;
    }
    let ok_series = phase(&ctx, &ok, rounds, ok_n).await;
    let fail_series = phase(&ctx, &fail, rounds, fail_n).await;
    ctx.cleanup().await;
    let _ = admin_conn.close(200, "bench done".into()).await;
    let _ = loader_conn.close(200, "bench done".into()).await;

    report(
        &format!("(a) success path, {ok_n} msgs per round: first delivery -> N acked"),
        &ok_series,
        1,
        &[2],
        0.95,
    );
    common::print_ratio(&ok_series[2], &ok_series[0], 0.95);
    report(
        &format!(
            "(b) failure path, {fail_n} msgs per round: first delivery -> N confirmed copies + N originals acked"
        ),
        &fail_series,
        0,
        &[1, 4],
        0.9,
    );
    common::print_ratio(&fail_series[1], &fail_series[2], 0.9);
    common::print_ratio(&fail_series[1], &fail_series[3], 0.9);
    println!(
        "retry copy headers (kit-shaped raw copies reuse them): {} headers, about {} bytes",
        ctx.template.get().map_or(0, |t| t.inner().len()),
        ctx.template.get().map_or(0, table_size)
    );
    println!(
        "\nRSS: start {rss_start:.1} MiB, end {:.1} MiB; VmHWM at end (since the last reset) {:.1} MiB; \
         max peak of any run {:.1} MiB; total time {:.1} s",
        common::rss_mib(),
        common::hwm_mib(),
        ok_series
            .iter()
            .chain(fail_series.iter())
            .map(Series::max_peak)
            .fold(0.0, f64::max),
        started.elapsed().as_secs_f64()
    );
}
