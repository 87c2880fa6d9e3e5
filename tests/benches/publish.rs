//! Publish throughput: rabbitkit's `Publisher` against hand-written pipelined lapin confirms,
//! same workload, same run, alternating rounds.
//!
//! Workload: persistent (`delivery_mode = 2`), 256-byte body, mandatory, default exchange to
//! one durable classic queue, every publish confirmed. Variants:
//! - `raw lapin pipelined`: one confirm channel, a bounded window of outstanding
//!   `PublisherConfirm`s (the same size as the publisher's window);
//! - `rabbitkit publish_many`: `Publisher::publish_many` (window kept full);
//! - `raw lapin W ch x 1 in flight`: a pool of W confirm channels with one publish in
//!   flight on each (the publisher's design before lanes), written directly on lapin, for
//!   contrast;
//! - `rabbitkit send+pending`: `Publisher::send` in a loop, `PendingConfirm`s awaited
//!   concurrently;
//! - publish-and-wait (one at a time) for both, with fewer messages.
//!
//! Settings (environment): `RABBITKIT_BENCH_URL`, `RABBITKIT_BENCH_BROKER_PID` (optional:
//! also report the broker's CPU), `BENCH_ROUNDS` (5), `BENCH_MESSAGES`
//! (20000), `BENCH_WAIT_MESSAGES` (2000), `BENCH_WAIT_ROUNDS` (3), `BENCH_WINDOW` (the
//! publisher's default window), `BENCH_CHANNELS` (the publisher's default channel count).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use lapin::options::BasicPublishOptions;
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel};
use rabbitkit_core::{ConnectionConfig, Envelope, PendingConfirm, Publisher, PublisherConfig};

use common::{Sample, Series};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Variant {
    RawPipelined,
    RawChannels,
    KitPublishMany,
    KitSend,
    RawWait,
    KitWait,
}

struct Ctx {
    queue: String,
    body: Bytes,
    window: usize,
    raw: Channel,
    pool: Vec<Channel>,
    admin: Channel,
    kit: Publisher,
    meter: common::Meter,
}

impl Ctx {
    async fn run(&self, v: Variant, n: usize) -> Sample {
        common::purge(&self.admin, &self.queue).await;
        common::reset_peak();
        let start = self.meter.mark();
        match v {
            Variant::RawPipelined => {
                common::publish_raw_pipelined(
                    &self.raw,
                    &self.queue,
                    &self.body,
                    n,
                    self.window,
                    false,
                )
                .await;
            }
            Variant::RawChannels => self.raw_channels(n).await,
            Variant::KitPublishMany => self.kit_publish_many(n).await,
            Variant::KitSend => self.kit_send(n).await,
            Variant::RawWait => self.raw_wait(n).await,
            Variant::KitWait => self.kit_wait(n).await,
        }
        let sample = common::Meter::sample(n, start, self.meter.mark());
        let d = common::depth(&self.admin, &self.queue).await as usize;
        assert_eq!(d, n, "{v:?}: queue holds {d}, expected {n}");
        sample
    }

    /// Publisher's design without the library: a pool of confirm channels, one publish in
    /// flight on each.
    async fn raw_channels(&self, n: usize) {
        let mut idle: Vec<&Channel> = self.pool.iter().collect();
        let mut pending = FuturesUnordered::new();
        for _ in 0..n {
            let ch = match idle.pop() {
                Some(ch) => ch,
                None => {
                    let (ch, c) = pending.next().await.expect("a publish in flight");
                    common::check_confirm(Some(c));
                    ch
                }
            };
            let confirm = self.raw_publish(ch).await;
            pending.push(async move { (ch, confirm.await) });
        }
        while let Some((_, c)) = pending.next().await {
            common::check_confirm(Some(c));
        }
    }

    /// One persistent, mandatory publish of the workload's body on `ch`.
    async fn raw_publish(&self, ch: &Channel) -> lapin::PublisherConfirm {
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

    fn envelope(&self) -> Envelope {
        // Envelope defaults: persistent and mandatory.
        Envelope::new("", self.queue.as_str(), self.body.clone())
    }

    async fn kit_publish_many(&self, n: usize) {
        let (queue, body) = (self.queue.clone(), self.body.clone());
        let envelopes = (0..n).map(move |_| Envelope::new("", queue.as_str(), body.clone()));
        let mut results = self.kit.publish_many(envelopes);
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

    async fn kit_send(&self, n: usize) {
        let mut pending: FuturesUnordered<PendingConfirm> = FuturesUnordered::new();
        for i in 0..n {
            // `send` waits for a free slot in the window; drain what is done meanwhile so
            // the set of pending confirms stays small.
            while let Some(Some(o)) = futures_util::FutureExt::now_or_never(pending.next()) {
                assert!(o.is_confirmed(), "publish: {o}");
            }
            let p = self
                .kit
                .send(self.envelope())
                .await
                .unwrap_or_else(|e| panic!("send {i}: {e}"));
            pending.push(p);
        }
        while let Some(o) = pending.next().await {
            assert!(o.is_confirmed(), "publish: {o}");
        }
    }

    async fn raw_wait(&self, n: usize) {
        for _ in 0..n {
            let c = self.raw_publish(&self.raw).await.await;
            common::check_confirm(Some(c));
        }
    }

    async fn kit_wait(&self, n: usize) {
        for i in 0..n {
            let o = self
                .kit
                .publish(self.envelope())
                .await
                .unwrap_or_else(|e| panic!("publish {i}: {e}"));
            assert!(o.is_confirmed(), "publish {i}: {o}");
        }
    }
}

fn label(v: Variant, window: usize) -> String {
    match v {
        Variant::RawPipelined => format!("raw lapin pipelined (w={window})"),
        Variant::RawChannels => format!("raw lapin {window} ch x 1 in flight"),
        Variant::KitPublishMany => format!("rabbitkit publish_many (w={window})"),
        Variant::KitSend => format!("rabbitkit send+pending (w={window})"),
        Variant::RawWait => "raw lapin publish-and-wait".into(),
        Variant::KitWait => "rabbitkit publish().await".into(),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let url = common::url();
    let rounds = common::env_usize("BENCH_ROUNDS", 5);
    let n = common::env_usize("BENCH_MESSAGES", 20_000);
    let wait_n = common::env_usize("BENCH_WAIT_MESSAGES", 2_000);
    let wait_rounds = common::env_usize("BENCH_WAIT_ROUNDS", 3);
    let window = common::env_usize("BENCH_WINDOW", PublisherConfig::default().max_in_flight);
    let channels = common::env_usize("BENCH_CHANNELS", PublisherConfig::default().channels);
    let rss_start = common::rss_mib();
    let started = Instant::now();

    let raw_conn = common::connect(&url).await;
    let admin_conn = common::connect(&url).await;
    let admin = admin_conn.create_channel().await.expect("admin channel");
    let queue = format!("rk-bench-publish-{}", common::unique());
    common::declare_durable(&admin, &queue, FieldTable::default()).await;
    let kit = Publisher::new(
        ConnectionConfig::new(url.clone()),
        PublisherConfig {
            max_in_flight: window,
            channels,
            ..Default::default()
        },
    )
    .expect("publisher config");
    kit.connect().await.expect("publisher connect");
    let mut pool = Vec::new();
    for _ in 0..window {
        pool.push(common::confirm_channel(&raw_conn).await);
    }
    let ctx = Ctx {
        queue: queue.clone(),
        body: Bytes::from(common::body()),
        window,
        raw: common::confirm_channel(&raw_conn).await,
        pool,
        admin,
        kit,
        meter: common::Meter::new(),
    };
    println!(
        "publish bench: broker {}, queue {queue}, {rounds} rounds x {n} msgs (pipelined), \
         {wait_rounds} x {wait_n} (publish-and-wait), {} B persistent mandatory bodies, window {window}, publisher channels {channels}",
        rabbitkit_core::connection::redact(&url),
        common::BODY_SIZE
    );

    // Warm-up (untimed): opens the publisher's channel pool, warms the broker queue process.
    for v in [
        Variant::RawPipelined,
        Variant::KitPublishMany,
        Variant::KitSend,
    ] {
        ctx.run(v, 2_000).await;
    }

    let pipelined = [
        Variant::RawPipelined,
        Variant::KitPublishMany,
        Variant::RawChannels,
        Variant::KitSend,
    ];
    let mut series: Vec<Series> = pipelined
        .iter()
        .map(|v| Series::new(label(*v, window)))
        .collect();
    for r in 0..rounds {
        // Rotate the order each round so no variant always runs first.
        for k in 0..pipelined.len() {
            let idx = (k + r) % pipelined.len();
            let s = ctx.run(pipelined[idx], n).await;
            common::print_run(r + 1, &series[idx].name, &s);
            series[idx].samples.push(s);
        }
    }

    let waits = [Variant::RawWait, Variant::KitWait];
    let mut wait_series: Vec<Series> = waits
        .iter()
        .map(|v| Series::new(label(*v, window)))
        .collect();
    for r in 0..wait_rounds {
        for k in 0..waits.len() {
            let idx = (k + r) % waits.len();
            let s = ctx.run(waits[idx], wait_n).await;
            common::print_run(r + 1, &wait_series[idx].name, &s);
            wait_series[idx].samples.push(s);
        }
    }

    let st = ctx.kit.stats();
    common::delete_queue(&ctx.admin, &queue).await;
    ctx.kit.close(Duration::from_secs(5)).await;
    let _ = raw_conn.close(200, "bench done".into()).await;
    let _ = admin_conn.close(200, "bench done".into()).await;

    common::print_table(
        &format!("pipelined, {n} msgs per round (peak = VmHWM during the run)"),
        &series.iter().collect::<Vec<_>>(),
    );
    common::print_ratio(&series[1], &series[0], 0.9);
    common::print_ratio(&series[3], &series[0], 0.9);
    common::print_ratio(&series[1], &series[2], 0.9);
    common::print_table(
        &format!("publish-and-wait, {wait_n} msgs per round"),
        &wait_series.iter().collect::<Vec<_>>(),
    );
    common::print_ratio(&wait_series[1], &wait_series[0], 0.9);
    println!(
        "\npublisher stats: sent {} confirmed {} returned {} nacked {} timed-out {} failed {}; \
         mean confirm latency {:.2} ms",
        st.sent,
        st.confirmed,
        st.returned,
        st.nacked,
        st.timed_out,
        st.failed,
        st.confirm_latency_total.as_secs_f64() * 1000.0 / st.confirmed.max(1) as f64
    );
    println!(
        "RSS: start {rss_start:.1} MiB, end {:.1} MiB; VmHWM at end (since the last reset) {:.1} MiB; \
         max peak of any run {:.1} MiB; total time {:.1} s",
        common::rss_mib(),
        common::hwm_mib(),
        series
            .iter()
            .chain(wait_series.iter())
            .map(Series::max_peak)
            .fold(0.0, f64::max),
        started.elapsed().as_secs_f64()
    );
}
