//! Consume throughput: a rabbitkit `Worker` against the best hand-written lapin consumers,
//! same queue, same process, alternating rounds. 256-byte persistent messages, prefetch 200.
//!
//! Each run preloads the work queue with N messages (untimed), waits for the broker to be
//! idle, then starts the consumer. The clock (and the CPU meters) start at the first
//! delivery the consumer sees and stop when the N-th message is settled:
//! - success path: settled = acked. rabbitkit: a `Subscriber` whose handler returns `Ok`,
//!   one ack frame per message, and with ack coalescing (`Subscriber::ack_coalescing`,
//!   half the prefetch or 5 ms); on a classic and on a quorum work queue; on a multi-thread
//!   and on a current-thread runtime. Raw (best found): one task polls the consumer stream
//!   and a `FuturesUnordered` of per-message `Channel::basic_ack` futures, so acks are
//!   written without the loop waiting for each one, with no spawning; on both runtimes.
//! - failure path: settled = a confirmed copy published **and** the original acked after
//!   that confirm. rabbitkit: the handler always fails; one retry tier (1 h, so no copy comes
//!   back during a run), classic tiers and quorum tiers (the default); both runtimes. Raw
//!   (best found): one task polls the consumer stream and a `FuturesUnordered` of
//!   per-delivery futures "publish the copy (original body and properties plus one header,
//!   mandatory, default exchange) on a confirm channel of the same connection → await its
//!   confirm → `Channel::basic_ack`", at most prefetch in flight; copies go to a classic
//!   queue and, for the quorum comparison, to a quorum queue; on both runtimes.
//!
//! Raw loops ack with `Channel::basic_ack` on the consumer's channel: the delivery's `Acker`
//! (lapin 4.12) hands each ack to the connection's internal RPC task, which spawns a task
//! per ack before the frame is queued, and costs the current-thread loop 10–25 % more CPU.
//!
//! `BENCH_ALTERNATIVES=1` (the default) also runs the other raw structures tried, so the
//! report shows why the baselines above are the best: acks by the delivery's `Acker`, acks
//! awaited one by one in the loop, and a task spawned per delivery (success and failure
//! path); the failure path's loop with its copies on a second connection, rabbitkit's
//! layout (settlement copies never share the consumer's connection); and the same loop with
//! each copy shaped like rabbitkit's retry copy (its evidence headers and expiration), which
//! shows what that shape costs the broker. Any raw variant that is faster becomes "best raw"
//! in the ratios.
//!
//! Settings (environment): `RABBITKIT_BENCH_URL`, `RABBITKIT_BENCH_BROKER_PID`,
//! `BENCH_ROUNDS` (5), `BENCH_OK_MESSAGES` (20000), `BENCH_FAIL_MESSAGES` (10000),
//! `BENCH_ALTERNATIVES` (1), `BENCH_REPORT_DIR` (where `consume.md` goes).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection};
use rabbitkit_core::QueueType;

use common::kit::{self, Spec};
use common::report::Report;
use common::{Flavor, Mark, Meter, PREFETCH, Runtimes, Sample, Series};

/// How a raw consumer is structured.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Shape {
    /// One task: the consumer stream and a `FuturesUnordered` of settlements.
    Unordered,
    /// Each ack awaited in the consume loop before the next delivery (success path only).
    Awaited,
    /// A task spawned per delivery.
    Spawned,
    /// As `ChannelAck`, with the copies published on a second connection (failure path
    /// only): rabbitkit's layout, where settlement copies never share the consumer's
    /// connection.
    SecondConnection,
    /// As `Unordered`, acking with `Channel::basic_ack` on the consumer's channel instead
    /// of the delivery's `Acker` (which goes through lapin's internal RPC task and spawns
    /// a task per ack).
    ChannelAck,
    /// As `ChannelAck`, each copy shaped like rabbitkit's retry copy (failure path only):
    /// its evidence headers, same names and values, and its tier's delay as `expiration`.
    /// The same client loop with a larger copy: what that shape costs the broker.
    ShapedCopy,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Variant {
    /// Acks on a work queue of this type.
    RawOk(Flavor, Shape, QueueType),
    /// On this runtime, on a work queue of this type; acks coalesced or not.
    KitOk(Flavor, QueueType, bool),
    /// Copies into a queue of this type.
    RawFail(Flavor, Shape, QueueType),
    /// On this runtime, copies into tiers of this type.
    KitFail(Flavor, QueueType),
}

fn qt(t: QueueType) -> &'static str {
    match t {
        QueueType::Classic => "classic",
        QueueType::Quorum => "quorum",
    }
}

impl Variant {
    fn label(self) -> String {
        let shape = |s: Shape, what: &str| match s {
            Shape::Unordered => format!("1 task, FuturesUnordered of {what}"),
            Shape::Awaited => format!("{what} awaited one by one"),
            Shape::Spawned => format!("task spawned per delivery ({what})"),
            Shape::SecondConnection => {
                format!(
                    "1 task, FuturesUnordered of {what}, copies on a second connection, acks by Channel::basic_ack"
                )
            }
            Shape::ChannelAck => {
                format!("1 task, FuturesUnordered of {what}, acks by Channel::basic_ack")
            }
            Shape::ShapedCopy => format!(
                "1 task, FuturesUnordered of {what}, acks by Channel::basic_ack, copy with rabbitkit's evidence headers and expiration"
            ),
        };
        match self {
            Variant::RawOk(f, s, w) => format!(
                "raw lapin, {} queue, {}, {}",
                qt(w),
                shape(s, "acks"),
                f.label()
            ),
            Variant::KitOk(f, w, false) => {
                format!("rabbitkit Ok, {} queue, {}", qt(w), f.label())
            }
            Variant::KitOk(f, w, true) => format!(
                "rabbitkit Ok, {} queue, acks coalesced ({}, {} ms), {}",
                qt(w),
                kit::COALESCE.0,
                kit::COALESCE.1.as_millis(),
                f.label()
            ),
            Variant::RawFail(f, s, t) => format!(
                "raw lapin, {}, copy → {} queue, {}",
                shape(s, "copy→confirm→ack"),
                qt(t),
                f.label()
            ),
            Variant::KitFail(f, t) => format!("rabbitkit retry, {} tiers, {}", qt(t), f.label()),
        }
    }

    fn raw(self) -> bool {
        matches!(self, Variant::RawOk(..) | Variant::RawFail(..))
    }

    /// The type of the work queue this variant consumes.
    fn work(self) -> QueueType {
        match self {
            Variant::RawOk(_, _, w) | Variant::KitOk(_, w, _) => w,
            Variant::RawFail(..) | Variant::KitFail(..) => QueueType::Classic,
        }
    }

    fn flavor(self) -> Flavor {
        match self {
            Variant::RawOk(f, ..)
            | Variant::RawFail(f, ..)
            | Variant::KitOk(f, ..)
            | Variant::KitFail(f, _) => f,
        }
    }
}

struct Ctx {
    url: String,
    /// The classic work queue.
    queue: String,
    /// The quorum work queue (success path).
    quorum_queue: String,
    raw_copies_classic: String,
    raw_copies_quorum: String,
    body: Vec<u8>,
    admin: Channel,
    loader: Channel,
    meter: Arc<Meter>,
}

impl Ctx {
    /// The work queue of a variant.
    fn work(&self, v: Variant) -> &str {
        match v.work() {
            QueueType::Classic => &self.queue,
            QueueType::Quorum => &self.quorum_queue,
        }
    }

    /// Where the copies of a failing variant land.
    fn copies(&self, v: Variant) -> Option<String> {
        match v {
            Variant::RawFail(_, _, QueueType::Classic) => Some(self.raw_copies_classic.clone()),
            Variant::RawFail(_, _, QueueType::Quorum) => Some(self.raw_copies_quorum.clone()),
            Variant::KitFail(_, t) => Some(kit::copies_queue(&self.queue, t)),
            _ => None,
        }
    }

    /// Untimed: empties the queues and preloads N messages (on the multi-thread runtime,
    /// where the admin and loader connections live).
    async fn prepare(&self, v: Variant, n: usize) {
        common::purge(&self.admin, self.work(v)).await;
        if let Some(c) = self.copies(v) {
            common::purge(&self.admin, &c).await;
        }
        common::preload(&self.loader, self.work(v), &self.body, n).await;
    }

    /// Checks the queues after a run.
    async fn check(&self, v: Variant, n: usize) {
        let settle = Duration::from_secs(10);
        let left = common::depth_settled(&self.admin, self.work(v), 0, settle).await;
        assert_eq!(left, 0, "{v:?}: {left} messages left in the work queue");
        if let Some(c) = self.copies(v) {
            let d = common::depth_settled(&self.admin, &c, n as u32, settle).await as usize;
            assert_eq!(d, n, "{v:?}: {d} copies in {c}, expected {n}");
        }
    }

    /// The timed part, on the variant's runtime.
    async fn measure(&self, v: Variant, n: usize) -> Sample {
        common::reset_peak();
        let (start, end) = match v {
            Variant::RawOk(_, shape, _) => self.raw(self.work(v), n, shape, None).await,
            Variant::RawFail(_, shape, t) => {
                let copies = self.copies(v).expect("copies queue");
                self.raw(self.work(v), n, shape, Some((copies.as_str(), t)))
                    .await
            }
            Variant::KitOk(_, w, coalesce) => self.kit(v, n, Spec::ok(w, coalesce)).await,
            Variant::KitFail(_, t) => self.kit(v, n, Spec::fail(t)).await,
        };
        Meter::sample(n, &start, &end)
    }

    async fn kit(&self, v: Variant, n: usize, spec: Spec) -> (Mark, Mark) {
        let r = kit::run(&self.url, self.work(v), spec, n, self.meter.clone(), None).await;
        (r.start, r.end)
    }

    async fn consumer(&self, conn: &Connection, queue: &str) -> (Channel, lapin::Consumer) {
        let ch = conn.create_channel().await.expect("channel");
        ch.basic_qos(PREFETCH, BasicQosOptions { global: false })
            .await
            .expect("basic.qos");
        let consumer = ch
            .basic_consume(
                queue.into(),
                "rk-bench-raw".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("basic.consume");
        (ch, consumer)
    }

    /// A raw consumer of `n` messages: acks only, or (`copy` = target queue) a confirmed
    /// copy then the ack.
    async fn raw(
        &self,
        queue: &str,
        n: usize,
        shape: Shape,
        copy: Option<(&str, QueueType)>,
    ) -> (Mark, Mark) {
        let conn = common::connect(&self.url).await;
        let (ch, mut consumer) = self.consumer(&conn, queue).await;
        // The copies' confirm channel shares the consumer's connection, unless the shape
        // says otherwise.
        let second = match (copy, shape) {
            (Some(_), Shape::SecondConnection) => Some(common::connect(&self.url).await),
            _ => None,
        };
        let pch = match copy {
            Some(_) => Some(common::confirm_channel(second.as_ref().unwrap_or(&conn)).await),
            None => None,
        };
        let target = copy.map(|(q, _)| q);
        let copy_to = pch.as_ref().zip(target);
        let mut start = None;
        let end = match shape {
            Shape::Unordered | Shape::SecondConnection | Shape::ChannelAck | Shape::ShapedCopy => {
                let ack_on = matches!(
                    shape,
                    Shape::ChannelAck | Shape::SecondConnection | Shape::ShapedCopy
                )
                .then_some(&ch);
                let shaped = (shape == Shape::ShapedCopy).then(|| Shaped::new(queue));
                let mut pending = FuturesUnordered::new();
                let (mut received, mut settled) = (0, 0);
                while settled < n {
                    tokio::select! {
                        biased;
                        Some(()) = pending.next(), if !pending.is_empty() => settled += 1,
                        d = consumer.next(), if received < n => {
                            let d = d.expect("consumer ended").expect("delivery");
                            if start.is_none() {
                                start = Some(self.meter.mark());
                            }
                            received += 1;
                            pending.push(settle(d, copy_to, ack_on, shaped.as_ref()));
                        }
                    }
                }
                self.meter.mark()
            }
            Shape::Awaited => {
                for _ in 0..n {
                    let d = consumer
                        .next()
                        .await
                        .expect("consumer ended")
                        .expect("delivery");
                    if start.is_none() {
                        start = Some(self.meter.mark());
                    }
                    settle(d, copy_to, None, None).await;
                }
                self.meter.mark()
            }
            Shape::Spawned => {
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
                for _ in 0..n {
                    let d = consumer
                        .next()
                        .await
                        .expect("consumer ended")
                        .expect("delivery");
                    if start.is_none() {
                        start = Some(self.meter.mark());
                    }
                    let tx = tx.clone();
                    let owned = copy_to.map(|(c, q)| (c.clone(), q.to_owned()));
                    tokio::spawn(async move {
                        settle(d, owned.as_ref().map(|(c, q)| (c, q.as_str())), None, None).await;
                        let _ = tx.send(());
                    });
                }
                for _ in 0..n {
                    rx.recv().await.expect("a settlement task died");
                }
                self.meter.mark()
            }
        };
        // Untimed: let the broker apply the last acks before the connection closes. On a
        // quorum queue (RabbitMQ 3.10), closing right after the ack futures resolved, even
        // after a basic.qos round trip on the same channel, left tens of acked messages
        // ready again (redelivered, as after a crash); with a pause none was.
        ch.basic_qos(PREFETCH, BasicQosOptions { global: false })
            .await
            .expect("basic.qos after the acks");
        tokio::time::sleep(Duration::from_millis(500)).await;
        common::close(conn).await;
        if let Some(second) = second {
            common::close(second).await;
        }
        (start.expect("no delivery"), end)
    }
}

/// What rabbitkit adds to a retry copy ([`Shape::ShapedCopy`]): the evidence headers
/// `decide.rs` writes for the bench's failing handler (a plain error, so the default error
/// kind; the subscriber named after its queue) and its one retry tier's delay. Routing is
/// not reproduced: the copy still goes through the default exchange to a plain queue.
struct Shaped {
    evidence: Vec<(&'static str, AMQPValue)>,
    expiration: String,
}

impl Shaped {
    fn new(queue: &str) -> Shaped {
        use rabbitkit_core::headers as h;
        let text = |s: &str| AMQPValue::LongString(s.into());
        let now = AMQPValue::LongLongInt(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64),
        );
        Shaped {
            evidence: vec![
                (h::FIRST_FAILURE_AT, now.clone()),
                (h::LAST_FAILURE_AT, now),
                (h::ORIGINAL_EXCHANGE, text("")),
                (h::ORIGINAL_ROUTING_KEY, text(queue)),
                (h::SOURCE_QUEUE, text(queue)),
                (h::HANDLER, text(queue)),
                (h::ERROR_KIND, text(rabbitkit_core::kind::DEFAULT_KIND)),
                (h::ERROR_MESSAGE, text("bench failure")),
                (
                    h::RETRY_TIER,
                    text(&rabbitkit_core::retry::tier_label(kit::TIER)),
                ),
            ],
            expiration: kit::TIER.as_millis().to_string(),
        }
    }
}

/// The variants `keep` selects, each with its measured series, and the fastest raw loop
/// among them (the baseline of their ratios).
fn select<'a>(
    runs: &[(Variant, Series)],
    results: &'a [Series],
    keep: impl Fn(Variant) -> bool,
) -> (Vec<(Variant, &'a Series)>, &'a Series) {
    let picked: Vec<(Variant, &Series)> = runs
        .iter()
        .zip(results)
        .filter(|((v, _), _)| keep(*v))
        .map(|((v, _), s)| (*v, s))
        .collect();
    let best = Report::best_raw(picked.iter().map(|(_, s)| *s)).expect("a raw variant");
    (picked, best)
}

/// Settles one delivery: publishes its copy to `copy` (channel, queue) and awaits the
/// confirm, if given; then acks it (with `ack_on`'s `basic_ack` if given, else its acker).
/// With `shaped`, the copy carries rabbitkit's evidence headers and expiration.
async fn settle(
    d: lapin::message::Delivery,
    copy: Option<(&Channel, &str)>,
    ack_on: Option<&Channel>,
    shaped: Option<&Shaped>,
) {
    if let Some((pch, target)) = copy {
        let mut headers = d.properties.headers().clone().unwrap_or_default();
        let mut properties = d.properties.clone();
        match shaped {
            None => {
                headers.insert("x-bench-attempt".into(), AMQPValue::LongLongInt(2));
            }
            Some(shaped) => {
                headers.insert(
                    rabbitkit_core::headers::ATTEMPT.into(),
                    AMQPValue::LongLongInt(2),
                );
                for (k, v) in &shaped.evidence {
                    headers.insert((*k).into(), v.clone());
                }
                properties = properties.with_expiration(shaped.expiration.as_str().into());
            }
        }
        let confirm = pch
            .basic_publish(
                "".into(),
                target.into(),
                BasicPublishOptions {
                    mandatory: true,
                    immediate: false,
                },
                &d.data,
                properties.with_headers(headers),
            )
            .await
            .expect("publish copy");
        common::check_confirm(confirm.await);
    }
    match ack_on {
        Some(ch) => ch
            .basic_ack(d.delivery_tag, BasicAckOptions::default())
            .await
            .expect("basic.ack"),
        None => assert!(
            d.ack(BasicAckOptions::default()).await.expect("ack"),
            "ack: channel gone"
        ),
    }
}

fn main() {
    let url = common::url();
    let rounds = common::env_usize("BENCH_ROUNDS", 5);
    let ok_n = common::env_usize("BENCH_OK_MESSAGES", 20_000);
    let fail_n = common::env_usize("BENCH_FAIL_MESSAGES", 10_000);
    let alternatives = common::env_usize("BENCH_ALTERNATIVES", 1) != 0;
    let rts = Runtimes::new();
    let started = Instant::now();
    let queue = format!("rk-bench-consume-{}", common::unique());

    let (ctx, admin_conn, loader_conn) = rts.block_on(Flavor::Multi, async {
        let admin_conn = common::connect(&url).await;
        let loader_conn = common::connect(&url).await;
        let ctx = Ctx {
            url: url.clone(),
            raw_copies_classic: format!("{queue}.raw-copies"),
            raw_copies_quorum: format!("{queue}.raw-copies-quorum"),
            queue: queue.clone(),
            quorum_queue: format!("{queue}-quorum"),
            body: common::body(),
            admin: admin_conn.create_channel().await.expect("admin channel"),
            loader: common::confirm_channel(&loader_conn).await,
            meter: Arc::new(Meter::new()),
        };
        // Both tier types of the work queue, and the raw variants' copy queues.
        kit::declare(&url, &queue, Spec::fail(QueueType::Classic)).await;
        kit::declare(&url, &queue, Spec::fail(QueueType::Quorum)).await;
        kit::declare(&url, &ctx.quorum_queue, Spec::ok(QueueType::Quorum, false)).await;
        common::declare_durable(&ctx.admin, &ctx.raw_copies_classic, FieldTable::default()).await;
        common::declare_quorum(&ctx.admin, &ctx.raw_copies_quorum).await;
        (ctx, admin_conn, loader_conn)
    });
    println!(
        "consume bench: broker {}, queue {queue}, {rounds} rounds, success {ok_n} msgs, \
         failure {fail_n} msgs, {} B persistent, prefetch {PREFETCH}",
        rabbitkit_core::connection::redact(&url),
        common::BODY_SIZE
    );

    let run = |v: Variant, n: usize| -> Sample {
        rts.block_on(Flavor::Multi, async {
            ctx.prepare(v, n).await;
            common::quiesce().await;
        });
        let s = rts.block_on(v.flavor(), ctx.measure(v, n));
        rts.block_on(Flavor::Multi, ctx.check(v, n));
        s
    };

    // The raw loops that were fastest in every run go first; the other structures tried
    // (`BENCH_ALTERNATIVES`) show why. rabbitkit runs on both runtimes: the multi-thread
    // one most services use, and a current-thread one, the raw loops' best.
    let kit_flavors = [Flavor::Multi, Flavor::Current];
    let (mut ok, mut fail) = (Vec::new(), Vec::new());
    for q in [QueueType::Classic, QueueType::Quorum] {
        for f in [Flavor::Current, Flavor::Multi] {
            ok.push(Variant::RawOk(f, Shape::ChannelAck, q));
            fail.push(Variant::RawFail(f, Shape::ChannelAck, q));
        }
        for f in kit_flavors {
            ok.extend([Variant::KitOk(f, q, false), Variant::KitOk(f, q, true)]);
            fail.push(Variant::KitFail(f, q));
        }
    }
    if alternatives {
        for w in [QueueType::Classic, QueueType::Quorum] {
            for f in [Flavor::Current, Flavor::Multi] {
                ok.push(Variant::RawOk(f, Shape::Unordered, w));
            }
        }
        ok.push(Variant::RawOk(
            Flavor::Current,
            Shape::Awaited,
            QueueType::Classic,
        ));
        ok.push(Variant::RawOk(
            Flavor::Multi,
            Shape::Spawned,
            QueueType::Classic,
        ));
        fail.push(Variant::RawFail(
            Flavor::Multi,
            Shape::Spawned,
            QueueType::Classic,
        ));
        for t in [QueueType::Classic, QueueType::Quorum] {
            for f in [Flavor::Current, Flavor::Multi] {
                fail.push(Variant::RawFail(f, Shape::Unordered, t));
            }
            fail.push(Variant::RawFail(Flavor::Multi, Shape::SecondConnection, t));
            fail.push(Variant::RawFail(Flavor::Current, Shape::ShapedCopy, t));
        }
    }
    let with_series = |vs: &[Variant]| -> Vec<(Variant, Series)> {
        vs.iter()
            .map(|v| (*v, Series::new(v.label(), v.raw())))
            .collect()
    };
    let ok = with_series(&ok);
    let fail = with_series(&fail);

    // Warm-up (untimed).
    for (v, _) in ok.iter().chain(fail.iter()) {
        run(*v, 2_000.min(ok_n).min(fail_n));
    }
    let ok_series = common::rounds(&ok, rounds, |v| run(v, ok_n));
    let fail_series = common::rounds(&fail, rounds, |v| run(v, fail_n));

    rts.block_on(Flavor::Multi, async {
        kit::cleanup(&ctx.admin, &queue).await;
        kit::cleanup(&ctx.admin, &ctx.quorum_queue).await;
        common::delete_queue(&ctx.admin, &ctx.raw_copies_classic).await;
        common::delete_queue(&ctx.admin, &ctx.raw_copies_quorum).await;
        common::close(admin_conn).await;
        common::close(loader_conn).await;
    });

    let mut report = Report::open("consume");
    report.table(
        &format!(
            "Success path: {ok_n} preloaded messages, prefetch {PREFETCH} — first delivery → N-th ack"
        ),
        &ok_series,
    );
    // Per work-queue type: rabbitkit acking each message against the best raw per-message
    // ack loop (target 1.0x), and with coalesced acks against the same loop (target 1.3x).
    for w in [QueueType::Classic, QueueType::Quorum] {
        let (of_w, best) = select(&ok, &ok_series, |v| v.work() == w);
        for f in kit_flavors {
            let kit_of = |c: bool| {
                of_w.iter()
                    .find(|(v, _)| *v == Variant::KitOk(f, w, c))
                    .map(|(_, s)| *s)
                    .expect("rabbitkit variant")
            };
            let (each, coalesced) = (kit_of(false), kit_of(true));
            let q = format!("{} queue, rabbitkit {}", qt(w), f.label());
            report.compare(
                &format!("success path ({q})"),
                each,
                best,
                Some(1.0),
                Some(1.5),
            );
            report.compare(
                &format!("success path, acks coalesced ({q})"),
                coalesced,
                best,
                Some(1.3),
                Some(1.5),
            );
            report.compare(
                &format!("ack coalescing gain ({q})"),
                coalesced,
                each,
                None,
                None,
            );
        }
    }
    report.table(
        &format!(
            "Failure path: {fail_n} preloaded messages, prefetch {PREFETCH}, every one copied (confirmed) then acked — first delivery → N-th ack"
        ),
        &fail_series,
    );
    // Per tier type: each rabbitkit runtime against the best raw loop of that copy type
    // (targets 0.9x throughput, 1.5x client CPU), and against the raw loop whose copy has
    // rabbitkit's shape (no target: it separates what the copy's shape costs the broker
    // from what the client costs).
    for t in [QueueType::Classic, QueueType::Quorum] {
        let (of_t, best) = select(&fail, &fail_series, |v| match v {
            Variant::RawFail(_, _, q) | Variant::KitFail(_, q) => q == t,
            _ => false,
        });
        // When the shaped loop is itself the best raw loop, the targeted line already
        // compares with it.
        let shaped = of_t
            .iter()
            .find(|(v, _)| matches!(v, Variant::RawFail(_, Shape::ShapedCopy, _)))
            .map(|(_, s)| *s)
            .filter(|s| s.name != best.name);
        for (v, kit) in of_t.iter().filter(|(v, _)| !v.raw()) {
            let q = format!("{} copies, rabbitkit {}", qt(t), v.flavor().label());
            report.compare(
                &format!("failure path ({q})"),
                kit,
                best,
                Some(0.9),
                Some(1.5),
            );
            if let Some(shaped) = shaped {
                report.compare(
                    &format!("failure path against the shaped copy ({q})"),
                    kit,
                    shaped,
                    None,
                    None,
                );
            }
        }
    }
    report.line(format!(
        "\nTotal bench time {:.0} s.",
        started.elapsed().as_secs_f64()
    ));
}
