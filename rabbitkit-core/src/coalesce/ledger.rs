//! The per-channel ledger of delivery tags: which are still being handled, which are held
//! acks, and when to flush them.
//!
//! Why it must be this careful: RabbitMQ applies `basic.ack multiple=true` to every
//! unacknowledged delivery of the channel up to the tag, and answers an ack, nack or reject
//! of a tag it no longer knows with `PRECONDITION_FAILED`, closing the channel (every other
//! unacked delivery is then redelivered). lapin 4.12 does not track multiple acks: the
//! deliveries a multiple ack covered look unsettled to it. Hence:
//! - a tag leaves the ledger only once the frame that settles it has been written (its
//!   future resolved), so a later multiple ack never overtakes an earlier nack of a lower
//!   tag, nor an earlier ack it would make a second ack of (the tags of a flushed run leave
//!   when the flush takes them: no unsettled tag is left below them);
//! - one task per channel sends the flushes, one at a time;
//! - a held delivery is never settled again: holding takes its single-use switch, which
//!   the pipeline's guard asks ([`Original::usable`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use lapin::options::{BasicAckOptions, BasicNackOptions, BasicRejectOptions};
use lapin::{Acker, Channel};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::AckCoalescing;
use super::writes::{Write, Writes};
use crate::stats::Counters;

/// One delivery tag of the channel.
#[derive(Debug)]
enum Slot<A> {
    /// Handed to a handler, or settling by a nack, a reject or a copy: not settled yet.
    Busy,
    /// A success whose ack is held, since `since`.
    Held { acker: A, since: Instant },
    /// Its ack is being written by the current flush.
    Sending,
}

/// What one flush sends.
#[derive(Debug)]
struct Batch<A> {
    /// The acker of the highest tag of the run of held acks at the bottom of the ledger,
    /// and the length of that run: one ack, `multiple` when longer than one.
    run: Option<(A, usize)>,
    /// Held acks above a delivery still unsettled, acked one by one.
    singles: Vec<(u64, A)>,
}

/// What the flusher does next.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// Flush; `force` sends every held ack, the ones that cannot join the run singly.
    Flush { force: bool },
    /// Wait for a hold, or until this instant (the oldest held ack is due).
    Wait(Option<Instant>),
    /// Closed and nothing left to send.
    Done,
}

/// The tags of one channel (the pure part of the [`Ledger`]).
#[derive(Debug)]
struct State<A> {
    slots: BTreeMap<u64, Slot<A>>,
    /// `Held` slots.
    held: usize,
    /// When the oldest held ack was held.
    first_held: Option<Instant>,
    /// No more holds: the channel is closing or gone.
    closed: bool,
}

impl<A> Default for State<A> {
    fn default() -> Self {
        Self {
            slots: BTreeMap::new(),
            held: 0,
            first_held: None,
            closed: false,
        }
    }
}

impl<A> State<A> {
    /// Holds the ack of `tag`, a `Busy` slot. Hands `acker` back when the ack must be sent
    /// at once (closed, or the tag is not a delivery still being handled).
    fn hold(&mut self, tag: u64, acker: A, now: Instant) -> Result<(), A> {
        if self.closed {
            return Err(acker);
        }
        match self.slots.get_mut(&tag) {
            Some(slot @ Slot::Busy) => *slot = Slot::Held { acker, since: now },
            _ => return Err(acker),
        }
        self.held += 1;
        if self.held == 1 {
            self.first_held = Some(now);
        }
        Ok(())
    }

    fn step(&self, now: Instant, cfg: &AckCoalescing) -> Step {
        if self.closed {
            return if self.held > 0 {
                Step::Flush { force: true }
            } else {
                Step::Done
            };
        }
        if self.held >= usize::from(cfg.max_acks) {
            return Step::Flush { force: false };
        }
        match self.first_held.map(|t| t + cfg.max_delay) {
            Some(due) if due <= now => Step::Flush { force: true },
            due => Step::Wait(due),
        }
    }

    /// Takes what a flush sends: the run of held acks at the bottom (removed: their tags are
    /// settled once the one ack is written), and, when `force` or when the acks still held
    /// would fill a batch, every other held ack (marked `Sending` until written).
    fn take(&mut self, force: bool, max_acks: usize) -> Batch<A> {
        let mut run = None;
        while let Some(entry) = self.slots.first_entry() {
            if !matches!(entry.get(), Slot::Held { .. }) {
                break;
            }
            if let Slot::Held { acker, .. } = entry.remove() {
                let n = run.as_ref().map_or(0, |(_, n)| *n);
                run = Some((acker, n + 1));
            }
        }
        let in_run = run.as_ref().map_or(0, |(_, n)| *n);
        self.held -= in_run;
        let mut singles = Vec::new();
        if force || self.held >= max_acks {
            for (tag, slot) in self.slots.iter_mut() {
                if matches!(slot, Slot::Held { .. })
                    && let Slot::Held { acker, .. } = std::mem::replace(slot, Slot::Sending)
                {
                    singles.push((*tag, acker));
                }
            }
            self.held = 0;
        }
        self.first_held = self
            .slots
            .values()
            .filter_map(|s| match s {
                Slot::Held { since, .. } => Some(*since),
                _ => None,
            })
            .min();
        Batch { run, singles }
    }

    /// Forgets `tag` when it is `Busy` or `Sending`: its settling frame was written (or its
    /// channel is gone).
    fn done(&mut self, tag: u64) {
        if matches!(self.slots.get(&tag), Some(Slot::Busy) | Some(Slot::Sending)) {
            self.slots.remove(&tag);
        }
    }
}

/// The ledger of one consume channel (see the [module docs](self)).
pub(crate) struct Ledger {
    /// A held slot keeps its own tag (the acker type of the pure part).
    state: Mutex<State<u64>>,
    /// The channel the tags belong to: every flush acks on it.
    channel: Arc<Channel>,
    cfg: AckCoalescing,
    counters: Arc<Counters>,
    /// Wakes the flusher: the first held ack (arms the timer), a full batch, closing.
    wake: Notify,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

impl Ledger {
    fn lock(&self) -> MutexGuard<'_, State<u64>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A delivery of this channel, taken from the consumer (in tag order, before its
    /// pipeline starts).
    pub(crate) fn register(&self, tag: u64) {
        self.lock().slots.insert(tag, Slot::Busy);
    }

    fn hold(&self, tag: u64) -> bool {
        let held = {
            let mut s = self.lock();
            match s.hold(tag, tag, Instant::now()) {
                Ok(()) => Some(s.held),
                Err(_) => None,
            }
        };
        match held {
            Some(n) => {
                if n == 1 || n >= usize::from(self.cfg.max_acks) {
                    self.wake.notify_one();
                }
                true
            }
            None => false,
        }
    }

    fn done(&self, tag: u64) {
        self.lock().done(tag);
    }

    fn close(&self) {
        self.lock().closed = true;
        self.wake.notify_one();
    }

    /// The flusher: one per channel, so flushes never overlap.
    async fn run(self: Arc<Self>) {
        loop {
            let woken = self.wake.notified();
            let step = self.lock().step(Instant::now(), &self.cfg);
            match step {
                Step::Done => return,
                Step::Flush { force } => self.flush(force).await,
                Step::Wait(None) => woken.await,
                Step::Wait(Some(due)) => {
                    tokio::select! {
                        _ = woken => {}
                        _ = tokio::time::sleep_until(tokio::time::Instant::from_std(due)) => {}
                    }
                }
            }
        }
    }

    async fn flush(&self, force: bool) {
        let batch = self.lock().take(force, usize::from(self.cfg.max_acks));
        let mut sends = Vec::with_capacity(batch.singles.len() + 1);
        if let Some((top, n)) = batch.run {
            sends.push(Box::pin(self.send(top, n, None)));
        }
        for (tag, _) in batch.singles {
            sends.push(Box::pin(self.send(tag, 1, Some(tag))));
        }
        futures_util::future::join_all(sends).await;
    }

    /// Acks `n` deliveries up to `top` (the highest of them; `multiple` when `n > 1`).
    /// `single` is the tag of a `Sending` slot, forgotten once written.
    async fn send(&self, top: u64, n: usize, single: Option<u64>) {
        let ack = self
            .channel
            .basic_ack(top, BasicAckOptions { multiple: n > 1 });
        #[cfg(feature = "otel")]
        let ack = tracing::Instrument::instrument(
            ack,
            crate::observe::otel::settle_span(&self.counters.queue, "ack"),
        );
        let sent = ack.await;
        if let Some(tag) = single {
            self.done(tag);
        }
        let n = u64::try_from(n).unwrap_or(u64::MAX);
        match sent {
            Ok(()) => {
                Counters::add(&self.counters.acked, n);
                Counters::inc(&self.counters.ack_frames);
            }
            Err(e) => {
                Counters::add(&self.counters.ack_lost, n);
                tracing::warn!(acks = n, error = %e, "held acks found their channel gone; the broker will redeliver");
            }
        }
    }
}

/// The ledger of one channel as its consume loop owns it: starts the flusher, and closes
/// the ledger when dropped (a hold after that is acked at once).
pub(crate) struct ChannelAcks {
    ledger: Arc<Ledger>,
    flusher: Option<JoinHandle<()>>,
}

impl ChannelAcks {
    /// A ledger for a new channel, its flusher running.
    pub(crate) fn start(
        cfg: AckCoalescing,
        channel: Arc<Channel>,
        counters: Arc<Counters>,
    ) -> Self {
        let ledger = Arc::new(Ledger {
            state: Mutex::new(State::default()),
            channel,
            cfg,
            counters,
            wake: Notify::new(),
        });
        let flusher = Some(tokio::spawn(ledger.clone().run()));
        Self { ledger, flusher }
    }

    /// What each delivery of the channel carries.
    pub(crate) fn ledger(&self) -> &Arc<Ledger> {
        &self.ledger
    }

    /// Sends every held ack and stops the flusher: call before the channel is closed.
    /// Deliveries still being handled then ack (or nack) on their own.
    pub(crate) async fn finish(mut self) {
        self.ledger.close();
        if let Some(flusher) = self.flusher.take() {
            super::join_bounded(flusher, "held acks").await;
        }
    }
}

impl Drop for ChannelAcks {
    fn drop(&mut self) {
        self.ledger.close();
    }
}

/// The original delivery as settlements see it: its channel, its tag, a single-use switch,
/// and the ledger of its channel when acks are coalesced. Cloned by every part of a
/// pipeline that may settle it. Every settlement takes its single-use switch first (an ack
/// held by the ledger too), so at most one settlement frame is ever sent for it alone; a
/// held ack is then written as part of the ledger's (multiple) ack of its run.
///
/// Settlement frames go straight to the delivery's own channel (`Channel::basic_ack` and
/// friends), not through lapin's `Acker`: lapin 4.12 routes an acker's frame through its
/// connection's internal RPC task, which spawns a task per ack before the frame is queued
/// (two more task wake-ups per delivery; docs/PROFILE.md). Frames queued on one channel are
/// written in the order they were queued.
#[derive(Clone)]
pub(crate) struct Original(Arc<Settle>);

/// What the deliveries of one consume channel share to settle: the channel, its ledger when
/// acks are coalesced, and its collector of pending ack writes ([`super::writes`]).
#[derive(Debug)]
pub(crate) struct OnChannel {
    channel: Arc<Channel>,
    ledger: Option<Arc<Ledger>>,
    writes: Writes,
}

impl OnChannel {
    pub(crate) fn new(channel: Arc<Channel>, ledger: Option<Arc<Ledger>>, writes: Writes) -> Self {
        Self {
            channel,
            ledger,
            writes,
        }
    }

    /// Registers a delivery of this channel with its ledger, if acks are coalesced (in tag
    /// order, before its pipeline starts).
    pub(crate) fn register(&self, tag: u64) {
        if let Some(l) = &self.ledger {
            l.register(tag);
        }
    }
}

struct Settle {
    on: Arc<OnChannel>,
    /// Set when the channel closes or fails (lapin's per-channel poison).
    poison: Acker,
    tag: u64,
    /// Set by the first settlement: no second frame for this tag, ever.
    used: AtomicBool,
}

impl Original {
    /// `acker`: the delivery's own, read only for its channel's state (never used to settle).
    pub(crate) fn new(on: Arc<OnChannel>, acker: Acker, tag: u64) -> Self {
        Self(Arc::new(Settle {
            on,
            poison: acker,
            tag,
            used: AtomicBool::new(false),
        }))
    }

    /// Neither settled nor held, and its channel still open: what the pipeline's guard
    /// must requeue. Holding an ack takes the switch too (a held ack is a settlement in
    /// progress), so the guard never touches a held delivery.
    pub(crate) fn usable(&self) -> bool {
        !self.0.used.load(Ordering::Acquire) && !self.0.poison.poisoned()
    }

    /// Takes the single settlement: false when it was taken or the channel is gone.
    pub(crate) fn take(&self) -> bool {
        !self.0.poison.poisoned() && !self.0.used.swap(true, Ordering::AcqRel)
    }

    /// Acks the delivery. `Ok(false)`: settled already, or its channel was gone; `Err`: the
    /// channel failed before the frame was written. Either way the broker redelivers unless
    /// an earlier settlement reached it.
    pub(crate) async fn ack(&self) -> Result<bool, lapin::Error> {
        if !self.take() {
            return Ok(false);
        }
        self.ack_taken().await
    }

    /// Acks the delivery whose settlement the caller has taken ([`Original::take`]).
    pub(crate) async fn ack_taken(&self) -> Result<bool, lapin::Error> {
        let s = &self.0;
        s.on.channel
            .basic_ack(s.tag, BasicAckOptions { multiple: false })
            .await
            .map(|()| true)
    }

    /// The ack of a delivery whose settlement the caller has taken, as a write of its own:
    /// its first poll queues the frame; it resolves once the frame is written, the ledger
    /// told. Poll it once, then hand it to the channel's collector ([`Original::hand_over`]).
    pub(crate) fn ack_write(&self) -> Write {
        let original = self.clone();
        Box::pin(async move {
            let sent = original.ack_taken().await;
            original.done();
            sent
        })
    }

    /// Hands a write already polled once to the channel's collector, which awaits and
    /// counts it; gives it back when the collector is gone.
    pub(crate) fn hand_over(&self, write: Write) -> Result<(), Write> {
        self.0.on.writes.hand_over(write)
    }

    /// Rejects the delivery, requeued or not (as [`Original::ack`]).
    pub(crate) async fn reject(&self, requeue: bool) -> Result<bool, lapin::Error> {
        if !self.take() {
            return Ok(false);
        }
        let s = &self.0;
        s.on.channel
            .basic_reject(s.tag, BasicRejectOptions { requeue })
            .await
            .map(|()| true)
    }

    /// Nack-requeues the delivery (as [`Original::ack`]).
    pub(crate) async fn nack_requeue(&self) -> Result<bool, lapin::Error> {
        if !self.take() {
            return Ok(false);
        }
        let s = &self.0;
        s.on.channel
            .basic_nack(
                s.tag,
                BasicNackOptions {
                    multiple: false,
                    requeue: true,
                },
            )
            .await
            .map(|()| true)
    }

    /// Hands a due ack to the ledger, the settlement already taken. False when there is no
    /// ledger or it is closed: ack now ([`Original::ack_taken`]).
    pub(crate) fn hold(&self) -> bool {
        self.0
            .on
            .ledger
            .as_ref()
            .is_some_and(|l| l.hold(self.0.tag))
    }

    /// The frame settling this delivery was written (or never will be): a multiple ack
    /// may now cover its tag.
    pub(crate) fn done(&self) {
        if let Some(l) = &self.0.on.ledger {
            l.done(self.0.tag);
        }
    }

    /// Calls [`Original::done`] once `written` (a nack already queued) resolves. Without a
    /// ledger, or without a runtime to wait on, nothing waits: the tag then stays unsettled
    /// in the ledger, and held acks above it are sent one by one.
    pub(crate) fn done_after<F>(&self, written: F)
    where
        F: std::future::Future + Send + 'static,
    {
        let Some(ledger) = self.0.on.ledger.clone() else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let tag = self.0.tag;
        rt.spawn(async move {
            written.await;
            ledger.done(tag);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn cfg(max_acks: u16, ms: u64) -> AckCoalescing {
        AckCoalescing::new(max_acks, Duration::from_millis(ms))
    }

    /// A ledger with `tags` registered.
    fn state(tags: impl IntoIterator<Item = u64>) -> State<u64> {
        let mut s = State::default();
        for t in tags {
            s.slots.insert(t, Slot::Busy);
        }
        s
    }

    fn hold(s: &mut State<u64>, tags: impl IntoIterator<Item = u64>) {
        for t in tags {
            assert!(s.hold(t, t, Instant::now()).is_ok(), "tag {t} held");
        }
    }

    #[test]
    fn a_run_stops_at_the_first_delivery_still_unsettled() {
        let mut s = state(1..=6);
        hold(&mut s, [1, 2, 3, 5, 6]);
        let b = s.take(false, 8);
        assert_eq!(b.run, Some((3, 3)), "one multiple ack on 3 covers 1..=3");
        assert!(
            b.singles.is_empty(),
            "5 and 6 wait: 4 is still being handled"
        );
        assert_eq!(s.held, 2);
        // 4 settles by a reject, written: 5 and 6 may now join a run.
        s.done(4);
        let b = s.take(false, 8);
        assert_eq!(b.run, Some((6, 2)));
        assert!(s.slots.is_empty());
    }

    #[test]
    fn a_forced_flush_sends_what_cannot_join_the_run_one_by_one() {
        let mut s = state(1..=5);
        hold(&mut s, [2, 4, 5]);
        let b = s.take(true, 8);
        assert_eq!(b.run, None, "1 is still being handled");
        assert_eq!(b.singles, [(2, 2), (4, 4), (5, 5)]);
        assert_eq!(s.held, 0);
        assert_eq!(s.first_held, None);
        // Sending slots block a run until their ack is written.
        s.slots.insert(6, Slot::Busy);
        hold(&mut s, [6]);
        s.done(1);
        let b = s.take(false, 8);
        assert_eq!(b.run, None, "2 is being written");
        for t in [2, 4, 5] {
            s.done(t);
        }
        s.done(3);
        assert_eq!(s.take(false, 8).run, Some((6, 1)));
    }

    #[test]
    fn a_full_batch_that_cannot_coalesce_is_sent_singly() {
        let mut s = state(1..=4);
        hold(&mut s, [2, 3, 4]);
        assert_eq!(
            s.step(Instant::now(), &cfg(3, 1000)),
            Step::Flush { force: false }
        );
        let b = s.take(false, 3);
        assert_eq!(b.run, None);
        assert_eq!(b.singles.len(), 3, "still 3 held after the run: sent");
        let mut s = state(1..=4);
        hold(&mut s, [1, 2, 4]);
        let b = s.take(false, 3);
        assert_eq!(b.run, Some((2, 2)));
        assert!(b.singles.is_empty(), "one left held: it waits for 3");
    }

    #[test]
    fn the_flusher_waits_for_the_count_or_the_delay() {
        let c = cfg(3, 50);
        let mut s = state(1..=3);
        assert_eq!(s.step(Instant::now(), &c), Step::Wait(None));
        let t0 = Instant::now();
        assert!(s.hold(1, 1, t0).is_ok());
        assert_eq!(
            s.step(t0, &c),
            Step::Wait(Some(t0 + Duration::from_millis(50)))
        );
        assert_eq!(
            s.step(t0 + Duration::from_millis(50), &c),
            Step::Flush { force: true }
        );
        hold(&mut s, [2, 3]);
        assert_eq!(s.step(t0, &c), Step::Flush { force: false });
    }

    #[test]
    fn the_oldest_ack_left_held_sets_the_next_deadline() {
        let mut s = state(1..=4);
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_millis(3);
        assert!(s.hold(1, 1, t0).is_ok());
        assert!(s.hold(4, 4, t1).is_ok());
        let b = s.take(false, 8);
        assert_eq!(b.run, Some((1, 1)));
        assert_eq!(s.first_held, Some(t1));
    }

    #[test]
    fn a_closed_ledger_holds_nothing_and_flushes_what_it_has() {
        let c = cfg(8, 1000);
        let mut s = state(1..=3);
        hold(&mut s, [1]);
        s.closed = true;
        assert_eq!(s.hold(2, 2, Instant::now()), Err(2), "ack it at once");
        assert_eq!(s.step(Instant::now(), &c), Step::Flush { force: true });
        assert_eq!(s.take(true, 8).run, Some((1, 1)));
        assert_eq!(s.step(Instant::now(), &c), Step::Done);
    }

    #[test]
    fn only_a_delivery_being_handled_can_be_held() {
        let mut s = state([1]);
        hold(&mut s, [1]);
        assert_eq!(s.hold(1, 1, Instant::now()), Err(1), "held twice");
        assert_eq!(s.hold(9, 9, Instant::now()), Err(9), "never registered");
        // `done` never forgets a held ack: only its flush does.
        s.done(1);
        assert_eq!(s.held, 1);
        assert_eq!(s.take(true, 8).run, Some((1, 1)));
    }
}
