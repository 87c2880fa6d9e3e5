//! Ack frames of one consume channel that are queued and not written yet.
//!
//! `Channel::basic_ack` queues its frame on its first poll (lapin 4.12) and resolves once
//! lapin's I/O thread has written it. A pipeline that awaited that write itself was woken
//! from lapin's I/O thread once per delivery: a wake-up of the runtime (an `eventfd` write
//! and often a thread switch) for every ack, about one system call per message on the
//! success path (docs/PROFILE.md). Instead, a pipeline polls its ack once (the frame is
//! queued: the settlement is made, in channel order) and hands the rest of the future to
//! this channel's collector, one task that awaits every pending write, counts it as
//! `acked` or `ack_lost`, and tells the coalescing ledger the tag is settled. lapin resolves
//! the writes of one socket write together, so the collector wakes once per batch.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::stats::Counters;

/// An ack frame queued on its channel: resolves once written (`Ok(true)`), or with the
/// channel's failure. Its ledger, if any, is told before it resolves.
pub(crate) type Write = Pin<Box<dyn Future<Output = Result<bool, lapin::Error>> + Send>>;

enum Msg {
    Write(Write),
    /// The channel is closing: finish what is pending, then stop.
    Close,
}

/// Where the pipelines of one channel hand their pending writes (cloned into every
/// delivery's settle handle).
#[derive(Clone)]
pub(crate) struct Writes {
    tx: mpsc::UnboundedSender<Msg>,
}

impl std::fmt::Debug for Writes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writes").finish_non_exhaustive()
    }
}

impl Writes {
    /// Hands a write (polled once already: its frame is queued) to the collector. When the
    /// collector is gone (its channel was finished while a straggler still settled), the
    /// write is given back to be awaited by the caller.
    pub(crate) fn hand_over(&self, write: Write) -> Result<(), Write> {
        self.tx.send(Msg::Write(write)).map_err(|e| match e.0 {
            Msg::Write(w) => w,
            // Never sent by this path.
            Msg::Close => Box::pin(std::future::ready(Ok(false))),
        })
    }
}

/// Counts one ack write's result; false when the ack was lost.
pub(crate) fn count(counters: &Counters, sent: Result<bool, lapin::Error>) -> bool {
    match sent {
        Ok(true) => {
            Counters::inc(&counters.acked);
            Counters::inc(&counters.ack_frames);
            true
        }
        Ok(false) => {
            Counters::inc(&counters.ack_lost);
            tracing::warn!("settle found its channel gone; the broker will redeliver");
            false
        }
        Err(e) => {
            Counters::inc(&counters.ack_lost);
            tracing::warn!(error = %e, "settle failed: channel gone, the broker will redeliver");
            false
        }
    }
}

/// The collector of one consume channel, as its consume loop owns it.
pub(crate) struct ChannelWrites {
    writes: Writes,
    task: Option<JoinHandle<()>>,
}

impl ChannelWrites {
    /// Starts the collector of a new channel; its counts go to `counters`.
    pub(crate) fn start(counters: std::sync::Arc<Counters>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let task = Some(tokio::spawn(collect(rx, counters)));
        Self {
            writes: Writes { tx },
            task,
        }
    }

    /// What every delivery of the channel carries.
    pub(crate) fn writes(&self) -> &Writes {
        &self.writes
    }

    /// Waits until every write handed over so far has resolved, then stops the collector.
    /// Call once the channel's pipelines have ended, before the channel is closed (the
    /// close would be queued behind the acks anyway; waiting keeps the counts exact).
    pub(crate) async fn finish(mut self) {
        let _ = self.writes.tx.send(Msg::Close);
        if let Some(task) = self.task.take() {
            super::join_bounded(task, "acks").await;
        }
    }
}

impl Drop for ChannelWrites {
    fn drop(&mut self) {
        // The collector finishes what it has and stops.
        let _ = self.writes.tx.send(Msg::Close);
    }
}

async fn collect(mut rx: mpsc::UnboundedReceiver<Msg>, counters: std::sync::Arc<Counters>) {
    let mut pending: FuturesUnordered<Write> = FuturesUnordered::new();
    let mut closing = false;
    std::future::poll_fn(|cx| {
        loop {
            match rx.poll_recv(cx) {
                Poll::Ready(Some(Msg::Write(w))) => pending.push(w),
                Poll::Ready(Some(Msg::Close)) | Poll::Ready(None) => {
                    closing = true;
                    break;
                }
                Poll::Pending => break,
            }
        }
        while let Poll::Ready(Some(sent)) = pending.poll_next_unpin(cx) {
            count(&counters, sent);
        }
        if closing && pending.is_empty() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    // Handed over between the close and now: awaited here, so none goes uncounted.
    rx.close();
    while let Ok(msg) = rx.try_recv() {
        if let Msg::Write(w) = msg {
            count(&counters, w.await);
        }
    }
}
