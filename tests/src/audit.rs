//! The message audit shared by the fault scenarios (`tests/faults.rs`) and the soak
//! (`scripts/soak`): N unique ids go through a mixed workload, a fault is injected while they
//! flow, and at the end every id must be accounted for **by the broker and the handler**:
//! processed (recorded by the handler when it succeeded) or parked with the right reason.
//!
//! The mix, per id: `ok` (succeeds at once), `transient` (fails once or twice, then succeeds
//! from a retry tier), `failing` (always fails: parked with `max-attempts` after 3 attempts)
//! and `poison` (not JSON: parked with `decode` at once). Tiers are short (200 ms, 1 s) so
//! copies are waiting in them while the fault happens.
//!
//! The audit never reads the worker's counters: it reads queue depths (work queue and every
//! tier must be empty) and the parking queue's contents from the broker, and the handler's
//! record of what it processed. Lost = an id neither processed nor parked; misrouted = an id
//! parked that should have succeeded, parked for the wrong reason, or a parked message that
//! is not one of ours; duplicates = extra processings plus extra parked copies (expected
//! under faults: at-least-once).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use rabbitkit_core::extract::Json;
use rabbitkit_core::headers::Attempt;
use rabbitkit_core::{
    BoxError, ConnectionConfig, Envelope, Parking, Publisher, PublisherConfig, QueueType,
    RetryPolicy, Subscriber, Topology, Worker, WorkerHandle,
};
use serde::{Deserialize, Serialize};

/// The exchange the workload is published to (a topic exchange the worker declares).
pub const EXCHANGE: &str = "audit";
/// The routing key of every published item.
pub const ROUTING_KEY: &str = "item.created";
/// The retry tiers: short, so copies wait in them while faults happen.
pub const TIERS: [Duration; 2] = [Duration::from_millis(200), Duration::from_secs(1)];
/// Handler runs before a failing item is parked.
pub const MAX_ATTEMPTS: u32 = 3;

/// What the handler does with an id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Succeeds at once.
    Ok,
    /// Fails this many times (1 or 2), then succeeds.
    Transient(u32),
    /// Always fails: parked with `max-attempts`.
    Failing,
    /// Not JSON: parked with `decode`.
    Poison,
}

impl Kind {
    /// The handler records it when it finally succeeds.
    pub fn succeeds(self) -> bool {
        matches!(self, Kind::Ok | Kind::Transient(_))
    }

    /// The parking reason it must carry, when it is meant to be parked.
    pub fn park_reason(self) -> Option<&'static str> {
        match self {
            Kind::Failing => Some("max-attempts"),
            Kind::Poison => Some("decode"),
            _ => None,
        }
    }
}

/// The shares of the workload, in percent (the rest succeeds at once).
#[derive(Debug, Clone, Copy)]
pub struct Mix {
    /// Transient failures (succeed from a tier).
    pub transient: u32,
    /// Always failing (parked after 3 attempts).
    pub failing: u32,
    /// Poison (parked at once).
    pub poison: u32,
}

impl Mix {
    /// The fault scenarios' mix: 15 % transient, 10 % failing, 5 % poison.
    pub const SCENARIO: Mix = Mix {
        transient: 15,
        failing: 10,
        poison: 5,
    };

    /// The kind of item `i`. Spread over the ids (37 is prime to 100), so every stretch of
    /// the stream carries every kind.
    pub fn kind(&self, i: usize) -> Kind {
        let b = ((i * 37) % 100) as u32;
        if b < self.poison {
            Kind::Poison
        } else if b < self.poison + self.failing {
            Kind::Failing
        } else if b < self.poison + self.failing + self.transient {
            Kind::Transient(1 + b % 2)
        } else {
            Kind::Ok
        }
    }
}

/// The JSON body of a non-poison item.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Item {
    /// The unique id (also the message id).
    pub id: String,
    /// `ok`, `transient` or `failing`.
    pub kind: String,
    /// Failures before success, for `transient`.
    pub fail: u32,
}

/// The handler's record of what it processed successfully: id -> times. In memory for an
/// in-process worker; appended to a file (one id per line, written before the handler
/// returns, so the kernel has it even if the process is then killed) for a worker process.
#[derive(Debug, Clone, Default)]
pub struct Recorder {
    seen: Arc<Mutex<HashMap<String, u32>>>,
    file: Option<Arc<File>>,
    /// Time the handler spends on each delivery (keeps a prefetch window full).
    pub work: Duration,
}

impl Recorder {
    /// An in-memory recorder.
    pub fn new() -> Self {
        Self::default()
    }

    /// A recorder that also appends every processed id to `path`.
    pub fn to_file(path: &Path) -> std::io::Result<Self> {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(Self {
            file: Some(Arc::new(f)),
            ..Self::default()
        })
    }

    fn record(&self, id: &str) -> Result<(), BoxError> {
        if let Some(f) = &self.file {
            // One write(2) per line with O_APPEND: whole lines, in the kernel before the ack.
            (&**f).write_all(format!("{id}\n").as_bytes())?;
        }
        *self.seen.lock().unwrap().entry(id.to_owned()).or_default() += 1;
        Ok(())
    }

    /// What was processed (id -> times), as recorded in memory.
    pub fn processed(&self) -> HashMap<String, u32> {
        self.seen.lock().unwrap().clone()
    }

    /// How many distinct ids were processed.
    pub fn distinct(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    /// What a worker process recorded in `path` (id -> times).
    pub fn read_file(path: &Path) -> HashMap<String, u32> {
        let mut out = HashMap::new();
        if let Ok(text) = std::fs::read_to_string(path) {
            for line in text.lines().filter(|l| !l.is_empty()) {
                *out.entry(line.to_owned()).or_default() += 1;
            }
        }
        out
    }

    async fn handle(&self, attempt: u32, item: Item) -> Result<(), BoxError> {
        if !self.work.is_zero() {
            tokio::time::sleep(self.work).await;
        }
        match item.kind.as_str() {
            "transient" if attempt <= item.fail => {
                Err(format!("transient failure at attempt {attempt}").into())
            }
            "failing" => Err("downstream rejects this item".into()),
            _ => self.record(&item.id),
        }
    }
}

/// The audited subscriber: work queue `queue` bound to [`EXCHANGE`], tiers [`TIERS`],
/// [`MAX_ATTEMPTS`] attempts, the handler recording into `rec`.
pub fn subscriber(queue: &str, queue_type: QueueType, prefetch: u16, rec: Recorder) -> Subscriber {
    let mut retry = RetryPolicy::new(TIERS);
    retry.max_attempts = MAX_ATTEMPTS;
    Subscriber::new(queue, move |a: Attempt, Json(item): Json<Item>| {
        let rec = rec.clone();
        async move { rec.handle(a.number, item).await }
    })
    .bind(EXCHANGE, ROUTING_KEY)
    .queue_type(queue_type)
    .retry(retry)
    .prefetch(prefetch)
}

/// One audited run: the ids, their kinds, the queues to read back.
#[derive(Debug)]
pub struct Audit {
    /// Scenario name (printed in the summary line).
    pub scenario: String,
    /// AMQP URL of the vhost, `amqp://.../vhost`; on a cluster every node's, comma-separated
    /// (the worker and the publisher fail over between them).
    pub url: String,
    /// The broker's management URL (for its version).
    pub mgmt: String,
    /// The work queue.
    pub queue: String,
    /// The work queue's type.
    pub queue_type: QueueType,
    /// Number of ids.
    pub n: usize,
    /// The workload mix.
    pub mix: Mix,
    run: String,
    started: Instant,
}

/// What the audit found.
#[derive(Debug, Clone)]
pub struct Report {
    /// Scenario name.
    pub scenario: String,
    /// RabbitMQ version the broker reported.
    pub broker: String,
    /// Ids published.
    pub n: usize,
    /// Distinct ids processed.
    pub processed: usize,
    /// Distinct ids of this run found in the parking queue.
    pub parked_ids: usize,
    /// Messages found in the parking queue: duplicate copies of an id included, so
    /// `processed + parked` may exceed `n`; `processed + parked_ids` does not.
    pub parked: usize,
    /// Ids neither processed nor parked.
    pub lost: Vec<String>,
    /// Ids (or parked messages) in the wrong place, with what was wrong.
    pub misrouted: Vec<String>,
    /// Extra processings and extra parked copies.
    pub duplicates: usize,
    /// Messages left in the work queue and the tiers (must be 0).
    pub left: BTreeMap<String, u32>,
    /// Queues of the topology that do not exist at the end (deleted, never re-declared).
    pub missing: Vec<String>,
    /// From the first publish to the end of the audit.
    pub elapsed: Duration,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "AUDIT scenario={} broker={} n={} processed-ids={} parked-ids={} parked-copies={} (duplicates included) lost={} misrouted={} duplicates={} left={} missing-queues={} time={:.1}s",
            self.scenario,
            self.broker,
            self.n,
            self.processed,
            self.parked_ids,
            self.parked,
            self.lost.len(),
            self.misrouted.len(),
            self.duplicates,
            self.left.values().sum::<u32>(),
            self.missing.len(),
            self.elapsed.as_secs_f64()
        )
    }
}

impl Report {
    /// Fails loudly (listing the ids) unless nothing was lost, nothing misrouted and every
    /// queue but parking is empty.
    pub fn assert_clean(&self) {
        let show = |v: &[String]| {
            let mut s = v.iter().take(40).cloned().collect::<Vec<_>>().join(", ");
            if v.len() > 40 {
                s.push_str(&format!(", ... ({} in all)", v.len()));
            }
            s
        };
        assert!(
            self.lost.is_empty(),
            "{self}\nLOST {} ids: {}",
            self.lost.len(),
            show(&self.lost)
        );
        assert!(
            self.misrouted.is_empty(),
            "{self}\nMISROUTED {}: {}",
            self.misrouted.len(),
            show(&self.misrouted)
        );
        assert!(
            self.missing.is_empty(),
            "{self}\nqueues missing at the end: {:?}",
            self.missing
        );
        assert!(
            self.left.values().all(|n| *n == 0),
            "{self}\nmessages left in queues: {:?}",
            self.left
        );
    }
}

impl Audit {
    /// An audit of `n` ids through `queue` of the vhost at `url`.
    pub fn new(
        scenario: &str,
        url: &str,
        mgmt: &str,
        queue: &str,
        queue_type: QueueType,
        n: usize,
        mix: Mix,
    ) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        Self {
            scenario: scenario.to_owned(),
            url: url.to_owned(),
            mgmt: mgmt.to_owned(),
            queue: queue.to_owned(),
            queue_type,
            n,
            mix,
            run: format!("{scenario}-{}-{nanos:x}", std::process::id()),
            started: Instant::now(),
        }
    }

    /// Every node's URL of [`Audit::url`].
    pub fn urls(&self) -> Vec<String> {
        rabbitkit_core::connection::split_url_list(&self.url)
    }

    /// The id of item `i`.
    pub fn id(&self, i: usize) -> String {
        format!("{}-{i}", self.run)
    }

    /// The subscriber for this audit's queue.
    pub fn subscriber(&self, prefetch: u16, rec: Recorder) -> Subscriber {
        subscriber(&self.queue, self.queue_type, prefetch, rec)
    }

    /// The topology the worker declares (tier and parking queue names).
    pub fn topology(&self) -> Topology {
        let mut t = Topology::new(self.queue.clone());
        t.tiers = TIERS.to_vec();
        t.queue_type = self.queue_type;
        t
    }

    /// The connection config of the vhost (quick reconnects: faults are short).
    pub fn connection(&self) -> ConnectionConfig {
        let mut c = ConnectionConfig::nodes(self.urls());
        c.max_backoff = Duration::from_secs(1);
        c.connect_timeout = Duration::from_secs(5);
        c
    }

    /// The envelope of item `i`.
    pub fn envelope(&self, i: usize) -> Envelope {
        let id = self.id(i);
        let (kind, fail) = match self.mix.kind(i) {
            Kind::Ok => ("ok", 0),
            Kind::Transient(f) => ("transient", f),
            Kind::Failing => ("failing", 0),
            Kind::Poison => {
                return Envelope::new(EXCHANGE, ROUTING_KEY, format!("{{not json {id}"))
                    .message_id(id);
            }
        };
        let item = Item {
            id: id.clone(),
            kind: kind.into(),
            fail,
        };
        Envelope::json(EXCHANGE, ROUTING_KEY, &item)
            .expect("an item serialises")
            .message_id(id)
    }

    /// Publishes items `range` with confirms, republishing whatever was not confirmed
    /// (faults make publishes fail) until every one was confirmed once, or panics after
    /// `within`. A republished item whose first outcome was unknown may be there twice:
    /// counted as a duplicate, as it would be in production.
    pub async fn publish(&self, p: &Publisher, range: std::ops::Range<usize>, within: Duration) {
        let deadline = Instant::now() + within;
        let mut todo: Vec<usize> = range.collect();
        while !todo.is_empty() {
            let batch: Vec<usize> = std::mem::take(&mut todo);
            let envelopes: Vec<Envelope> = batch.iter().map(|i| self.envelope(*i)).collect();
            let outcomes: Vec<_> = p.publish_many(envelopes).collect().await;
            for (k, o) in outcomes {
                if !matches!(&o, Ok(o) if o.is_confirmed()) {
                    todo.push(batch[k]);
                }
            }
            if !todo.is_empty() {
                assert!(
                    Instant::now() < deadline,
                    "{}: {} publishes still unconfirmed after {within:?}",
                    self.scenario,
                    todo.len()
                );
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    }

    /// A publisher for this vhost (its own connection; not the worker's).
    pub fn publisher(&self) -> Publisher {
        Publisher::new(
            self.connection(),
            PublisherConfig {
                confirm_timeout: Duration::from_secs(5),
                ..Default::default()
            },
        )
        .expect("publisher config")
    }

    /// Starts an in-process worker running this audit's subscriber (prefetch 50).
    pub async fn start_worker(&self, rec: &Recorder) -> WorkerHandle {
        Worker::new(self.connection())
            .shutdown_deadline(Duration::from_secs(5))
            .subscribe(self.subscriber(50, rec.clone()))
            .start()
            .await
            .unwrap_or_else(|e| panic!("{}: worker start: {e}", self.scenario))
    }

    /// Waits for the run to go quiet (at most `within`), stops the worker, audits, and fails
    /// loudly unless it is clean.
    pub async fn finish(&self, w: WorkerHandle, rec: &Recorder, within: Duration) -> Report {
        let quiet = self.wait_quiet(within, || rec.distinct()).await;
        w.shutdown().await;
        let report = self.audit(&rec.processed()).await;
        report.assert_clean();
        assert!(quiet, "{report}\nthe run did not settle within {within:?}");
        report
    }

    /// Waits until retry copies are waiting in a tier, so the fault that follows hits them
    /// there. Panics after 30 s.
    pub async fn copies_in_tiers(&self) {
        let t = self.topology();
        let start = Instant::now();
        loop {
            if let Some(d) = self.depths().await
                && t.tier_queues()
                    .iter()
                    .any(|q| d.get(q).copied().unwrap_or(0) > 0)
            {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{}: no copy ever waited in a tier",
                self.scenario
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Ids expected to be processed / parked.
    pub fn expected(&self) -> (usize, usize) {
        let ok = (0..self.n).filter(|i| self.mix.kind(*i).succeeds()).count();
        (ok, self.n - ok)
    }

    /// Ready messages per queue (work queue and tiers, then parking); `None` while the
    /// broker cannot be read (it may be down: that is the fault).
    pub async fn depths(&self) -> Option<BTreeMap<String, u32>> {
        let mut conn = None;
        for url in self.urls() {
            let c = tokio::time::timeout(
                Duration::from_secs(5),
                Connection::connect(&url, ConnectionProperties::default()),
            )
            .await;
            if let Ok(Ok(c)) = c {
                conn = Some(c);
                break;
            }
        }
        let c = conn?;
        let mut ch = c.create_channel().await.ok()?;
        let t = self.topology();
        let mut out = BTreeMap::new();
        let names = std::iter::once(self.queue.clone())
            .chain(t.tier_queues())
            .chain(std::iter::once(t.parking_queue()));
        for q in names {
            match ch
                .queue_declare(
                    q.as_str().into(),
                    QueueDeclareOptions {
                        passive: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await
            {
                Ok(d) => {
                    out.insert(q, d.message_count());
                }
                // A missing queue (404) closes the channel: left out of the map, which is
                // what the audit reports as missing.
                Err(_) => ch = c.create_channel().await.ok()?,
            }
        }
        let _ = c.close(200, "audit".into()).await;
        Some(out)
    }

    /// Waits (at most `timeout`) until the run is quiet: `distinct()` reports every id
    /// meant to succeed, the parking queue holds at least every id meant to be parked, and
    /// the work queue and the tiers stayed empty for 3 s (longer than the longest tier).
    /// Returns false on timeout; the audit that follows says what is missing.
    pub async fn wait_quiet(&self, timeout: Duration, distinct: impl Fn() -> usize) -> bool {
        let (want_ok, want_parked) = self.expected();
        let parking = self.topology().parking_queue();
        let deadline = Instant::now() + timeout;
        let mut quiet_since: Option<Instant> = None;
        while Instant::now() < deadline {
            let settled = match self.depths().await {
                Some(d) => {
                    let waiting: u32 = d
                        .iter()
                        .filter(|(q, _)| **q != parking)
                        .map(|(_, n)| *n)
                        .sum();
                    waiting == 0
                        && d.get(&parking).copied().unwrap_or(0) as usize >= want_parked
                        && distinct() >= want_ok
                }
                None => false,
            };
            if settled {
                let since = *quiet_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= Duration::from_secs(3) {
                    return true;
                }
            } else {
                quiet_since = None;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        false
    }

    /// Reads the broker (depths of the work queue and tiers, the parking queue's contents)
    /// and compares with `processed` (id -> times the handler succeeded). Call it with the
    /// worker stopped, so nothing is unacked. Prints the summary line.
    pub async fn audit(&self, processed: &HashMap<String, u32>) -> Report {
        let t = self.topology();
        let mut left = BTreeMap::new();
        let mut depths = None;
        for _ in 0..60 {
            depths = self.depths().await;
            if depths.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let depths = depths.unwrap_or_else(|| {
            panic!(
                "{}: cannot read the queues from the broker for the audit",
                self.scenario
            )
        });
        for (q, n) in &depths {
            if *q != t.parking_queue() {
                left.insert(q.clone(), *n);
            }
        }
        let missing: Vec<String> = std::iter::once(self.queue.clone())
            .chain(t.tier_queues())
            .chain(std::iter::once(t.parking_queue()))
            .filter(|q| !depths.contains_key(q))
            .collect();
        let parking = Parking::new(ConnectionConfig::nodes(self.urls()), self.queue.clone())
            .expect("parking handle");
        let parked_msgs = if depths.contains_key(&t.parking_queue()) {
            parking
                .peek(self.n * 4 + 100)
                .await
                .unwrap_or_else(|e| panic!("{}: read the parking queue: {e}", self.scenario))
        } else {
            Vec::new()
        };
        parking.close().await;

        let mut parked: HashMap<String, Vec<String>> = HashMap::new();
        let mut misrouted = Vec::new();
        for m in &parked_msgs {
            match m.message_id() {
                Some(id) => parked
                    .entry(id.to_owned())
                    .or_default()
                    .push(m.reason.clone().unwrap_or_else(|| "?".into())),
                None => misrouted.push(format!("a parked message without id ({:?})", m.reason)),
            }
        }
        let mut lost = Vec::new();
        let mut duplicates = 0usize;
        let mut ours = 0usize;
        let mut parked_ids = 0usize;
        for i in 0..self.n {
            let id = self.id(i);
            let kind = self.mix.kind(i);
            let times = processed.get(&id).copied().unwrap_or(0) as usize;
            let reasons = parked.get(&id).cloned().unwrap_or_default();
            ours += reasons.len();
            parked_ids += usize::from(!reasons.is_empty());
            duplicates += times.saturating_sub(1) + reasons.len().saturating_sub(1);
            match kind.park_reason() {
                None => {
                    if !reasons.is_empty() {
                        misrouted.push(format!("{id} ({kind:?}) parked: {reasons:?}"));
                    } else if times == 0 {
                        lost.push(format!("{id} ({kind:?})"));
                    }
                }
                Some(want) => {
                    if times > 0 {
                        misrouted.push(format!("{id} ({kind:?}) processed {times}x"));
                    }
                    if reasons.is_empty() {
                        lost.push(format!("{id} ({kind:?})"));
                    } else if let Some(r) = reasons.iter().find(|r| *r != want) {
                        misrouted.push(format!("{id} ({kind:?}) parked as {r}, not {want}"));
                    }
                }
            }
        }
        if ours < parked_msgs.len() {
            misrouted.push(format!(
                "{} parked messages are not ids of this run",
                parked_msgs.len() - ours
            ));
        }
        let processed_ours = (0..self.n)
            .filter(|i| processed.contains_key(&self.id(*i)))
            .count();
        let report = Report {
            scenario: self.scenario.clone(),
            broker: broker_version(&self.mgmt),
            n: self.n,
            processed: processed_ours,
            parked_ids,
            parked: parked_msgs.len(),
            lost,
            misrouted,
            duplicates,
            left,
            missing,
            elapsed: self.started.elapsed(),
        };
        println!("{report}");
        append_summary(&report);
        report
    }
}

/// The RabbitMQ version from the management API, `?` when it cannot be read.
pub fn broker_version(mgmt: &str) -> String {
    let (status, body) = crate::http(mgmt, "GET", "/api/overview", None);
    if status != 200 {
        return "?".into();
    }
    serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["rabbitmq_version"].as_str().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

/// When `RABBITKIT_AUDIT_LOG` names a file, every summary line is appended to it (how the
/// scenario table in docs/RELIABILITY.md is collected).
fn append_summary(r: &Report) {
    if let Some(path) = std::env::var_os("RABBITKIT_AUDIT_LOG")
        && let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(PathBuf::from(path))
    {
        let _ = writeln!(f, "{r}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mix_gives_each_kind_its_share_in_every_hundred_ids() {
        let mix = Mix {
            transient: 20,
            failing: 2,
            poison: 5,
        };
        for start in [0, 100, 4_900] {
            let kinds: Vec<Kind> = (start..start + 100).map(|i| mix.kind(i)).collect();
            let count = |f: fn(&Kind) -> bool| kinds.iter().filter(|k| f(k)).count();
            assert_eq!(count(|k| *k == Kind::Poison), 5);
            assert_eq!(count(|k| *k == Kind::Failing), 2);
            assert_eq!(count(|k| matches!(k, Kind::Transient(_))), 20);
            assert_eq!(count(|k| *k == Kind::Ok), 73);
        }
        // Both transient depths occur, and every kind shows up within the first 20 ids.
        assert!((0..100).any(|i| Mix::SCENARIO.kind(i) == Kind::Transient(1)));
        assert!((0..100).any(|i| Mix::SCENARIO.kind(i) == Kind::Transient(2)));
        let first: Vec<Kind> = (0..20).map(|i| Mix::SCENARIO.kind(i)).collect();
        assert!(first.contains(&Kind::Poison) && first.contains(&Kind::Failing));
    }

    #[test]
    fn only_failing_and_poison_are_meant_to_be_parked_each_with_its_reason() {
        assert_eq!(Kind::Failing.park_reason(), Some("max-attempts"));
        assert_eq!(Kind::Poison.park_reason(), Some("decode"));
        assert!(Kind::Ok.succeeds() && Kind::Transient(2).succeeds());
        assert!(!Kind::Failing.succeeds() && !Kind::Poison.succeeds());
    }
}
