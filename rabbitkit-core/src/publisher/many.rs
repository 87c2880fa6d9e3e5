//! `publish_many`: a batch handed to the lanes a pass at a time, its outcomes collected in
//! one place.
//!
//! A publish through [`Publisher::send`](super::Publisher::send) is one message to a lane
//! and one oneshot back, and each outcome wakes its caller. A batch instead takes every
//! window slot it can in one poll, hands all those publishes to a lane in one message, and
//! the lanes file the outcomes in the stream's [`BatchSink`], waking the stream once per
//! lane pass however many outcomes the pass filed (docs/PROFILE.md, sixth pass). The
//! lanes, their channels, attribution and deadlines are the ones `send` uses, and they
//! make progress whether or not the stream is polled: a stream left unpolled holds no
//! window slot longer than its publishes take (it never queues for a slot while it has
//! publishes in flight, see [`Many::fill`]).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use futures_util::Stream;
use tokio::sync::{AcquireError, OwnedSemaphorePermit, TryAcquireError};
use tokio::time::Instant;

use super::reply::{BatchSink, BatchSlot, Job, Reply};
use super::{Inner, PublishOutcome};
use crate::envelope::{Envelope, Prepared};
use crate::error::{Error, Result};

type Acquire =
    Pin<Box<dyn Future<Output = std::result::Result<OwnedSemaphorePermit, AcquireError>> + Send>>;

/// The envelopes of a batch (boxed: the stream stays `Unpin` whatever the iterator).
type Items = std::iter::Enumerate<Box<dyn Iterator<Item = Envelope> + Send>>;

/// An envelope checked and waiting for a window slot.
struct Waiting {
    index: usize,
    prepared: Prepared,
    #[cfg(feature = "otel")]
    span: tracing::Span,
}

/// The stream [`Publisher::publish_many`](super::Publisher::publish_many) returns.
pub(super) struct Many {
    inner: Arc<Inner>,
    /// `None` once every envelope was taken.
    items: Option<Items>,
    waiting: Option<Waiting>,
    acquire: Option<Acquire>,
    sink: Arc<BatchSink>,
    /// Outcomes taken from the sink, not yet yielded.
    ready: VecDeque<(usize, PublishOutcome)>,
    /// Publishes handed to the lanes whose outcome is not yielded yet.
    outstanding: usize,
}

impl Many {
    pub(super) fn new(inner: Arc<Inner>, items: Box<dyn Iterator<Item = Envelope> + Send>) -> Self {
        Self {
            inner,
            items: Some(items.enumerate()),
            waiting: None,
            acquire: None,
            sink: Arc::default(),
            ready: VecDeque::new(),
            outstanding: 0,
        }
    }

    /// Takes envelopes and window slots until the window is full or the envelopes run
    /// out, and hands the publishes to a lane in one message. `Some` is an envelope refused
    /// before anything was sent (bad envelope, publisher closed): the stream's next item.
    fn feed(&mut self, cx: &mut Context<'_>) -> Option<(usize, Result<PublishOutcome>)> {
        let mut pass = Vec::new();
        let refused = self.fill(cx, &mut pass);
        if !pass.is_empty() {
            self.outstanding += pass.len();
            self.inner.dispatch_many(pass);
        }
        refused
    }

    fn fill(
        &mut self,
        cx: &mut Context<'_>,
        pass: &mut Vec<Job>,
    ) -> Option<(usize, Result<PublishOutcome>)> {
        let shared = &self.inner.shared;
        let closed = || Error::Closed { what: "publisher" };
        loop {
            if self.waiting.is_none() {
                let next = self.items.as_mut().and_then(Iterator::next);
                let Some((index, envelope)) = next else {
                    self.items = None;
                    return None;
                };
                if shared.closed.load(Ordering::Acquire) {
                    return Some((index, Err(closed())));
                }
                #[cfg(feature = "otel")]
                let (envelope, span) = {
                    let span = crate::observe::otel::send_span(&envelope);
                    (crate::observe::otel::inject(&span, envelope), span)
                };
                match envelope.prepare(shared.cfg.max_body, shared.properties_budget()) {
                    Ok(prepared) => {
                        self.waiting = Some(Waiting {
                            index,
                            prepared,
                            #[cfg(feature = "otel")]
                            span,
                        });
                    }
                    Err(e) => return Some((index, Err(e))),
                }
            }
            let permit = match self.acquire.as_mut() {
                Some(acquire) => match acquire.as_mut().poll(cx) {
                    Poll::Pending => return None,
                    Poll::Ready(result) => {
                        self.acquire = None;
                        result.ok()
                    }
                },
                None => match self.inner.permits.clone().try_acquire_owned() {
                    Ok(permit) => Some(permit),
                    // With publishes of its own in flight the stream waits for them: each
                    // outcome frees a slot before it wakes the stream. It queues for a slot
                    // only with none in flight: a queued wait is handed a freed slot even
                    // while nobody polls the stream, and a stream that yields an outcome
                    // and is then left unpolled must not sit on a slot (every other
                    // publish, the worker's retry copies too, would wait on it).
                    Err(TryAcquireError::NoPermits) if pass.is_empty() && self.outstanding == 0 => {
                        self.acquire = Some(Box::pin(self.inner.permits.clone().acquire_owned()));
                        continue;
                    }
                    Err(TryAcquireError::NoPermits) => return None,
                    Err(TryAcquireError::Closed) => None,
                },
            };
            let waiting = self.waiting.take()?;
            // The semaphore is never closed; closed while this waited for a slot.
            let Some(permit) = permit.filter(|_| !shared.closed.load(Ordering::Acquire)) else {
                return Some((waiting.index, Err(closed())));
            };
            shared.counters.sent.fetch_add(1, Ordering::Relaxed);
            let started = Instant::now();
            pass.push(Job {
                prepared: waiting.prepared,
                permit,
                reply: Reply::Batch(BatchSlot::new(
                    waiting.index,
                    self.sink.clone(),
                    #[cfg(feature = "otel")]
                    waiting.span,
                )),
                started,
                deadline: started + shared.cfg.confirm_timeout,
                blocks_before: None,
            });
        }
    }

    fn next_ready(&mut self) -> Option<(usize, Result<PublishOutcome>)> {
        let (index, outcome) = self.ready.pop_front()?;
        debug_assert!(
            self.outstanding > 0,
            "an outcome for a publish not handed over"
        );
        self.outstanding = self.outstanding.saturating_sub(1);
        Some((index, Ok(outcome)))
    }
}

impl Stream for Many {
    type Item = (usize, Result<PublishOutcome>);

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if let Some(item) = this.next_ready() {
            return Poll::Ready(Some(item));
        }
        // Registers this task with the sink before looking: an outcome filed after the
        // look wakes it.
        this.sink.take(cx, &mut this.ready);
        if let Some(item) = this.next_ready() {
            return Poll::Ready(Some(item));
        }
        if let Some(refused) = this.feed(cx) {
            return Poll::Ready(Some(refused));
        }
        if this.items.is_none() && this.waiting.is_none() && this.outstanding == 0 {
            return Poll::Ready(None);
        }
        Poll::Pending
    }
}

impl Drop for Many {
    /// What was handed over is still published, confirmed and counted by the lanes; its
    /// outcomes are no longer kept.
    fn drop(&mut self) {
        self.sink.close();
    }
}
