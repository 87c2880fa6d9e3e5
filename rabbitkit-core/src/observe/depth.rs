//! The parking-depth gauge: each subscriber's parking queue, polled by a passive declare
//! (which returns the queue's message count without changing it).

use std::sync::Arc;
use std::time::Duration;

use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;

use crate::connection::Connector;

/// One parking queue to poll and its gauge.
pub(crate) struct Watched {
    pub(crate) parking_queue: String,
    pub(crate) gauge: metrics::Gauge,
}

impl Watched {
    /// The parking queue of `queue`, with the gauge labelled `vhost` and `queue` (the work
    /// queue, as on every other series of the subscriber).
    pub(crate) fn new(vhost: &str, queue: &str) -> Self {
        Self {
            parking_queue: crate::retry::parking_queue(queue),
            gauge: metrics::gauge!(
                crate::stats::PARKING_DEPTH,
                "vhost" => vhost.to_owned(),
                "queue" => queue.to_owned()
            ),
        }
    }
}

/// Polls every `every` until aborted. A failed poll is logged at DEBUG and retried at the
/// next tick: the gauge keeps its last value meanwhile (a lost connection shows on
/// `rabbitkit_connection_up`).
pub(crate) async fn poll(connector: Arc<Connector>, watched: Vec<Watched>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut channel: Option<lapin::Channel> = None;
    loop {
        tick.tick().await;
        for w in &watched {
            let ch = match channel.as_ref().filter(|c| c.status().connected()) {
                Some(c) => c.clone(),
                None => match open(&connector).await {
                    Some(c) => {
                        channel = Some(c.clone());
                        c
                    }
                    None => break,
                },
            };
            let passive = QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            };
            match ch
                .queue_declare(
                    w.parking_queue.as_str().into(),
                    passive,
                    FieldTable::default(),
                )
                .await
            {
                Ok(q) => w.gauge.set(f64::from(q.message_count())),
                Err(e) => {
                    // A passive declare of a missing queue closes the channel: reopen next time.
                    tracing::debug!(queue = %w.parking_queue, error = %e, "parking depth poll failed");
                    channel = None;
                }
            }
        }
    }
}

async fn open(connector: &Connector) -> Option<lapin::Channel> {
    let conn = connector.get(Duration::from_secs(5)).await.ok()?;
    conn.conn.create_channel().await.ok()
}
