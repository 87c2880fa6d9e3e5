//! One subscriber's consume loop: connect, declare, qos, consume; rebuild on loss.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Consumer};
use tokio::sync::{Semaphore, watch};

use super::process::Pipeline;
use crate::coalesce::{AckCoalescing, ChannelAcks, ChannelWrites, OnChannel};
use crate::connection::{Connector, backoff};
use crate::delivery::Extensions;
use crate::error::{Error, Result};
use crate::publisher::Publisher;
use crate::run::Runner;
use crate::settle::Settler;
use crate::stats::Counters;
use crate::subscriber::Subscriber;
use crate::topology::Topology;

static CONSUMER_SEQ: AtomicU64 = AtomicU64::new(0);

/// What every subscriber task of one worker shares.
pub(super) struct WorkerParts {
    pub(super) connector: Arc<Connector>,
    pub(super) publisher: Publisher,
    /// Flips when shutdown starts: stop consuming.
    pub(super) stop: watch::Receiver<bool>,
    /// Flips at the shutdown deadline: cut in-flight handlers.
    pub(super) hard_stop: watch::Receiver<bool>,
    pub(super) deadline: Duration,
    /// How `process` spans relate to the producer's trace context.
    pub(super) trace_context: crate::observe::TraceContext,
    /// Signs copies' own headers and judges deliveries'.
    pub(super) trust: crate::trust::HeaderTrust,
}

/// One subscriber's own parts: the subscriber, its state, counters and readiness flag.
pub(super) struct SubscriberParts {
    pub(super) subscriber: Subscriber,
    pub(super) extensions: Arc<Extensions>,
    pub(super) counters: Arc<Counters>,
    pub(super) ready: Arc<AtomicBool>,
}

pub(super) struct SubscriberTask {
    pipeline: Arc<Pipeline>,
    topology: Topology,
    mode: crate::topology::TopologyMode,
    prefetch: u16,
    concurrency: usize,
    connector: Arc<Connector>,
    ready: Arc<AtomicBool>,
    stop: watch::Receiver<bool>,
    deadline: Duration,
    consumer_timeout: Option<Duration>,
    /// Ack coalescing: one ledger per consume channel.
    coalescing: Option<AckCoalescing>,
}

/// A consumer the broker cancels this soon after it subscribed counts as a failed
/// subscription, so a queue that keeps disappearing gets a backoff, not a tight loop.
const QUICK_CANCEL: Duration = Duration::from_secs(1);

/// Why a consume loop on one channel ended.
enum End {
    /// The worker is stopping.
    Stop,
    /// The channel or connection is gone.
    ChannelLost,
    /// The broker cancelled the consumer; the channel is still open.
    Cancelled,
}

impl SubscriberTask {
    pub(super) fn new(own: SubscriberParts, worker: &WorkerParts) -> Self {
        let SubscriberParts {
            subscriber: s,
            extensions,
            counters,
            ready,
        } = own;
        let hard_stop = worker.hard_stop.clone();
        let spec = Arc::new(crate::decide::SettleSpec {
            trust: worker.trust.clone(),
            ..s.settle_spec()
        });
        let topology = s.full_topology();
        let pipeline = Arc::new(Pipeline {
            runner: Runner {
                spec,
                service: std::sync::Mutex::new(s.service.clone()),
                deadline: s.effective_deadline(),
                counters: counters.clone(),
            },
            settler: Arc::new({
                let settler = Settler::new(worker.publisher.clone(), counters, hard_stop.clone());
                if s.mode == crate::topology::TopologyMode::Declare {
                    settler.with_redeclare(crate::settle::Redeclare::new(
                        worker.connector.clone(),
                        topology.clone(),
                    ))
                } else {
                    settler
                }
            }),
            extensions,
            hard_stop,
            spans: crate::observe::span::SpanInfo::new(
                &s.topology.queue,
                worker.connector.config().validate().ok().as_ref(),
                worker.trace_context,
            ),
        });
        Self {
            pipeline,
            topology,
            mode: s.mode,
            prefetch: s.prefetch,
            concurrency: s.concurrency.min(usize::from(s.prefetch)),
            consumer_timeout: s.consumer_timeout,
            coalescing: s.ack_coalescing,
            connector: worker.connector.clone(),
            ready,
            stop: worker.stop.clone(),
            deadline: worker.deadline,
        }
    }

    pub(super) async fn run(mut self) {
        let permits = Arc::new(Semaphore::new(self.concurrency));
        // Channels the broker cancelled a consumer on, closing once their in-flight
        // deliveries are settled and their acks written: awaited before the task ends, so
        // the worker's report counts those acks.
        let mut closing: Vec<tokio::task::JoinHandle<()>> = Vec::new();
        let mut failures = 0u32;
        let queue = self.topology.queue.clone();
        while !*self.stop.borrow() {
            // A broker that is down must not hold a shutdown for the connect timeout.
            let mut stop = self.stop.clone();
            let opened = tokio::select! {
                o = self.open() => o,
                _ = stop.changed() => break,
            };
            // `failures` is reset by how the subscription ends (a consumer the broker
            // cancels at once keeps counting), not by the open itself.
            let (node, channel, mut consumer) = match opened {
                Ok(c) => c,
                Err(e) => {
                    failures = failures.saturating_add(1);
                    let pause = backoff(failures, self.connector.config().max_backoff);
                    tracing::warn!(%queue, error = %e, retry_in = ?pause, "cannot consume; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        _ = self.stop.changed() => {}
                    }
                    continue;
                }
            };
            // Tags are per channel: a new channel gets a new ledger, so no ack ever crosses
            // to a replacement channel.
            // Shared by every pipeline of this channel: each settles on it directly.
            let channel = Arc::new(channel);
            let settling = Settling::start(
                self.coalescing,
                channel.clone(),
                self.pipeline.runner.counters.clone(),
            );
            self.ready.store(true, Ordering::Release);
            tracing::info!(%queue, %node, prefetch = self.prefetch, concurrency = self.concurrency, "consuming");
            let subscribed = tokio::time::Instant::now();
            // Every handler of this channel holds a clone; `recv` returns None once they
            // have all settled (the channel's delivery tags are only ever used on it).
            let (in_flight, mut settled) = tokio::sync::mpsc::channel::<()>(1);
            // Flips when this channel is lost: its handlers give their concurrency slots
            // back at once (their deliveries come back from the broker, and their
            // settlement can no longer reach it); a handler with a deadline runs on until it,
            // one without is cut off.
            let (lost_tx, lost) = watch::channel(false);
            // Deliveries taken from the consumer while every slot was busy (at most the
            // prefetch: the broker sends no more unacked ones), handed out in tag order.
            let mut pending = std::collections::VecDeque::new();
            // How the consumer ended while deliveries were still pending: they are handed
            // out first (on a cancelled consumer's channel, still open, they can settle).
            let mut consumer_end: Option<End> = None;
            let end = loop {
                if *self.stop.borrow() {
                    break End::Stop;
                }
                if pending.is_empty()
                    && let Some(end) = consumer_end.take()
                {
                    break end;
                }
                // A slot, while the consumer is still watched: a channel that dies while
                // every slot is taken (handlers that hang) ends this loop, which frees
                // those slots, instead of waiting for slots that are never given back.
                let permit = loop {
                    tokio::select! {
                        biased;
                        p = permits.clone().acquire_owned() => break p.map_err(|_| End::Stop),
                        _ = self.stop.changed() => break Err(End::Stop),
                        item = consumer.next(), if consumer_end.is_none() => match item {
                            Some(Ok(delivery)) => pending.push_back(delivery),
                            Some(Err(e)) => {
                                tracing::warn!(%queue, %node, error = %e, "consumer failed; rebuilding the channel");
                                // The channel is gone: what is pending comes back from
                                // the broker.
                                break Err(End::ChannelLost);
                            }
                            None if pending.is_empty() => break Err(End::Cancelled),
                            None => consumer_end = Some(End::Cancelled),
                        },
                    }
                };
                let permit = match permit {
                    Ok(p) => p,
                    Err(end) => break end,
                };
                let item = match pending.pop_front() {
                    Some(delivery) => Some(Ok(delivery)),
                    None => tokio::select! {
                        item = consumer.next() => item,
                        _ = self.stop.changed() => break End::Stop,
                    },
                };
                match item {
                    Some(Ok(delivery)) => {
                        let p = self.pipeline.clone();
                        let on = settling.on.clone();
                        let token = in_flight.clone();
                        let lost = lost.clone();
                        // Registered in tag order, before any pipeline can settle it.
                        on.register(delivery.delivery_tag);
                        // Boxed: the pipeline's future is about 4.4 KiB, and the runtime
                        // copies a task's future into the task when it spawns it, and
                        // its task cell is as large (the profile found three such copies
                        // per delivery, docs/PROFILE.md); a box is moved as a pointer.
                        tokio::spawn(Box::pin(async move {
                            // The pipeline drops the slot early if the channel is lost.
                            p.process(delivery, on, lost, permit).await;
                            drop(token);
                        }));
                    }
                    Some(Err(e)) => {
                        tracing::warn!(%queue, %node, error = %e, "consumer failed; rebuilding the channel");
                        break End::ChannelLost;
                    }
                    None => break End::Cancelled,
                }
            };
            drop(in_flight);
            self.ready.store(false, Ordering::Release);
            match end {
                End::Stop => {
                    // Stop the flow first, then let in-flight handlers finish and settle on
                    // this (still open) channel. Buffered, unstarted deliveries are requeued
                    // by the broker when the channel closes.
                    let _ = channel
                        .basic_cancel(consumer.tag(), BasicCancelOptions::default())
                        .await;
                    let until = tokio::time::Instant::now().checked_add(self.settle_bound());
                    self.drain(&permits, until).await;
                    // Held acks are written before the close, or the broker would
                    // redeliver work that was done.
                    settling.finish().await;
                    let _ = channel.close(200, "rabbitkit shutdown".into()).await;
                    self.await_closing(closing, until).await;
                    return;
                }
                End::ChannelLost => {
                    // In-flight handlers of the dead channel are cut off and find it gone
                    // when they settle, and count it; their deliveries come back from the
                    // broker. So do the held acks (counted `ack_lost` by the flush that
                    // finds the channel gone).
                    let _ = lost_tx.send(true);
                    settling.finish().await;
                    drop(consumer);
                    drop(channel);
                    // A channel that dies right after each subscribe must not loop hot.
                    if subscribed.elapsed() >= QUICK_CANCEL {
                        failures = 0;
                    } else {
                        failures = failures.saturating_add(1);
                        let pause = backoff(failures, self.connector.config().max_backoff);
                        tokio::select! {
                            _ = tokio::time::sleep(pause) => {}
                            _ = self.stop.changed() => {}
                        }
                    }
                }
                End::Cancelled => {
                    // basic.cancel from the broker (queue deleted, 4.3 quorum consumer
                    // timeout): the channel is still open and its in-flight deliveries can
                    // still be settled on it (4.3 accepts the ack of a timed-out delivery).
                    // Keep it until they have, then close it; the new consumer gets a new
                    // channel, so no tag crosses channels.
                    let quick = subscribed.elapsed() < QUICK_CANCEL;
                    tracing::warn!(%queue, %node, consumer_tag = %consumer.tag(), "consumer cancelled by the broker; subscribing again");
                    drop(consumer);
                    // As long as a shutdown drain would wait for them.
                    let bound = self.settle_bound();
                    let q = queue.clone();
                    closing.retain(|c| !c.is_finished());
                    closing.push(tokio::spawn(async move {
                        if tokio::time::timeout(bound, settled.recv()).await.is_err() {
                            tracing::warn!(queue = %q, "handlers of a cancelled consumer did not settle in time; closing its channel (the broker requeues them)");
                        }
                        settling.finish().await;
                        let _ = channel
                            .close(200, "consumer cancelled by the broker".into())
                            .await;
                        // Handlers still running gave their messages back with the channel.
                        let _ = lost_tx.send(true);
                    }));
                    if !quick {
                        failures = 0;
                    } else {
                        failures = failures.saturating_add(1);
                        let pause = backoff(failures, self.connector.config().max_backoff);
                        tokio::select! {
                            _ = tokio::time::sleep(pause) => {}
                            _ = self.stop.changed() => {}
                        }
                    }
                }
            }
        }
        let until = tokio::time::Instant::now().checked_add(self.settle_bound());
        self.drain(&permits, until).await;
        self.await_closing(closing, until).await;
    }

    /// How long in-flight deliveries get to settle once their consumer stops: the
    /// handler deadline, then a copy's confirm timeout, and a margin.
    fn settle_bound(&self) -> Duration {
        self.deadline
            .saturating_add(self.pipeline.settler.publisher.config().confirm_timeout)
            .saturating_add(Duration::from_secs(5))
    }

    /// Waits for the channels of cancelled consumers to close (their acks written and
    /// counted), until the drain's deadline: they settle alongside the drain.
    async fn await_closing(
        &self,
        closing: Vec<tokio::task::JoinHandle<()>>,
        until: Option<tokio::time::Instant>,
    ) {
        if closing.is_empty() {
            return;
        }
        if within(until, futures_util::future::join_all(closing))
            .await
            .is_none()
        {
            tracing::warn!(queue = %self.topology.queue, "channels of cancelled consumers did not close in time");
        }
    }

    /// Waits until every in-flight delivery has settled, or `until` (`None`: no bound).
    async fn drain(&self, permits: &Arc<Semaphore>, until: Option<tokio::time::Instant>) {
        let all = u32::try_from(self.concurrency).unwrap_or(u32::MAX);
        // The worker's timer flips hard_stop at the deadline; stragglers then requeue
        // themselves. A copy already sent by then still gets its verdict, within the
        // publisher's confirm timeout, and its original is settled on this open channel.
        if within(until, permits.acquire_many(all)).await.is_none() {
            tracing::error!(queue = %self.topology.queue, "in-flight handlers did not settle in time; the broker requeues them on close");
        }
    }

    /// Connects (to the next reachable node after a loss), opens a channel, declares,
    /// applies QoS and consumes. Returns the node's `host:port` for logs.
    async fn open(&self) -> Result<(Arc<str>, Channel, Consumer)> {
        let conn = self.connector.get(Duration::from_secs(30)).await?;
        let mut channel = conn.conn.create_channel().await.map_err(Error::amqp)?;
        // Re-declared on every (re)connect: recovery is ours, not lapin's.
        let site = self.topology.site(self.connector.config())?;
        match self.topology.apply_in(&channel, self.mode, &site).await {
            Ok(()) => {}
            Err(e @ Error::ParkingUnavailable { .. }) => {
                // Everything else is declared; the 404 closed the channel.
                crate::topology::warn_parking_unavailable(&self.topology.queue, &e);
                channel = conn.conn.create_channel().await.map_err(Error::amqp)?;
            }
            Err(e) => return Err(e),
        }
        channel
            .basic_qos(self.prefetch, BasicQosOptions { global: false })
            .await
            .map_err(Error::amqp)?;
        let tag = format!(
            "rabbitkit-{}-{}-{}",
            self.pipeline.runner.spec.handler,
            std::process::id(),
            CONSUMER_SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let tag = crate::names::truncate(&tag, 255).to_owned();
        let mut args = FieldTable::default();
        if let Some(t) = self.consumer_timeout {
            let ms = i64::try_from(t.as_millis()).unwrap_or(i64::MAX);
            args.insert("x-consumer-timeout".into(), AMQPValue::LongLongInt(ms));
        }
        let consumer = channel
            .basic_consume(
                self.topology.queue.as_str().into(),
                tag.as_str().into(),
                BasicConsumeOptions::default(),
                args,
            )
            .await
            .map_err(Error::amqp)?;
        Ok((conn.node.clone(), channel, consumer))
    }
}

/// `f`'s output, or `None` when `until` passes first (`until` `None`: no bound, as with an
/// unbounded shutdown deadline).
async fn within<F: std::future::Future>(
    until: Option<tokio::time::Instant>,
    f: F,
) -> Option<F::Output> {
    match until {
        Some(t) => tokio::time::timeout_at(t, f).await.ok(),
        None => Some(f.await),
    }
}

/// What settles the deliveries of one consume channel: its coalescing ledger (when acks
/// are coalesced), its write collector, and the handle every delivery shares.
struct Settling {
    acks: Option<ChannelAcks>,
    writes: ChannelWrites,
    on: Arc<OnChannel>,
}

impl Settling {
    fn start(
        coalescing: Option<AckCoalescing>,
        channel: Arc<Channel>,
        counters: Arc<Counters>,
    ) -> Self {
        let acks = coalescing.map(|c| ChannelAcks::start(c, channel.clone(), counters.clone()));
        let writes = ChannelWrites::start(counters);
        let on = Arc::new(OnChannel::new(
            channel,
            acks.as_ref().map(|a| a.ledger().clone()),
            writes.writes().clone(),
        ));
        Self { acks, writes, on }
    }

    /// Writes the held acks (ack coalescing), then waits for every queued ack to be
    /// written: call once the channel's pipelines have ended, before it is closed.
    async fn finish(self) {
        if let Some(acks) = self.acks {
            acks.finish().await;
        }
        self.writes.finish().await;
    }
}
