//! `publish_many` for batches: the stream drives a lane of its own.
//!
//! A publish through [`Publisher::send`](super::Publisher::send) crosses two tasks: the
//! caller hands it to a lane's task through a queue, the lane writes it and reads its
//! confirm, and a oneshot wakes the caller with the outcome. For a batch, the stream polls
//! a [`Lane`] itself: the same lane code (the same writes, attribution and deadlines), with
//! publishes pushed into it and outcomes taken out of it in the stream's own poll, so a
//! publish costs no queue, no oneshot, no wake-up of another task (docs/PROFILE.md, sixth
//! pass).
//!
//! The lane has a confirm channel of its own on the publisher's connection. When the
//! stream ends, the lane (and its open channel) goes back to the publisher's idle pool for
//! the next batch; when the stream is dropped with publishes still in flight, the lane
//! finishes them in a task of its own (outcomes counted, as with a dropped
//! `PendingConfirm`) and then goes back to the pool (or closes its channel when the pool
//! is full or the publisher gone).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use futures_util::Stream;
use tokio::sync::{AcquireError, OwnedSemaphorePermit, TryAcquireError};
use tokio::time::Instant;

use super::lane::{self, Job, Lane, Reply};
use super::{Inner, MAX_PROPERTIES, PublishOutcome};
use crate::envelope::{Envelope, Prepared};
use crate::error::{Error, Result};

type Acquire =
    Pin<Box<dyn Future<Output = std::result::Result<OwnedSemaphorePermit, AcquireError>> + Send>>;

/// An envelope checked and waiting for a window slot.
struct Waiting {
    index: usize,
    prepared: Prepared,
    #[cfg(feature = "otel")]
    span: tracing::Span,
}

/// The envelopes of a batch (boxed: the stream stays `Unpin` whatever the iterator).
type Items = std::iter::Enumerate<Box<dyn Iterator<Item = Envelope> + Send>>;

/// The stream [`Publisher::publish_many`](super::Publisher::publish_many) returns for a
/// batch.
pub(super) struct Many {
    inner: Arc<Inner>,
    /// `None` once every envelope was taken.
    items: Option<Items>,
    waiting: Option<Waiting>,
    acquire: Option<Acquire>,
    /// Made (or taken from the idle pool) on the first poll: a lane needs a runtime.
    lane: Option<Lane>,
    /// Set once the stream has yielded its last item.
    done: bool,
}

impl Many {
    pub(super) fn new(inner: Arc<Inner>, items: Box<dyn Iterator<Item = Envelope> + Send>) -> Self {
        Self {
            inner,
            items: Some(items.enumerate()),
            waiting: None,
            acquire: None,
            lane: None,
            done: false,
        }
    }
}

impl Many {
    /// Takes envelopes and window slots and pushes publishes into the lane until the
    /// window is full or the envelopes run out. `Some` is an envelope refused before
    /// anything was sent (bad envelope, publisher closed): the stream's next item.
    fn feed(&mut self, cx: &mut Context<'_>) -> Option<(usize, Result<PublishOutcome>)> {
        let shared = &self.inner.shared;
        let closed = || Error::Closed { what: "publisher" };
        // Nothing is taken before the lane exists.
        self.lane.as_ref()?;
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
                match envelope.prepare(shared.cfg.max_body, MAX_PROPERTIES) {
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
                    Err(TryAcquireError::NoPermits) => {
                        self.acquire = Some(Box::pin(self.inner.permits.clone().acquire_owned()));
                        continue;
                    }
                    Err(TryAcquireError::Closed) => None,
                },
            };
            let (Some(waiting), Some(lane)) = (self.waiting.take(), self.lane.as_mut()) else {
                return None;
            };
            // The semaphore is never closed; closed while this waited for a slot.
            let Some(permit) = permit.filter(|_| !shared.closed.load(Ordering::Acquire)) else {
                return Some((waiting.index, Err(closed())));
            };
            shared.counters.sent.fetch_add(1, Ordering::Relaxed);
            let started = Instant::now();
            lane.push(Job {
                prepared: waiting.prepared,
                permit,
                reply: Reply::Inline {
                    index: waiting.index,
                    #[cfg(feature = "otel")]
                    span: waiting.span,
                },
                started,
                deadline: started + shared.cfg.confirm_timeout,
                blocks_before: None,
            });
        }
    }
}

impl Stream for Many {
    type Item = (usize, Result<PublishOutcome>);

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        if this.lane.is_none() {
            if tokio::runtime::Handle::try_current().is_err() {
                // As `send` reports it: every envelope fails, counted.
                let Some((index, _)) = this.items.as_mut().and_then(Iterator::next) else {
                    this.done = true;
                    return Poll::Ready(None);
                };
                let outcome =
                    PublishOutcome::Failed(Error::Config("publish outside a tokio runtime".into()));
                this.inner.shared.count(&outcome);
                return Poll::Ready(Some((index, Ok(outcome))));
            }
            this.lane = Some(this.inner.take_idle_lane());
        }
        if let Some((index, outcome)) = this.lane.as_mut().and_then(Lane::next_outcome) {
            return Poll::Ready(Some((index, Ok(outcome))));
        }
        if let Some(refused) = this.feed(cx) {
            return Poll::Ready(Some(refused));
        }
        let more = this.items.is_some() || this.waiting.is_some();
        let Some(lane) = this.lane.as_mut() else {
            return Poll::Ready(None);
        };
        lane.set_open(more);
        let finished = lane.poll(cx).is_ready();
        if let Some((index, outcome)) = lane.next_outcome() {
            return Poll::Ready(Some((index, Ok(outcome))));
        }
        if finished {
            this.done = true;
            if let Some(lane) = this.lane.take() {
                this.inner.release_lane(lane);
            }
            return Poll::Ready(None);
        }
        Poll::Pending
    }
}

impl Drop for Many {
    fn drop(&mut self) {
        let Some(lane) = self.lane.take() else {
            return;
        };
        if lane.is_idle() {
            self.inner.release_lane(lane);
        } else if let Ok(handle) = tokio::runtime::Handle::try_current() {
            // Publishes in flight are made and their confirms awaited and counted, as for
            // a dropped `PendingConfirm`; then the lane goes back to the pool, unless the
            // publisher is gone (this task does not keep it alive).
            let inner = Arc::downgrade(&self.inner);
            let mut lane = lane;
            handle.spawn(async move {
                lane::drain(&mut lane).await;
                match inner.upgrade() {
                    Some(inner) => inner.release_lane(lane),
                    None => lane::finish(lane).await,
                }
            });
        }
    }
}
