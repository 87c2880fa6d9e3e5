//! Publish throughput: rabbitkit's `Publisher` against the best hand-written lapin loop,
//! same workload, same process, alternating rounds.
//!
//! Workload: N persistent (`delivery_mode = 2`), 256-byte, mandatory publishes to one
//! durable classic queue through the default exchange, every one confirmed, at most W
//! unconfirmed at once. The clock runs from the first publish to the last confirm.
//! Variants:
//! - `raw lapin, 1 task, FuturesUnordered of publish→confirm`: one confirm channel; a
//!   single task keeps W futures, each "`basic_publish` then await its confirm", in a
//!   `FuturesUnordered`, adding one as one finishes. The first poll of each queues its
//!   frames (in order: one task), so lapin writes many publishes per socket write. No
//!   spawning, no locks, no channel hand-off: the least client work a confirmed, windowed
//!   publish can do with lapin. Run on a current-thread and on a multi-thread runtime.
//! - `raw lapin, 1 task, FuturesUnordered of confirms`: the same task awaits each
//!   `basic_publish` (until lapin has written it) before pushing its `PublisherConfirm`:
//!   one socket write and two thread wake-ups per publish. The faster of all the raw rows
//!   is "best raw".
//! - `raw lapin, W channels × 1 in flight` (with `BENCH_ALTERNATIVES=1`, the default): a
//!   pool of confirm channels with one publish in flight on each, the structure that
//!   attributes returns exactly without correlating them; shown for contrast, and best raw
//!   if it were faster.
//! - `rabbitkit publish_many`: `Publisher::publish_many` (keeps the window full and yields
//!   each outcome with exact return/confirm attribution), on both runtimes.
//!
//! Every run opens its own connections (untimed) on its runtime and checks the queue holds
//! exactly N messages afterwards.
//!
//! Settings (environment): `RABBITKIT_BENCH_URL`, `RABBITKIT_BENCH_BROKER_PID` (the broker's
//! beam.smp pid, for the broker CPU column), `BENCH_ROUNDS` (5), `BENCH_MESSAGES` (20000),
//! `BENCH_WINDOW` (256), `BENCH_ALTERNATIVES` (1), `BENCH_REPORT_DIR` (where `publish.md` goes).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use lapin::options::BasicPublishOptions;
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel};
use rabbitkit_core::{ConnectionConfig, Envelope, Publisher, PublisherConfig};

use common::report::Report;
use common::{Flavor, Meter, Runtimes, Sample, Series};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Variant {
    /// Each publish written before the next starts; confirms in a `FuturesUnordered`.
    Raw(Flavor),
    /// Whole publish→confirm futures in a `FuturesUnordered`.
    RawWhole(Flavor),
    /// W confirm channels, one publish in flight on each (an alternative, slower).
    RawPool(Flavor),
    Kit(Flavor),
}

impl Variant {
    fn label(self, window: usize) -> String {
        match self {
            Variant::Raw(f) => format!(
                "raw lapin, 1 task, FuturesUnordered of confirms (w={window}), {}",
                f.label()
            ),
            Variant::RawWhole(f) => format!(
                "raw lapin, 1 task, FuturesUnordered of publish→confirm (w={window}), {}",
                f.label()
            ),
            Variant::RawPool(f) => {
                format!("raw lapin, {window} channels × 1 in flight, {}", f.label())
            }
            Variant::Kit(f) => format!("rabbitkit publish_many (w={window}), {}", f.label()),
        }
    }
}

struct Ctx {
    url: String,
    queue: String,
    body: Bytes,
    window: usize,
    meter: Arc<Meter>,
}

impl Ctx {
    /// One run on the current runtime: purge, open (untimed), publish N (timed), check.
    async fn run(&self, v: Variant, n: usize) -> Sample {
        let admin_conn = common::connect(&self.url).await;
        let admin = admin_conn.create_channel().await.expect("admin channel");
        common::purge(&admin, &self.queue).await;
        common::quiesce().await;
        let sample = match v {
            Variant::Raw(_) | Variant::RawWhole(_) => {
                let conn = common::connect(&self.url).await;
                let ch = common::confirm_channel(&conn).await;
                common::reset_peak();
                let start = self.meter.mark();
                if matches!(v, Variant::Raw(_)) {
                    self.raw(&ch, n).await;
                } else {
                    self.raw_whole(&ch, n).await;
                }
                let end = self.meter.mark();
                let s = Meter::sample(n, &start, &end);
                common::close(conn).await;
                s
            }
            Variant::RawPool(_) => {
                let conn = common::connect(&self.url).await;
                let mut pool = Vec::with_capacity(self.window);
                for _ in 0..self.window {
                    pool.push(common::confirm_channel(&conn).await);
                }
                common::reset_peak();
                let start = self.meter.mark();
                self.raw_pool(&pool, n).await;
                let end = self.meter.mark();
                let s = Meter::sample(n, &start, &end);
                common::close(conn).await;
                s
            }
            Variant::Kit(_) => {
                let kit = Publisher::new(
                    ConnectionConfig::new(self.url.clone()),
                    PublisherConfig {
                        max_in_flight: self.window,
                        ..Default::default()
                    },
                )
                .expect("publisher config");
                kit.connect().await.expect("publisher connect");
                common::reset_peak();
                let start = self.meter.mark();
                self.kit(&kit, n).await;
                let end = self.meter.mark();
                let s = Meter::sample(n, &start, &end);
                kit.close(Duration::from_secs(5)).await;
                s
            }
        };
        let d = common::depth(&admin, &self.queue).await as usize;
        assert_eq!(d, n, "{v:?}: queue holds {d}, expected {n}");
        common::close(admin_conn).await;
        sample
    }

    async fn raw(&self, ch: &Channel, n: usize) {
        let mut pending = FuturesUnordered::new();
        for _ in 0..n {
            if pending.len() >= self.window
                && let Some(c) = pending.next().await
            {
                common::check_confirm(c);
            }
            pending.push(self.publish(ch).await);
        }
        while let Some(c) = pending.next().await {
            common::check_confirm(c);
        }
    }

    /// W publish→confirm futures in one `FuturesUnordered`, refilled as they finish.
    async fn raw_whole(&self, ch: &Channel, n: usize) {
        let mut pending = FuturesUnordered::new();
        let publish_confirm = || async { self.publish(ch).await.await };
        for _ in 0..n {
            if pending.len() >= self.window
                && let Some(c) = pending.next().await
            {
                common::check_confirm(c);
            }
            pending.push(publish_confirm());
        }
        while let Some(c) = pending.next().await {
            common::check_confirm(c);
        }
    }

    /// A pool of confirm channels, one publish in flight on each: exact attribution of
    /// returns without correlating them, at the cost of a wake-up per channel.
    async fn raw_pool(&self, pool: &[Channel], n: usize) {
        let mut idle: Vec<&Channel> = pool.iter().collect();
        let mut pending = FuturesUnordered::new();
        for _ in 0..n {
            let ch = match idle.pop() {
                Some(ch) => ch,
                None => {
                    let (ch, c) = pending.next().await.expect("a publish in flight");
                    common::check_confirm(c);
                    ch
                }
            };
            let confirm = self.publish(ch).await;
            pending.push(async move { (ch, confirm.await) });
        }
        while let Some((_, c)) = pending.next().await {
            common::check_confirm(c);
        }
    }

    /// One publish of the workload (persistent, mandatory, default exchange) on `ch`.
    async fn publish(&self, ch: &Channel) -> lapin::PublisherConfirm {
        ch.basic_publish(
            "".into(),
            self.queue.as_str().into(),
            BasicPublishOptions {
                mandatory: true,
                immediate: false,
            },
            &self.body,
            BasicProperties::default().with_delivery_mode(2),
        )
        .await
        .expect("basic.publish")
    }

    async fn kit(&self, kit: &Publisher, n: usize) {
        let (queue, body) = (self.queue.clone(), self.body.clone());
        // Envelope defaults: persistent and mandatory.
        let envelopes = (0..n).map(move |_| Envelope::new("", queue.as_str(), body.clone()));
        let mut results = kit.publish_many(envelopes);
        let mut confirmed = 0;
        while let Some((i, r)) = results.next().await {
            match r {
                Ok(o) if o.is_confirmed() => confirmed += 1,
                Ok(o) => panic!("publish {i}: {o}"),
                Err(e) => panic!("publish {i}: {e}"),
            }
        }
        assert_eq!(confirmed, n);
    }
}

fn main() {
    let url = common::url();
    let rounds = common::env_usize("BENCH_ROUNDS", 5);
    let n = common::env_usize("BENCH_MESSAGES", 20_000);
    let window = common::env_usize("BENCH_WINDOW", 256);
    let rts = Runtimes::new();
    let started = Instant::now();
    let queue = format!("rk-bench-publish-{}", common::unique());
    let ctx = Ctx {
        url: url.clone(),
        queue: queue.clone(),
        body: Bytes::from(common::body()),
        window,
        meter: Arc::new(Meter::new()),
    };
    rts.block_on(Flavor::Multi, async {
        let c = common::connect(&url).await;
        let ch = c.create_channel().await.expect("channel");
        common::declare_durable(&ch, &queue, FieldTable::default()).await;
        common::close(c).await;
    });
    println!(
        "publish bench: broker {}, queue {queue}, {rounds} rounds x {n} msgs, {} B persistent \
         mandatory, window {window}",
        rabbitkit_core::connection::redact(&url),
        common::BODY_SIZE
    );

    let mut variants = vec![
        Variant::RawWhole(Flavor::Current),
        Variant::RawWhole(Flavor::Multi),
        Variant::Raw(Flavor::Current),
        Variant::Raw(Flavor::Multi),
        Variant::Kit(Flavor::Multi),
        Variant::Kit(Flavor::Current),
    ];
    if common::env_usize("BENCH_ALTERNATIVES", 1) != 0 {
        variants.push(Variant::RawPool(Flavor::Current));
    }
    let variants: Vec<(Variant, Series)> = variants
        .into_iter()
        .map(|v| {
            (
                v,
                Series::new(v.label(window), !matches!(v, Variant::Kit(_))),
            )
        })
        .collect();
    let flavor = |v: Variant| match v {
        Variant::Raw(f) | Variant::RawWhole(f) | Variant::RawPool(f) | Variant::Kit(f) => f,
    };
    // Warm-up (untimed): the broker's queue process, the allocator, the code paths.
    for (v, _) in &variants {
        rts.block_on(flavor(*v), ctx.run(*v, n.min(2_000)));
    }
    let series = common::rounds(&variants, rounds, |v| {
        rts.block_on(flavor(v), ctx.run(v, n))
    });

    rts.block_on(Flavor::Multi, async {
        let c = common::connect(&url).await;
        let ch = c.create_channel().await.expect("channel");
        common::delete_queue(&ch, &queue).await;
        common::close(c).await;
    });

    let mut report = Report::open("publish");
    report.table(
        &format!(
            "Publish: {n} × {} B persistent, mandatory, confirmed, window {window} — first publish → last confirm",
            common::BODY_SIZE
        ),
        &series,
    );
    let best = Report::best_raw(&series).expect("a raw variant").clone();
    for kit in series.iter().filter(|s| !s.raw) {
        // The target is checked on the multi-thread runtime, what `#[tokio::main]` gives.
        let targeted = kit.name.ends_with(Flavor::Multi.label());
        report.compare(
            "publish",
            kit,
            &best,
            targeted.then_some(0.9),
            targeted.then_some(1.5),
        );
    }
    report.line(format!(
        "\nTotal bench time {:.0} s.",
        started.elapsed().as_secs_f64()
    ));
}
