//! Scale: many messages through rabbitkit's success and failure paths in one worker run
//! each, to show that memory stays flat. The queue is preloaded first (untimed), then one
//! worker consumes it all; the resident set is read when the checkpoint count is settled
//! and again at the end, and the two must match within noise (no per-message growth).
//!
//! Success path: the handler returns, every message acked. Failure path: the handler
//! fails, every message gets a confirmed copy in the (quorum, default) 1 h tier, then its
//! ack.
//!
//! Settings (environment): `RABBITKIT_BENCH_URL`, `RABBITKIT_BENCH_BROKER_PID`,
//! `BENCH_SCALE_OK` (1000000), `BENCH_SCALE_FAIL` (200000), `BENCH_SCALE_CHECKPOINT`
//! (100000), `BENCH_REPORT_DIR` (where `scale.md` goes).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::sync::Arc;
use std::time::Instant;

use rabbitkit_core::QueueType;

use common::kit::{self, Spec};
use common::report::Report;
use common::{Flavor, Meter, PREFETCH, Runtimes};

/// The resident sets differ by less than 2 MiB or 5 %: the same within noise.
fn same_within_noise(a: f64, b: f64) -> bool {
    (a - b).abs() <= f64::max(2.0, 0.05 * a.max(b))
}

fn main() {
    let url = common::url();
    let ok_n = common::env_usize("BENCH_SCALE_OK", 1_000_000);
    let fail_n = common::env_usize("BENCH_SCALE_FAIL", 200_000);
    let checkpoint = common::env_usize("BENCH_SCALE_CHECKPOINT", 100_000);
    let rts = Runtimes::new();
    let started = Instant::now();
    let queue = format!("rk-bench-scale-{}", common::unique());
    let meter = Arc::new(Meter::new());
    let rss_start = common::rss_mib();
    println!(
        "scale bench: broker {}, queue {queue}, success {ok_n}, failure {fail_n}, RSS checkpoint at {checkpoint}",
        rabbitkit_core::connection::redact(&url)
    );

    let mut report = Report::open("scale");
    report.line("");
    report.line(format!(
        "#### Scale: one rabbitkit worker (multi-thread runtime), prefetch {PREFETCH}, queue preloaded, resident set at {checkpoint} settled and at the end"
    ));
    report.line("");
    report.line(
        "| path | messages | msg/s | client CPU-s / 10k | broker CPU-s / 10k | RSS at checkpoint MiB | RSS at end MiB | peak RSS MiB | flat? |",
    );
    report.line("|---|---|---|---|---|---|---|---|---|");
    let rows = rts.block_on(Flavor::Multi, async {
        let admin_conn = common::connect(&url).await;
        let loader_conn = common::connect(&url).await;
        let admin = admin_conn.create_channel().await.expect("admin channel");
        let loader = common::confirm_channel(&loader_conn).await;
        let spec_fail = Spec::fail(QueueType::Quorum);
        kit::declare(&url, &queue, spec_fail).await;
        let body = common::body();
        let mut rows = Vec::new();
        for (label, spec, n) in [
            ("success", Spec::OK, ok_n),
            ("failure (quorum tier)", spec_fail, fail_n),
        ] {
            let copies = kit::copies_queue(&queue, spec.tiers);
            common::purge(&admin, &queue).await;
            common::purge(&admin, &copies).await;
            let t = Instant::now();
            common::preload(&loader, &queue, &body, n).await;
            println!("preloaded {n} in {:.1} s", t.elapsed().as_secs_f64());
            common::reset_peak();
            let r = kit::run(&url, &queue, spec, n, meter.clone(), Some(checkpoint.min(n))).await;
            let s = Meter::sample(n, &r.start, &r.end);
            let left = common::depth(&admin, &queue).await;
            assert_eq!(left, 0, "{label}: {left} left in the work queue");
            if spec.fail {
                let d = common::depth(&admin, &copies).await as usize;
                assert_eq!(d, n, "{label}: {d} copies, expected {n}");
                common::purge(&admin, &copies).await;
            }
            let at_cp = r.rss_at_checkpoint.unwrap_or(f64::NAN);
            let flat = same_within_noise(at_cp, r.rss_at_end);
            println!(
                "{label}: {n} msgs, {:.0} msg/s, RSS at {checkpoint}: {at_cp:.1} MiB, at end {:.1} MiB",
                s.rate, r.rss_at_end
            );
            rows.push(format!(
                "| {label} | {n} | {:.0} | {:.3} | {:.3} | {at_cp:.1} | {:.1} | {:.1} | {} |",
                s.rate,
                s.cpu_per_10k,
                s.broker_cpu_per_10k,
                r.rss_at_end,
                // The high-water mark is read when the window closes; the end's RSS a moment
                // later, after the worker stopped: a peak is never below what was read.
                s.peak_mib.max(r.rss_at_end).max(at_cp),
                if flat {
                    "yes (Δ ≤ max(2 MiB, 5 %))"
                } else {
                    "**no**"
                }
            ));
        }
        kit::cleanup(&admin, &queue).await;
        common::close(admin_conn).await;
        common::close(loader_conn).await;
        rows
    });
    for r in rows {
        report.line(r);
    }
    report.line(format!(
        "\nProcess RSS before any run {rss_start:.1} MiB; total bench time {:.0} s (preloads included).",
        started.elapsed().as_secs_f64()
    ));
}
