//! One subscriber's consume loop: connect, declare, qos, consume; rebuild on loss.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Consumer};
use tokio::sync::{Semaphore, watch};

use super::process::Pipeline;
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
}

impl SubscriberTask {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        s: Subscriber,
        extensions: Arc<Extensions>,
        connector: Arc<Connector>,
        publisher: Publisher,
        counters: Arc<Counters>,
        ready: Arc<AtomicBool>,
        stop: watch::Receiver<bool>,
        hard_stop: watch::Receiver<bool>,
        deadline: Duration,
    ) -> Self {
        let spec = Arc::new(s.settle_spec());
        let topology = s.full_topology();
        let pipeline = Arc::new(Pipeline {
            runner: Runner {
                spec,
                service: std::sync::Mutex::new(s.service.clone()),
                deadline: s.deadline,
                counters: counters.clone(),
            },
            settler: Arc::new(Settler::new(publisher, counters, hard_stop.clone())),
            extensions,
            hard_stop,
        });
        Self {
            pipeline,
            topology,
            mode: s.mode,
            prefetch: s.prefetch,
            concurrency: s.concurrency.min(usize::from(s.prefetch)),
            connector,
            ready,
            stop,
            deadline,
        }
    }

    pub(super) async fn run(mut self) {
        let permits = Arc::new(Semaphore::new(self.concurrency));
        let mut failures = 0u32;
        let queue = self.topology.queue.clone();
        while !*self.stop.borrow() {
            let (channel, mut consumer) = match self.open().await {
                Ok(c) => {
                    failures = 0;
                    c
                }
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
            self.ready.store(true, Ordering::Release);
            tracing::info!(%queue, prefetch = self.prefetch, concurrency = self.concurrency, "consuming");
            let stopped = loop {
                let permit = tokio::select! {
                    p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break true },
                    _ = self.stop.changed() => break true,
                };
                let item = tokio::select! {
                    item = consumer.next() => item,
                    _ = self.stop.changed() => break true,
                };
                match item {
                    Some(Ok(delivery)) => {
                        let p = self.pipeline.clone();
                        tokio::spawn(async move {
                            p.process(delivery).await;
                            drop(permit);
                        });
                    }
                    Some(Err(e)) => {
                        tracing::warn!(%queue, error = %e, "consumer failed; rebuilding the channel");
                        break false;
                    }
                    None => {
                        tracing::warn!(%queue, "consumer cancelled by the broker; rebuilding");
                        break false;
                    }
                }
            };
            self.ready.store(false, Ordering::Release);
            if stopped {
                // Stop the flow first, then let in-flight handlers finish and settle on
                // this (still open) channel. Buffered, unstarted deliveries are requeued by
                // the broker when the channel closes.
                let _ = channel
                    .basic_cancel(consumer.tag(), BasicCancelOptions::default())
                    .await;
                self.drain(&permits).await;
                let _ = channel.close(200, "rabbitkit shutdown".into()).await;
                return;
            }
            // In-flight handlers of the dead channel will find their ackers poisoned and
            // count it; their deliveries come back from the broker.
            drop(consumer);
            drop(channel);
        }
        self.drain(&permits).await;
    }

    async fn drain(&self, permits: &Arc<Semaphore>) {
        let all = u32::try_from(self.concurrency).unwrap_or(u32::MAX);
        // The worker's timer flips hard_stop at the deadline; stragglers then requeue
        // themselves. The extra bound covers a handler stuck in a settle.
        let bound = self.deadline + Duration::from_secs(15);
        if tokio::time::timeout(bound, permits.acquire_many(all))
            .await
            .is_err()
        {
            tracing::error!(queue = %self.topology.queue, "in-flight handlers did not settle in time; the broker requeues them on close");
        }
    }

    async fn open(&self) -> Result<(Channel, Consumer)> {
        let conn = self.connector.get(Duration::from_secs(30)).await?;
        let channel = conn.conn.create_channel().await.map_err(Error::amqp)?;
        // Re-declared on every (re)connect: recovery is ours, not lapin's.
        self.topology.apply(&channel, self.mode).await?;
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
        let consumer = channel
            .basic_consume(
                self.topology.queue.as_str().into(),
                tag.as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(Error::amqp)?;
        Ok((channel, consumer))
    }
}
