//! Handing a lane's publishes to lapin: opening the channel, writing every waiting publish
//! in one go, and closing a channel once its last write is out.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, PublisherConfirm};
use tokio::time::Instant;

use super::{BoxFuture, Chan, Entry, Lane, SeqWaker, Staged, TOKEN_ROOM, Writing};
use crate::connection::Conn;
use crate::error::{Error, Result};
use crate::headers::PUBLISH_TOKEN;
use crate::publisher::reply::{BlockWatch, Job};
use crate::publisher::{PublishOutcome, Shared};

/// `properties` with the publish token set to `token`, or removed when `token` is 0.
fn with_token(properties: lapin::BasicProperties, token: u64) -> lapin::BasicProperties {
    let present = properties
        .headers()
        .as_ref()
        .is_some_and(|h| h.contains_key(PUBLISH_TOKEN));
    if token == 0 && !present {
        return properties;
    }
    let mut map = properties
        .headers()
        .as_ref()
        .map(|h| h.inner().clone())
        .unwrap_or_default();
    if token == 0 {
        map.remove(PUBLISH_TOKEN);
    } else {
        // Tokens are lane sequence numbers: far below i64::MAX.
        let value = i64::try_from(token).unwrap_or(i64::MAX);
        map.insert(PUBLISH_TOKEN.into(), AMQPValue::LongLongInt(value));
    }
    properties.with_headers(FieldTable::from(map))
}

impl Lane {
    pub(super) fn close_channel(&mut self) {
        let unwritten = self.take_writes(self.epoch);
        self.close_channel_after(unwritten);
    }

    /// Stops following the unfinished writes on the channel of `epoch`; returns the last
    /// one's future unless it is written already (frames are written in order: once the
    /// last is written, all are).
    pub(super) fn take_writes(
        &mut self,
        epoch: u64,
    ) -> Option<BoxFuture<lapin::Result<PublisherConfirm>>> {
        let (mine, others): (VecDeque<Writing>, VecDeque<Writing>) =
            std::mem::take(&mut self.writing)
                .into_iter()
                .partition(|w| w.epoch == epoch);
        self.writing = others;
        // The last write that queued frames (one that failed at once queued none): once it
        // is written, all before it are.
        mine.into_iter()
            .rev()
            .find(|w| !matches!(w.done, Some(Err(_))))
            .filter(|w| w.done.is_none())
            .map(|w| w.fut)
    }

    /// Closes the current channel once `unwritten` (the channel's last publish, still queued
    /// in lapin) is written. lapin sends a `channel.close` ahead of queued publish frames; a
    /// publish that reaches the broker after the close is a connection error
    /// (`CHANNEL_ERROR - expected 'channel.open'`) that fails every other publish on the
    /// connection. Publish frames leave in order, so the last one written means all are.
    pub(super) fn close_channel_after(
        &mut self,
        unwritten: Option<BoxFuture<lapin::Result<PublisherConfirm>>>,
    ) {
        if let Chan::Open(open) = std::mem::replace(&mut self.chan, Chan::None)
            && open.channel.status().connected()
        {
            tokio::spawn(async move {
                if let Some(write) = unwritten {
                    // Resolves once written, or fails with the connection: never hangs past it.
                    let _ = write.await;
                }
                let close = open
                    .channel
                    .close(200, "rabbitkit: channel recycled".into());
                let _ = tokio::time::timeout(std::time::Duration::from_secs(5), close).await;
            });
        }
    }

    /// Opens a channel, or hands every waiting publish to lapin, when there is work and
    /// nothing in the way.
    ///
    /// Many publishes are handed over before the first is written, so lapin writes them in
    /// one go. Each is handed over whole before the next: the first poll of
    /// `basic_publish` takes the publish's delivery tag and queues its frames together, with
    /// no await in between (lapin 4.12 `Channel::basic_publish` →
    /// `send_method_frame_with_body`), and this lane is the only publisher on its channel,
    /// so tags follow the order of the frames on the wire.
    pub(super) fn start_work(&mut self, cx: &mut Context<'_>) -> bool {
        let mut progress = false;
        if let Chan::Open(open) = &self.chan
            && (!open.channel.status().connected() || !open.conn.is_usable())
        {
            if let Chan::Open(open) = std::mem::replace(&mut self.chan, Chan::None)
                && self.has_unreported(Some(open.epoch))
            {
                self.old.push(open);
            }
            self.epoch += 1;
            self.tainted = false;
            progress = true;
        }
        if !self.old.is_empty() {
            let entries = &self.entries;
            self.old
                .retain(|o| entries.values().any(|e| e.epoch == o.epoch));
        }
        // A write still pending on an earlier channel finishes (or fails) first.
        if self.tainted || self.writing.back().is_some_and(|w| w.epoch != self.epoch) {
            return progress;
        }
        let Some(front) = self.backlog.front() else {
            return progress;
        };
        match &self.chan {
            Chan::Opening(_) => progress,
            Chan::None => {
                let shared = self.shared.clone();
                let deadline = front.deadline;
                self.chan = Chan::Opening(Box::pin(tokio::time::timeout_at(
                    deadline,
                    open_channel(shared, deadline, self.last_conn.clone()),
                )));
                true
            }
            Chan::Open(_) => self.start_writes(cx) || progress,
        }
    }

    /// Hands every waiting publish to lapin on the open channel, in three steps, so that
    /// lapin's I/O thread, woken by the first publish, finds the others queued too and
    /// writes them in one go (docs/PROFILE.md, sixth pass):
    ///
    /// 1. each publish gets its sequence number and [`Key`](super::Key) (a token when its
    ///    id's hash is taken on the channel);
    /// 2. the publishes are handed to lapin back to back, nothing else in between: the
    ///    first poll of each takes its delivery tag and queues its frames, and this lane is
    ///    the only publisher on its channel, so the tags follow the order of the frames. It
    ///    stops at a channel or connection that is closing, and after a publish that fails
    ///    at once (the next one would too);
    /// 3. each publish handed over gets its entry; the others go back, in order, to wait
    ///    for the next channel, their keys released.
    ///
    /// False when nothing was handed over or put back.
    fn start_writes(&mut self, cx: &mut Context<'_>) -> bool {
        let Chan::Open(open) = &self.chan else {
            return false;
        };
        if self.backlog.is_empty() || !open.channel.status().connected() || !open.conn.is_usable() {
            return false;
        }
        let (channel, conn, epoch) = (open.channel.clone(), open.conn.clone(), open.epoch);
        let mut staged = std::mem::take(&mut self.staged);
        // What one content-header frame of this connection holds. An envelope was measured
        // against the frame the publisher knew when it was prepared; one prepared before
        // the first connection, or for a node of another `frame_max`, may not fit this
        // one. Written anyway, the broker would close the connection (`FRAME_ERROR`) and
        // fail every publish in flight on it: it is refused here instead, unsent.
        let frame_max = conn.conn.configuration().frame_max();
        let room = usize::try_from(frame_max)
            .unwrap_or(usize::MAX)
            .saturating_sub(crate::publisher::HEADER_FRAME_OVERHEAD);
        let mut refused = Vec::new();
        // 1. Keys.
        while let Some(job) = self.backlog.pop_front() {
            if job.prepared.properties_size + TOKEN_ROOM > room {
                let size = job.prepared.properties_size + TOKEN_ROOM;
                refused.push((job, size));
                continue;
            }
            let seq = self.next_seq;
            self.next_seq += 1;
            let id = self.id_hash(job.prepared.properties.message_id().as_ref());
            let mut key = (epoch, id, 0);
            if self.ids.contains(&key) {
                // The id awaits a confirm on this channel already: a token unique on the
                // channel tells the two apart should one be returned.
                key.2 = seq + 1;
            }
            self.ids.insert(key);
            let mut p = job.prepared;
            // Only a mandatory publish can come back; any other sheds a stale token.
            p.properties = with_token(p.properties, if p.mandatory { key.2 } else { 0 });
            staged.push(Staged {
                seq,
                key,
                prepared: Some(p),
                permit: job.permit,
                reply: job.reply,
                started: job.started,
                deadline: job.deadline,
                blocks_before: job.blocks_before,
                write: None,
                done: None,
            });
        }
        // 2. Hand-over.
        for st in staged.iter_mut() {
            let Some(p) = st.prepared.take() else {
                break;
            };
            if !channel.status().connected() || !conn.is_usable() {
                st.prepared = Some(p);
                break;
            }
            let channel = channel.clone();
            let opts = BasicPublishOptions {
                mandatory: p.mandatory,
                immediate: false,
            };
            let mut write: BoxFuture<lapin::Result<PublisherConfirm>> = Box::pin(async move {
                channel
                    .basic_publish(p.exchange, p.routing_key, opts, &p.body, p.properties)
                    .await
            });
            let failed = match write.as_mut().poll(cx) {
                Poll::Ready(result) => {
                    let failed = result.is_err();
                    st.done = Some(result);
                    failed
                }
                Poll::Pending => false,
            };
            st.write = Some(write);
            if failed {
                break;
            }
        }
        // 3. Entries; what was not handed over goes back.
        let mut handed = false;
        let mut back = Vec::new();
        for st in staged.drain(..) {
            let Some(write) = st.write else {
                self.ids.remove(&st.key);
                if let Some(prepared) = st.prepared {
                    back.push(Job {
                        prepared,
                        permit: st.permit,
                        reply: st.reply,
                        started: st.started,
                        deadline: st.deadline,
                        blocks_before: st.blocks_before,
                    });
                }
                continue;
            };
            handed = true;
            let seq = st.seq;
            self.entries.insert(
                seq,
                Entry {
                    epoch,
                    id: (st.key.1, st.key.2),
                    started: st.started,
                    deadline: st.deadline,
                    watch: BlockWatch::new(conn.clone()),
                    reply: Some((st.reply, st.permit)),
                    confirm: None,
                    waker: Waker::from(Arc::new(SeqWaker {
                        seq,
                        wakes: self.wakes.clone(),
                    })),
                },
            );
            self.shared
                .counters
                .unconfirmed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.deadlines.insert((st.deadline, seq));
            self.writing.push_back(Writing {
                seq,
                epoch,
                fut: write,
                done: st.done,
            });
        }
        let refused_any = !refused.is_empty();
        for (job, size) in refused {
            let error = Error::InvalidHeader {
                name: "(all headers)".into(),
                reason: format!(
                    "properties take about {size} bytes, over the {room}-byte content-header \
                     frame of this connection (frame_max {frame_max}); not sent"
                ),
            };
            tracing::warn!(error = %error, "publish refused: its properties do not fit this connection's frame");
            self.reply_unwritten(job, PublishOutcome::Failed(error));
        }
        // Put back: progress too, so the next turn sees the closing channel and moves on.
        let put_back = !back.is_empty() || refused_any;
        for job in back.into_iter().rev() {
            self.backlog.push_front(job);
        }
        self.staged = staged;
        handed || put_back
    }
}

async fn open_channel(
    shared: Arc<Shared>,
    deadline: Instant,
    seen: Arc<Mutex<Option<Arc<Conn>>>>,
) -> Result<(Arc<Conn>, Channel)> {
    let conn = shared
        .connector
        .get(deadline.saturating_duration_since(Instant::now()))
        .await?;
    *seen.lock().unwrap_or_else(|p| p.into_inner()) = Some(conn.clone());
    shared.learn(&conn);
    let channel = conn.conn.create_channel().await.map_err(Error::amqp)?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(Error::amqp)?;
    Ok((conn, channel))
}
