//! The Markdown fragments `scripts/bench` assembles into `docs/BENCHMARKS.md`.
//!
//! Each bench binary writes `$BENCH_REPORT_DIR/<part>.md` (tables and ratios) and appends
//! its target verdicts to `$BENCH_REPORT_DIR/targets.tsv` (workload, measure, target,
//! value, verdict). Without `BENCH_REPORT_DIR` everything goes to stdout only.

use std::fs::{File, OpenOptions};
use std::io::Write;

use super::Series;

/// The report of one bench binary.
pub(crate) struct Report {
    md: Option<File>,
    targets: Option<File>,
}

impl Report {
    /// Opens (truncates) `<part>.md` in `$BENCH_REPORT_DIR`, when set.
    pub(crate) fn open(part: &str) -> Self {
        let dir = std::env::var("BENCH_REPORT_DIR")
            .ok()
            .filter(|d| !d.is_empty());
        let md = dir.as_ref().map(|d| {
            File::create(format!("{d}/{part}.md"))
                .unwrap_or_else(|e| panic!("cannot write {d}/{part}.md: {e}"))
        });
        let targets = dir.as_ref().map(|d| {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(format!("{d}/targets.tsv"))
                .unwrap_or_else(|e| panic!("cannot write {d}/targets.tsv: {e}"))
        });
        Self { md, targets }
    }

    /// A line of Markdown (also printed).
    pub(crate) fn line(&mut self, s: impl AsRef<str>) {
        let s = s.as_ref();
        println!("{s}");
        if let Some(f) = &mut self.md {
            writeln!(f, "{s}").expect("write report");
        }
    }

    /// The table of `series`: medians over rounds, min-max, CPU, RSS.
    pub(crate) fn table(&mut self, title: &str, series: &[Series]) {
        self.line("");
        self.line(format!("#### {title}"));
        self.line("");
        self.line(
            "| variant | rounds | msg/s (median) | min–max | client CPU-s / 10k | peak RSS MiB | broker CPU-s / 10k |",
        );
        self.line("|---|---|---|---|---|---|---|");
        for s in series {
            self.line(format!(
                "| {} | {} | **{:.0}** | {:.0}–{:.0} | {:.3} | {:.1} | {:.3} |",
                s.name,
                s.samples.len(),
                s.median_rate(),
                s.min_rate(),
                s.max_rate(),
                s.median_cpu(),
                s.max_peak(),
                s.median_broker_cpu()
            ));
        }
        self.line("");
    }

    /// The best raw baseline among `series` (highest median rate), if any.
    pub(crate) fn best_raw<'a>(series: impl IntoIterator<Item = &'a Series>) -> Option<&'a Series> {
        series
            .into_iter()
            .filter(|s| s.raw)
            .max_by(|a, b| a.median_rate().total_cmp(&b.median_rate()))
    }

    /// The ratios of `kit` to `best` (ratio of medians), checked against the throughput
    /// target (`kit >= rate_target x best`) and, when given, the client CPU target
    /// (`kit <= cpu_target x best`); verdicts go to `targets.tsv` under `workload`.
    pub(crate) fn compare(
        &mut self,
        workload: &str,
        kit: &Series,
        best: &Series,
        rate_target: Option<f64>,
        cpu_target: Option<f64>,
    ) {
        let rate = kit.median_rate() / best.median_rate();
        let cpu = kit.median_cpu() / best.median_cpu();
        let broker = kit.median_broker_cpu() / best.median_broker_cpu();
        let mut parts = vec![format!("throughput **{rate:.2}×**")];
        if let Some(t) = rate_target {
            let v = verdict(rate >= t);
            parts[0].push_str(&format!(" (target ≥ {t}×: **{v}**)"));
            self.target(workload, "throughput", &format!("≥ {t}×"), rate, v);
        }
        let mut c = format!("client CPU **{cpu:.2}×**");
        if let Some(t) = cpu_target {
            let v = verdict(cpu <= t);
            c.push_str(&format!(" (target ≤ {t}×: **{v}**)"));
            self.target(workload, "client CPU", &format!("≤ {t}×"), cpu, v);
        }
        parts.push(c);
        parts.push(format!("broker CPU {broker:.2}×"));
        self.line(format!(
            "- {}: {} / {} = {}",
            workload,
            kit.name,
            best.name,
            parts.join("; ")
        ));
    }

    fn target(&mut self, workload: &str, measure: &str, target: &str, value: f64, v: &str) {
        if let Some(f) = &mut self.targets {
            writeln!(f, "{workload}\t{measure}\t{target}\t{value:.2}×\t{v}")
                .expect("write targets");
        }
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "not met" }
}
