//! One confirm channel and the task that owns it: many publishes in flight, each outcome
//! attributed exactly.
//!
//! A lane is the only publisher on its channel (lapin attributes confirms to the wrong
//! message when `basic_publish` calls race from several threads on one channel). It hands
//! each publish to lapin whole, one after another, without waiting for the previous one's
//! frames to be written (see [`Lane::start_work`]): lapin then writes a burst of publishes
//! with one socket write instead of one write and two thread wake-ups each. It keeps up to
//! the window unconfirmed.
//! Two lapin facts shape how outcomes are read (lapin 4.12, `acknowledgement.rs`):
//!
//! - a `basic.return` is not attached to the confirm of the message it returns: lapin hands
//!   it to whichever confirm it resolves next on that channel. The broker sends the return
//!   before the message's ack, so the confirm that carries it resolves no later than the
//!   returned message's own one. The lane therefore reads the carried return's
//!   `message_id` (rabbitkit always sets one) and files it under that id (by its hash, see
//!   [`Key`]). When a publish's id (or only its hash) is already awaiting its confirm on
//!   the channel (retry copies keep the original's id; producers reuse ids), the lane does
//!   not wait: it writes the publish with a [`PUBLISH_TOKEN`] header unique on the
//!   channel, and a return is filed under (id, token), so it names exactly one publish;
//! - one multi-ack frame resolves its confirms one by one, in hash order, while lapin holds
//!   the channel's acknowledgement lock. A lane that sees one confirm of such a batch may
//!   not see the carrier yet. Before reporting, the lane takes that lock itself (through
//!   `wait_for_confirms`, polled once) and looks again: once it holds the lock, every confirm
//!   of the batch is resolved and has woken the lane. Only then are outcomes reported.
//!
//! Confirms are polled through one waker per publish that records which publish woke it,
//! so a wake-up is never missed and the lane touches only the confirms that changed.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::future::Future;
use std::hash::BuildHasher;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use foldhash::fast::RandomState;
use futures_util::FutureExt;
use futures_util::task::AtomicWaker;
use lapin::types::{AMQPValue, ShortString};
use lapin::{Channel, Confirmation, PublisherConfirm};
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio::time::{Instant, Sleep};

use super::reply::{BatchSink, BlockWatch, Job, LaneMsg, Reply};
use super::{PublishOutcome, Shared};
use crate::connection::Conn;
use crate::envelope::Prepared;
use crate::error::{Error, Result};
use crate::headers::PUBLISH_TOKEN;

mod write;

/// Loop turns a lane takes before it yields to the runtime.
const BUDGET: usize = 128;

/// The most a [`PUBLISH_TOKEN`] adds to a publish's properties: its table entry (name
/// length byte, name, type tag, 8-byte integer, counted at 9 as every scalar is by the
/// estimate) and a table's 4-byte length when the publish had no headers. The publisher
/// keeps this room in every envelope's budget: whether a publish gets a token is only
/// known when it is written.
pub(super) const TOKEN_ROOM: usize = 1 + PUBLISH_TOKEN.len() + 1 + 9 + 4;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Publishes that woke their waker since the lane last looked.
#[derive(Default)]
struct Wakes {
    seqs: Mutex<Vec<u64>>,
    lane: AtomicWaker,
}

impl Wakes {
    /// Moves the publishes that woke into `out` (empty), leaving `out`'s old allocation in
    /// their place: the two buffers trade places, and neither is reallocated per pass.
    fn take_into(&self, out: &mut Vec<u64>) {
        out.clear();
        std::mem::swap(
            &mut *self.seqs.lock().unwrap_or_else(|p| p.into_inner()),
            out,
        );
    }
}

/// The waker of one publish's confirm.
struct SeqWaker {
    seq: u64,
    wakes: Arc<Wakes>,
}

impl Wake for SeqWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.wakes
            .seqs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(self.seq);
        self.wakes.lane.wake();
    }
}

/// What a return is filed under: the channel's epoch, the message id's hash (see
/// [`Lane::id_hash`]), the publish token (0 when the publish carried none).
///
/// A hash, not the id itself: no copy of the id per publish. Two ids in flight on one
/// channel with the same hash are told apart like two equal ids: the second gets a token,
/// so a key names one publish whatever the ids.
type Key = (u64, u64, u64);

/// The token a returned message carries (0: none, or not one the lane could have written).
fn token_of(properties: &lapin::BasicProperties) -> u64 {
    match properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get(PUBLISH_TOKEN))
    {
        Some(AMQPValue::LongLongInt(v)) => u64::try_from(*v).unwrap_or(0),
        _ => 0,
    }
}

/// A publish written (or being written) on a channel.
struct Entry {
    epoch: u64,
    /// The message id's hash and the [`PUBLISH_TOKEN`] it was written with (0: none).
    id: (u64, u64),
    started: Instant,
    deadline: Instant,
    watch: BlockWatch,
    /// `None` once the outcome is reported. An entry reported as timed out stays until its
    /// confirm resolves or its channel is dropped: a late return it carries must still be
    /// filed, and its id stays taken on its channel.
    reply: Option<(Reply, OwnedSemaphorePermit)>,
    confirm: Option<PublisherConfirm>,
    waker: Waker,
}

impl Entry {
    fn timed_out(&self) -> PublishOutcome {
        PublishOutcome::TimedOut {
            blocked: self.watch.seen_blocked(),
        }
    }
}

struct Open {
    conn: Arc<Conn>,
    channel: Arc<Channel>,
    epoch: u64,
}

/// An opening channel: its connection and channel, unless the open failed or ran out of time.
type Opened = std::result::Result<Result<(Arc<Conn>, Channel)>, tokio::time::error::Elapsed>;

enum Chan {
    None,
    Opening(BoxFuture<Opened>),
    Open(Open),
}

/// A publish of the pass [`Lane::start_writes`] is handing to lapin: its key is taken, its
/// write made and started, then its entry filed.
struct Staged {
    seq: u64,
    key: Key,
    /// `None` once its write is made.
    prepared: Option<Prepared>,
    permit: OwnedSemaphorePermit,
    reply: Reply,
    started: Instant,
    deadline: Instant,
    blocks_before: Option<BlockWatch>,
    write: Option<BoxFuture<lapin::Result<PublisherConfirm>>>,
    done: Option<lapin::Result<PublisherConfirm>>,
}

/// A publish handed to lapin whose frames are not written yet.
struct Writing {
    seq: u64,
    epoch: u64,
    fut: BoxFuture<lapin::Result<PublisherConfirm>>,
    /// The write's result when its first poll already gave it.
    done: Option<lapin::Result<PublisherConfirm>>,
}

/// The state of one lane; driven by [`run`].
struct Lane {
    shared: Arc<Shared>,
    rx: mpsc::UnboundedReceiver<LaneMsg>,
    rx_open: bool,
    /// Streams owed a wake-up by this pass (see [`BatchSink`]).
    to_wake: Vec<Arc<BatchSink>>,
    /// Publishes of the pass being handed to lapin (see [`Lane::start_writes`]); reused.
    staged: Vec<Staged>,
    /// Received, not yet written.
    backlog: VecDeque<Job>,
    chan: Chan,
    /// Channels of earlier epochs that still have publishes waiting for a confirm.
    old: Vec<Open>,
    /// Epoch of the current (or next) channel; a new channel is a new epoch.
    epoch: u64,
    /// The connection the last channel open got (set as soon as the connector hands it
    /// out, before the channel exists): whether it is blocked tells a channel open that
    /// ran out of time because of a resource alarm.
    last_conn: Arc<Mutex<Option<Arc<Conn>>>>,
    /// A publish on the current channel timed out: write nothing more on it, drop it once
    /// every other publish on it is reported.
    tainted: bool,
    /// Publishes handed to lapin, in channel order, whose frames are not written yet.
    writing: VecDeque<Writing>,
    next_seq: u64,
    /// The lane's tables are keyed by its own numbers and hashed with foldhash, not
    /// SipHash (docs/PROFILE.md, fifth pass).
    entries: HashMap<u64, Entry, RandomState>,
    /// The key of every entry: a second publish whose id's hash is taken gets a token.
    ids: HashSet<Key, RandomState>,
    /// Hashes message ids for [`Key`]s; one seed for the lane's life.
    id_hasher: RandomState,
    /// Returns read from the confirms that carried them, by [`Key`].
    returns: HashMap<Key, (u16, String), RandomState>,
    /// Deadlines of unreported entries.
    deadlines: BTreeSet<(Instant, u64)>,
    wakes: Arc<Wakes>,
    /// Reused by every pass of [`Lane::settle_confirms`]: the publishes that woke, and the
    /// confirms that resolved.
    woke: Vec<u64>,
    resolved: Vec<(u64, lapin::Result<Confirmation>)>,
    timer: Pin<Box<Sleep>>,
    armed: Option<Instant>,
}

/// Runs one lane until every sender is gone and every publish handed to it is reported.
pub(super) async fn run(shared: Arc<Shared>, rx: mpsc::UnboundedReceiver<LaneMsg>) {
    let mut lane = Lane::new(shared, rx);
    std::future::poll_fn(|cx| lane.poll(cx)).await;
    lane.close_channel();
}

impl Lane {
    fn new(shared: Arc<Shared>, rx: mpsc::UnboundedReceiver<LaneMsg>) -> Self {
        Lane {
            shared,
            rx,
            rx_open: true,
            to_wake: Vec::new(),
            staged: Vec::new(),
            backlog: VecDeque::new(),
            chan: Chan::None,
            old: Vec::new(),
            epoch: 0,
            last_conn: Arc::default(),
            tainted: false,
            writing: VecDeque::new(),
            next_seq: 0,
            entries: HashMap::default(),
            ids: HashSet::default(),
            id_hasher: RandomState::default(),
            returns: HashMap::default(),
            deadlines: BTreeSet::new(),
            wakes: Arc::default(),
            woke: Vec::new(),
            resolved: Vec::new(),
            timer: Box::pin(tokio::time::sleep_until(Instant::now())),
            armed: None,
        }
    }
}

impl Lane {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.wakes.lane.register(cx.waker());
        for _ in 0..BUDGET {
            let mut progress = self.receive(cx);
            progress |= self.settle_confirms(cx);
            progress |= self.poll_open(cx);
            progress |= self.expire();
            progress |= self.recycle();
            progress |= self.start_work(cx);
            self.wake_streams();
            if progress {
                continue;
            }
            if !self.rx_open && self.backlog.is_empty() && !self.has_unreported(None) {
                return Poll::Ready(());
            }
            if !self.timer_fired(cx) {
                return Poll::Pending;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    fn receive(&mut self, cx: &mut Context<'_>) -> bool {
        let mut progress = false;
        while self.rx_open {
            match self.rx.poll_recv(cx) {
                Poll::Ready(Some(msg)) => {
                    let conn = self.conn();
                    let mut take = |mut job: Job| {
                        job.blocks_before = conn.clone().map(BlockWatch::new);
                        self.backlog.push_back(job);
                    };
                    match msg {
                        LaneMsg::One(job) => take(job),
                        LaneMsg::Many(jobs) => jobs.into_iter().for_each(take),
                    }
                    progress = true;
                }
                Poll::Ready(None) => {
                    self.rx_open = false;
                    progress = true;
                }
                Poll::Pending => break,
            }
        }
        progress
    }

    /// Polls the confirms that woke and the write in progress, then reports what resolved,
    /// after the acknowledgement barrier (see the module docs).
    fn settle_confirms(&mut self, cx: &mut Context<'_>) -> bool {
        let mut resolved = std::mem::take(&mut self.resolved);
        let mut woke = std::mem::take(&mut self.woke);
        let mut progress = false;
        loop {
            let before = resolved.len();
            let mut saw = false;
            self.wakes.take_into(&mut woke);
            for &seq in &woke {
                if let Some(result) = self.poll_confirm(seq) {
                    self.file_return(seq, &result);
                    resolved.push((seq, result));
                    saw = true;
                }
            }
            if let Some(written) = self.poll_write(cx) {
                progress = true;
                saw = true;
                if let Some(result) =
                    written.and_then(|seq| self.poll_confirm(seq).map(|r| (seq, r)))
                {
                    self.file_return(result.0, &result.1);
                    resolved.push(result);
                }
            }
            if !saw {
                break;
            }
            // Only a confirm resolved in this pass can belong to a multi-ack still being
            // applied; a pass that only finished a write has nothing to wait for.
            if resolved.len() > before {
                self.barrier();
            }
        }
        for (seq, result) in resolved.drain(..) {
            self.finish(seq, result);
            progress = true;
        }
        self.resolved = resolved;
        self.woke = woke;
        progress
    }

    fn poll_confirm(&mut self, seq: u64) -> Option<lapin::Result<Confirmation>> {
        let entry = self.entries.get_mut(&seq)?;
        let confirm = entry.confirm.as_mut()?;
        let mut ecx = Context::from_waker(&entry.waker);
        match Pin::new(confirm).poll(&mut ecx) {
            Poll::Ready(result) => {
                entry.confirm = None;
                Some(result)
            }
            Poll::Pending => None,
        }
    }

    /// `Some(Some(seq))`: the write of `seq` finished and its confirm is now tracked;
    /// `Some(None)`: the write finished with an error (reported); `None`: nothing changed.
    ///
    /// Writes finish in channel order (lapin writes a connection's frames in the order they
    /// were queued), so only the oldest is polled.
    fn poll_write(&mut self, cx: &mut Context<'_>) -> Option<Option<u64>> {
        let writing = self.writing.front_mut()?;
        let result = match writing.done.take() {
            Some(result) => result,
            None => match writing.fut.as_mut().poll(cx) {
                Poll::Ready(result) => result,
                Poll::Pending => return None,
            },
        };
        let seq = writing.seq;
        self.writing.pop_front();
        match result {
            Ok(confirm) => match self.entries.get_mut(&seq) {
                Some(entry) => {
                    entry.confirm = Some(confirm);
                    Some(Some(seq))
                }
                // Forgotten meanwhile (its channel was dropped): nothing to follow.
                None => Some(None),
            },
            Err(e) => {
                self.taint_if_current(seq);
                self.report(seq, PublishOutcome::Failed(Error::amqp(e)));
                self.forget(seq);
                Some(None)
            }
        }
    }

    /// Files the return a resolved confirm carries under the id of the message it returns.
    fn file_return(&mut self, seq: u64, result: &lapin::Result<Confirmation>) {
        let Ok(Confirmation::Ack(Some(ret)) | Confirmation::Nack(Some(ret))) = result else {
            return;
        };
        if let Some(epoch) = self.entries.get(&seq).map(|e| e.epoch) {
            self.file(epoch, ret);
        }
    }

    /// Files one return of the channel of `epoch` under the id of the message it returns.
    fn file(&mut self, epoch: u64, ret: &lapin::message::BasicReturnMessage) {
        if ret.reply_code == 0 {
            return;
        }
        let id = ret.properties.message_id().as_ref();
        let key = (epoch, self.id_hash(id), token_of(&ret.properties));
        if self.ids.contains(&key) {
            self.returns
                .insert(key, (ret.reply_code, ret.reply_text.to_string()));
        } else {
            let message_id = id.map_or("", |i| i.as_str());
            tracing::warn!(
                message_id,
                reply_code = ret.reply_code,
                "return for a publish this lane does not track; dropped"
            );
        }
    }

    /// Locks lapin's acknowledgement table of every channel with publishes in flight: a
    /// multi-ack being applied holds that lock until all of its confirms are resolved.
    fn barrier(&mut self) {
        let mut carried = Vec::new();
        let current = match &self.chan {
            Chan::Open(open) => Some(open),
            _ => None,
        };
        for open in current.into_iter().chain(self.old.iter()) {
            // Takes the lock either way. With no confirm pending it resolves at once with
            // the returns lapin holds, filed here by id. Otherwise it stays pending and is
            // dropped, having taken lapin's "last pending" promise: the returns stay with
            // lapin until a confirm carries them (filed by `file_return`) or the next
            // barrier, finding no promise, drains them. Either way a return is filed
            // under its publish's id before that publish's outcome is reported.
            if let Some(Ok(returns)) = open.channel.wait_for_confirms().now_or_never() {
                carried.extend(returns.into_iter().map(|r| (open.epoch, r)));
            }
        }
        for (epoch, ret) in carried {
            self.file(epoch, &ret);
        }
    }

    /// A confirm resolved: report the outcome (unless already reported) and forget the entry.
    fn finish(&mut self, seq: u64, result: lapin::Result<Confirmation>) {
        let Some(entry) = self.entries.get(&seq) else {
            return;
        };
        if entry.reply.is_some() {
            // Nearly always empty: no lookup then.
            let returned = if self.returns.is_empty() {
                None
            } else {
                let key = (entry.epoch, entry.id.0, entry.id.1);
                self.returns.get(&key).cloned()
            };
            let outcome = match (result, returned) {
                (
                    Ok(Confirmation::Ack(_) | Confirmation::Nack(_)),
                    Some((reply_code, reply_text)),
                ) => PublishOutcome::Returned {
                    reply_code,
                    reply_text,
                },
                (Ok(Confirmation::Ack(_)), None) => PublishOutcome::Confirmed {
                    latency: entry.started.elapsed(),
                },
                (Ok(Confirmation::Nack(_)), None) => PublishOutcome::Nacked,
                (Ok(Confirmation::NotRequested), _) => {
                    PublishOutcome::Failed(Error::Amqp("channel is not in confirm mode".into()))
                }
                (Err(e), _) => PublishOutcome::Failed(Error::amqp(e)),
            };
            self.report(seq, outcome);
        }
        self.forget(seq);
    }

    /// Sends the outcome, frees the window slot, counts. The entry stays (as a zombie when
    /// its confirm is still pending) until [`Lane::forget`].
    fn report(&mut self, seq: u64, outcome: PublishOutcome) {
        let Some(entry) = self.entries.get_mut(&seq) else {
            return;
        };
        let Some((reply, permit)) = entry.reply.take() else {
            return;
        };
        self.deadlines.remove(&(entry.deadline, seq));
        self.shared
            .counters
            .unconfirmed
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        self.shared.count(&outcome);
        self.send_reply(reply, outcome);
        drop(permit);
    }

    /// Hands `outcome` to whoever waits for it. A stream is woken once per pass, by
    /// [`Lane::wake_streams`], however many of its outcomes the pass filed.
    fn send_reply(&mut self, reply: Reply, outcome: PublishOutcome) {
        if let Some(sink) = reply.send(outcome) {
            self.to_wake.push(sink);
        }
    }

    /// Wakes the streams this pass filed outcomes for.
    fn wake_streams(&mut self) {
        for sink in self.to_wake.drain(..) {
            sink.wake();
        }
    }

    fn forget(&mut self, seq: u64) {
        if let Some(entry) = self.entries.remove(&seq) {
            self.deadlines.remove(&(entry.deadline, seq));
            let key = (entry.epoch, entry.id.0, entry.id.1);
            self.returns.remove(&key);
            self.ids.remove(&key);
        }
    }

    fn taint_if_current(&mut self, seq: u64) {
        if self
            .entries
            .get(&seq)
            .is_some_and(|e| e.epoch == self.epoch)
        {
            self.tainted = true;
        }
    }

    fn poll_open(&mut self, cx: &mut Context<'_>) -> bool {
        let Chan::Opening(fut) = &mut self.chan else {
            return false;
        };
        let Poll::Ready(result) = fut.as_mut().poll(cx) else {
            return false;
        };
        self.chan = Chan::None;
        match result {
            Ok(Ok((conn, channel))) => {
                self.chan = Chan::Open(Open {
                    conn,
                    channel: Arc::new(channel),
                    epoch: self.epoch,
                });
            }
            // The attempt was bounded by the first waiting publish's deadline: that one
            // gets the verdict, the others get an attempt of their own.
            Ok(Err(e)) => self.fail_front(PublishOutcome::Failed(e)),
            // Out of time: the attempt was bounded by the first waiting publish's deadline,
            // so that one is due; `expire` reports every due publish, and the others get an
            // attempt of their own.
            Err(_) => {}
        }
        true
    }

    /// The current channel's connection, else the one the last channel open got.
    fn conn(&self) -> Option<Arc<Conn>> {
        match &self.chan {
            Chan::Open(open) => Some(open.conn.clone()),
            _ => self
                .last_conn
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        }
    }

    /// Whether the connection was blocked by a resource alarm at some point while `job`
    /// waited unwritten: blocked now, or blocked (and maybe unblocked) since it arrived.
    fn waited_blocked(&self, job: &Job) -> bool {
        let Some(conn) = self.conn() else {
            return false;
        };
        let now = conn.is_usable() && conn.is_blocked();
        let since = job
            .blocks_before
            .as_ref()
            .is_some_and(|w| Arc::ptr_eq(&w.conn, &conn) && w.seen_blocked());
        now || since
    }

    fn fail_front(&mut self, outcome: PublishOutcome) {
        if let Some(job) = self.backlog.pop_front() {
            self.reply_unwritten(job, outcome);
        }
    }

    fn reply_unwritten(&mut self, job: Job, outcome: PublishOutcome) {
        self.shared.count(&outcome);
        self.send_reply(job.reply, outcome);
        drop(job.permit);
    }

    /// Reports every publish whose deadline passed, written or not.
    fn expire(&mut self) -> bool {
        let first_entry = self.deadlines.first().map(|(d, _)| *d);
        let first_job = self.backlog.front().map(|j| j.deadline);
        let due = match (first_entry, first_job) {
            (None, None) => return false,
            (a, b) => a.into_iter().chain(b).min(),
        };
        let now = Instant::now();
        if due.is_some_and(|d| d > now) {
            return false;
        }
        let mut progress = false;
        while let Some(&(deadline, seq)) = self.deadlines.first() {
            if deadline > now {
                break;
            }
            self.deadlines.pop_first();
            let outcome = match self.entries.get(&seq) {
                Some(entry) => entry.timed_out(),
                None => continue,
            };
            self.taint_if_current(seq);
            self.report(seq, outcome);
            progress = true;
        }
        if self.backlog.front().is_some_and(|j| j.deadline <= now) {
            let (due, waiting): (Vec<Job>, Vec<Job>) =
                self.backlog.drain(..).partition(|j| j.deadline <= now);
            self.backlog = waiting.into();
            for job in due {
                let blocked = self.waited_blocked(&job);
                self.reply_unwritten(job, PublishOutcome::TimedOut { blocked });
            }
            progress = true;
        }
        progress
    }

    fn has_unreported(&self, epoch: Option<u64>) -> bool {
        self.entries
            .values()
            .any(|e| e.reply.is_some() && epoch.is_none_or(|ep| e.epoch == ep))
    }

    /// Drops a tainted channel once nothing unreported is left on it.
    fn recycle(&mut self) -> bool {
        if !self.tainted || self.has_unreported(Some(self.epoch)) {
            return false;
        }
        let epoch = self.epoch;
        let unwritten = self.take_writes(epoch);
        let zombies: Vec<u64> = self
            .entries
            .iter()
            .filter(|(_, e)| e.epoch == epoch)
            .map(|(seq, _)| *seq)
            .collect();
        for seq in zombies {
            self.forget(seq);
        }
        self.close_channel_after(unwritten);
        self.epoch += 1;
        self.tainted = false;
        tracing::debug!(epoch, "publisher channel dropped after a timeout");
        true
    }

    /// The hash a message id is filed under (no id and an empty one hash alike, as they
    /// did as strings).
    fn id_hash(&self, id: Option<&ShortString>) -> u64 {
        self.id_hasher.hash_one(id.map_or("", |i| i.as_str()))
    }

    /// Arms the timer for the next deadline; true if it has already fired.
    fn timer_fired(&mut self, cx: &mut Context<'_>) -> bool {
        let next = self
            .deadlines
            .first()
            .map(|(d, _)| *d)
            .into_iter()
            .chain(self.backlog.front().map(|j| j.deadline))
            .min();
        let Some(next) = next else {
            return false;
        };
        // Re-arming costs a timer-wheel update; an earlier alarm simply fires and re-arms.
        if self.armed.is_none_or(|a| next < a) {
            self.timer.as_mut().reset(next);
            self.armed = Some(next);
        }
        if self.timer.as_mut().poll(cx).is_ready() {
            self.armed = None;
            return true;
        }
        false
    }
}
