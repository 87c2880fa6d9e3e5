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

use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::stats::Counters;

/// An ack frame queued on its channel: resolves once written (`Ok(true)`), or with the
/// channel's failure. Its ledger, if any, is told before it resolves.
pub(crate) type Write = Pin<Box<dyn Future<Output = Result<bool, lapin::Error>> + Send>>;

/// Where the pipelines of one channel hand their pending writes (cloned into every
/// delivery's settle handle).
#[derive(Clone)]
pub(crate) struct Writes {
    tx: mpsc::UnboundedSender<Write>,
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
        self.tx.send(write).map_err(|e| e.0)
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
            lost(counters, None);
            false
        }
        Err(e) => {
            lost(counters, Some(e));
            false
        }
    }
}

/// Counts a settlement that found its channel gone (`err`: how), and says so.
pub(crate) fn lost(counters: &Counters, err: Option<lapin::Error>) {
    Counters::inc(&counters.ack_lost);
    match err {
        Some(e) => {
            tracing::warn!(error = %e, "settle failed: channel gone, the broker will redeliver")
        }
        None => tracing::warn!("settle found its channel gone; the broker will redeliver"),
    }
}

/// The collector of one consume channel, as its consume loop owns it.
pub(crate) struct ChannelWrites {
    writes: Writes,
    /// Sent (or dropped) when the channel closes: the collector finishes what it has and
    /// stops.
    close: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl ChannelWrites {
    /// Starts the collector of a new channel; its counts go to `counters`.
    pub(crate) fn start(counters: std::sync::Arc<Counters>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let (close, closed) = oneshot::channel();
        let task = Some(tokio::spawn(collect(rx, closed, counters)));
        Self {
            writes: Writes { tx },
            close: Some(close),
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
        self.close.take();
        if let Some(task) = self.task.take() {
            super::join_bounded(task, "acks").await;
        }
    }
}

/// Awaits and counts the writes of one channel until `closed` fires (or its sender is
/// dropped) and nothing is pending, then drains what was handed over meanwhile.
async fn collect(
    mut rx: mpsc::UnboundedReceiver<Write>,
    mut closed: oneshot::Receiver<()>,
    counters: std::sync::Arc<Counters>,
) {
    let mut pending: FuturesUnordered<Write> = FuturesUnordered::new();
    let mut closing = false;
    std::future::poll_fn(|cx| {
        while let Poll::Ready(Some(w)) = rx.poll_recv(cx) {
            pending.push(w);
        }
        if !closing && closed.poll_unpin(cx).is_ready() {
            closing = true;
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
    // Handed over between the close and now (a send still in progress included: `recv`
    // ends only once every send has landed or failed): awaited here, none uncounted.
    rx.close();
    while let Some(w) = rx.recv().await {
        count(&counters, w.await);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn counters() -> Arc<Counters> {
        Arc::new(Counters::default())
    }

    /// A write that resolves when `tx` sends (or is dropped: the channel failed).
    fn write() -> (oneshot::Sender<bool>, Write) {
        let (tx, rx) = oneshot::channel();
        let w: Write = Box::pin(async move {
            match rx.await {
                Ok(ok) => Ok(ok),
                Err(_) => Err(lapin::Error::from(lapin::ErrorKind::InvalidChannelState(
                    lapin::ChannelState::Closed,
                    "basic.ack",
                ))),
            }
        });
        (tx, w)
    }

    #[tokio::test]
    async fn finish_waits_for_every_pending_write_and_counts_each() {
        let c = counters();
        let cw = ChannelWrites::start(c.clone());
        let (a, wa) = write();
        let (b, wb) = write();
        let (d, wd) = write();
        assert!(cw.writes().hand_over(wa).is_ok());
        assert!(cw.writes().hand_over(wb).is_ok());
        assert!(cw.writes().hand_over(wd).is_ok());
        let finishing = tokio::spawn(cw.finish());
        tokio::task::yield_now().await;
        assert!(!finishing.is_finished(), "three writes still pending");
        let _ = a.send(true);
        let _ = b.send(false);
        drop(d);
        finishing.await.unwrap_or_else(|e| panic!("finish: {e}"));
        assert_eq!(c.snapshot().acked, 1);
        assert_eq!(c.snapshot().ack_frames, 1);
        assert_eq!(c.snapshot().ack_lost, 2, "Ok(false) and Err");
    }

    #[tokio::test]
    async fn a_write_handed_over_after_the_collector_stopped_is_given_back() {
        let c = counters();
        let cw = ChannelWrites::start(c.clone());
        let writes = cw.writes().clone();
        cw.finish().await;
        let (tx, w) = write();
        let back = writes.hand_over(w);
        let Err(back) = back else {
            panic!("the collector is gone: the write must come back to its caller")
        };
        let _ = tx.send(true);
        assert!(count(&c, back.await));
        assert_eq!(c.snapshot().acked, 1);
    }

    #[tokio::test]
    async fn writes_handed_over_around_the_close_are_all_counted() {
        let c = counters();
        let (tx, rx) = mpsc::unbounded_channel();
        let (close, closed) = oneshot::channel();
        let ok = || -> Write { Box::pin(async { Ok(true) }) };
        assert!(tx.send(ok()).is_ok());
        drop(close);
        assert!(tx.send(ok()).is_ok());
        let (late, w) = write();
        assert!(tx.send(w).is_ok());
        let collector = tokio::spawn(collect(rx, closed, c.clone()));
        tokio::task::yield_now().await;
        assert!(
            !collector.is_finished(),
            "a write handed over is still pending"
        );
        let _ = late.send(true);
        collector.await.unwrap_or_else(|e| panic!("collector: {e}"));
        assert_eq!(c.snapshot().acked, 3, "before and after the close alike");
        assert!(
            tx.send(ok()).is_err(),
            "a stopped collector takes no more writes"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_racing_the_close_are_all_counted() {
        for _ in 0..50 {
            let c = counters();
            let cw = ChannelWrites::start(c.clone());
            let writes = cw.writes().clone();
            let sender = tokio::spawn(async move {
                let mut back = 0u64;
                for _ in 0..200 {
                    let w: Write = Box::pin(async { Ok(true) });
                    if let Err(w) = writes.hand_over(w) {
                        back += 1;
                        let _ = w.await;
                    }
                }
                back
            });
            cw.finish().await;
            let back = sender.await.unwrap_or_else(|e| panic!("sender: {e}"));
            assert_eq!(
                c.snapshot().acked + back,
                200,
                "every write counted by the collector or given back"
            );
        }
    }
}
