//! Where a lane's publishes come from and their outcomes go: the jobs a lane receives, and
//! the replies (a `send`'s oneshot, a `publish_many` stream's slot) it hands outcomes to.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Context;

use futures_util::task::AtomicWaker;
use tokio::sync::{OwnedSemaphorePermit, oneshot};
use tokio::time::Instant;

use super::PublishOutcome;
use crate::connection::Conn;
use crate::envelope::Prepared;
use crate::error::Error;

/// Where a publish's outcome goes.
pub(super) enum Reply {
    /// To the [`PendingConfirm`](super::PendingConfirm) of a `send`.
    Task(oneshot::Sender<PublishOutcome>),
    /// To the `publish_many` stream the publish belongs to.
    Batch(BatchSlot),
}

impl Reply {
    /// Hands `outcome` over; the stream's sink when it now owes its stream a wake-up (a
    /// lane folds those into one per pass).
    pub(super) fn send(self, outcome: PublishOutcome) -> Option<Arc<BatchSink>> {
        match self {
            Reply::Task(tx) => {
                let _ = tx.send(outcome);
                None
            }
            Reply::Batch(mut slot) => slot.fill(outcome),
        }
    }

    /// Hands `outcome` over now (outside a lane: no wake-up to fold).
    pub(super) fn deliver(self, outcome: PublishOutcome) {
        if let Some(sink) = self.send(outcome) {
            sink.wake();
        }
    }
}

/// The outcomes of one `publish_many` stream, filled by the lanes, emptied by the stream.
#[derive(Default)]
pub(super) struct BatchSink {
    outcomes: Mutex<VecDeque<(usize, PublishOutcome)>>,
    stream: AtomicWaker,
    /// A wake-up of the stream is owed (a lane wakes it once per pass, not per outcome).
    owed: AtomicBool,
    /// The stream is gone: outcomes are counted by the lanes, not kept.
    dropped: AtomicBool,
}

impl BatchSink {
    /// Registers the stream's waker, then moves every outcome filed so far into `out`.
    pub(super) fn take(&self, cx: &Context<'_>, out: &mut VecDeque<(usize, PublishOutcome)>) {
        self.stream.register(cx.waker());
        out.append(&mut self.outcomes.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// The stream is dropped: stop keeping outcomes.
    pub(super) fn close(&self) {
        self.dropped.store(true, Ordering::Release);
        self.outcomes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    pub(super) fn wake(&self) {
        // AcqRel: the outcomes of lanes that found the wake-up owed are seen by the stream.
        self.owed.swap(false, Ordering::AcqRel);
        self.stream.wake();
    }
}

/// One publish's place in its `publish_many` stream. Dropped unfilled (its lane's task
/// ended with the runtime), it files a `Failed` outcome, as a dropped oneshot fails a
/// [`PendingConfirm`](super::PendingConfirm).
pub(super) struct BatchSlot {
    index: usize,
    sink: Option<Arc<BatchSink>>,
    /// The publish's `send` span, closed with its outcome.
    #[cfg(feature = "otel")]
    span: tracing::Span,
}

impl BatchSlot {
    pub(super) fn new(
        index: usize,
        sink: Arc<BatchSink>,
        #[cfg(feature = "otel")] span: tracing::Span,
    ) -> Self {
        Self {
            index,
            sink: Some(sink),
            #[cfg(feature = "otel")]
            span,
        }
    }

    /// Files `outcome` (once: the slot is empty afterwards); the sink when it now owes its
    /// stream a wake-up.
    fn fill(&mut self, outcome: PublishOutcome) -> Option<Arc<BatchSink>> {
        #[cfg(feature = "otel")]
        crate::observe::otel::sent(&self.span, &outcome);
        let sink = self.sink.take()?;
        if sink.dropped.load(Ordering::Acquire) {
            return None;
        }
        sink.outcomes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back((self.index, outcome));
        (!sink.owed.swap(true, Ordering::AcqRel)).then_some(sink)
    }
}

impl Drop for BatchSlot {
    fn drop(&mut self) {
        if self.sink.is_some() {
            let failed = PublishOutcome::Failed(Error::Amqp(
                "publisher task ended (runtime shut down)".into(),
            ));
            if let Some(sink) = self.fill(failed) {
                sink.wake();
            }
        }
    }
}

/// What a lane's queue carries: one publish (`send`) or a stream's pass (`publish_many`).
// A `Job` is carried inline, as before there were passes: boxing it would cost `send` an
// allocation per publish, and the queue's blocks hold a message in place either way.
#[allow(clippy::large_enum_variant)]
pub(super) enum LaneMsg {
    One(Job),
    Many(Vec<Job>),
}

/// One publish handed to a lane. It holds its window slot until its outcome is reported.
pub(super) struct Job {
    pub(super) prepared: Prepared,
    pub(super) permit: OwnedSemaphorePermit,
    pub(super) reply: Reply,
    pub(super) started: Instant,
    pub(super) deadline: Instant,
    /// The lane's connection when the lane took the job: a job that times out before it
    /// is written reports whether that connection was blocked while it waited.
    pub(super) blocks_before: Option<BlockWatch>,
}

/// Whether a connection was blocked by a resource alarm at some point since the watch
/// began: blocked then, blocked now, or blocked (and unblocked) in between.
pub(super) struct BlockWatch {
    pub(super) conn: Arc<Conn>,
    blocks: u64,
    blocked_then: bool,
}

impl BlockWatch {
    pub(super) fn new(conn: Arc<Conn>) -> Self {
        Self {
            blocks: conn.block_count(),
            blocked_then: conn.is_blocked(),
            conn,
        }
    }

    pub(super) fn seen_blocked(&self) -> bool {
        self.blocked_then || self.conn.is_blocked() || self.conn.block_count() != self.blocks
    }
}
