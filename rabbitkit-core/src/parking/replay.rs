//! Replaying parked messages: confirmed copy first, then the ack; filters, a rate, and what
//! keeps a message from being replayed twice (the guarantees are documented on
//! [`Parking::replay_with`]).

use std::collections::HashSet;
use std::time::Duration;

use lapin::options::BasicAckOptions;
use tokio::time::MissedTickBehavior;

use super::{ParkedMessage, Parking};
use crate::envelope::Envelope;
use crate::error::{Error, Result};
use crate::publisher::PublishOutcome;

/// How many messages a replay moves and how fast.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplayOptions {
    /// Most copies to make (`None`: every selected message).
    pub limit: Option<usize>,
    /// Least time between two copies (`None`: as fast as confirms come back).
    pub interval: Option<Duration>,
}

impl ReplayOptions {
    /// Every selected message, unthrottled.
    pub fn new() -> Self {
        Self::default()
    }

    /// At most `n` copies.
    #[must_use]
    pub fn limit(mut self, n: usize) -> Self {
        self.limit = Some(n);
        self
    }

    /// At most `count` copies per `period` (for example 50 per second), evenly spaced:
    /// `n` copies take at least `(n - 1) × period / count`. A `count` of 0 means unthrottled.
    #[must_use]
    pub fn rate(mut self, count: u32, period: Duration) -> Self {
        self.interval = (count > 0 && !period.is_zero()).then(|| period / count);
        self
    }
}

/// What a replay did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// Copies confirmed in the work queue; their parked originals acked.
    pub replayed: u64,
    /// Parked copies of a message already replayed in this run (same message id and body),
    /// acked off the parking queue without a second copy.
    pub duplicates: u64,
    /// Messages looked at and not selected: left parked, unchanged.
    pub passed_over: u64,
    /// Selected messages parked from another work queue: left parked, unchanged.
    pub other_queue: u64,
    /// Replayed copies sent unsigned: the parked message's own headers did not verify
    /// with this replay's keys (parked by a release that did not sign, trimmed, or not
    /// written by rabbitkit), so signing them would vouch for what rabbitkit never wrote.
    /// Workers believe their route only within their unsigned window. Always 0 without a
    /// key.
    pub unsigned: u64,
    /// Messages ready in the parking queue afterwards, as the broker counted them.
    pub remaining: u32,
    /// Why the replay stopped early, if it did: the copy was not confirmed (returned,
    /// nacked, timed out, failed) and the parked original was requeued untouched.
    pub stopped: Option<String>,
}

impl Parking {
    /// Moves up to `limit` parked messages back to the work queue, oldest first. Each parked
    /// message is acked only after its copy is confirmed; the first copy that is not
    /// confirmed stops the replay and its original stays parked.
    pub async fn replay(&self, limit: usize) -> Result<ReplayReport> {
        self.replay_with(ReplayOptions::new().limit(limit), |_| true)
            .await
    }

    /// Like [`Parking::replay`], for the parked messages `select` picks (by reason, error,
    /// body...). The ones it passes over stay parked, in their order. Looks at most at the
    /// messages that were parked when the call began.
    pub async fn replay_matching(
        &self,
        limit: usize,
        select: impl FnMut(&ParkedMessage) -> bool,
    ) -> Result<ReplayReport> {
        self.replay_with(ReplayOptions::new().limit(limit), select)
            .await
    }

    /// Replays the parked messages `select` picks, with a limit and a rate.
    ///
    /// # What a replay guarantees
    ///
    /// - **Nothing is lost.** Each copy goes to the work queue through the default exchange
    ///   (so only to the work queue, never to the other queues bound to the original exchange)
    ///   on the confirmed publisher with `mandatory = true`. The parked message is acked only
    ///   after its copy is `Confirmed`; the first copy that is returned, nacked, timed out or
    ///   failed stops the replay and that message stays parked.
    /// - **To the queue it came from.** A message whose source queue (rabbitkit's header, or
    ///   the broker's `x-death`) is another work queue stays parked, unchanged, and is
    ///   counted in [`ReplayReport::other_queue`]: a parking queue shared through custom
    ///   dead-letter arguments never sends one queue's messages to another.
    /// - **Passed-over messages stay parked, unchanged.** They are held unacked on the replay's
    ///   channel and requeued when it closes. A classic queue puts a requeued message back
    ///   at its position; a quorum parking queue (the default) puts it behind the messages
    ///   the replay did not look at (when a limit stopped it), so the order of a partly
    ///   replayed queue is not kept. Messages parked while the replay runs queue up behind
    ///   them and are not looked at. The broker's delivery counts a quorum parking queue
    ///   adds to what it delivers are left out of the copies.
    /// - **One copy per message per run.** Within one run, a parked message with the same
    ///   message id and body as one already replayed (the runtime parks twice when the ack of a
    ///   confirmed parking copy is lost and the message fails again) is acked off the parking
    ///   queue without a second copy, and counted in [`ReplayReport::duplicates`]. Messages
    ///   without a message id are never treated as duplicates: distinct messages may share a
    ///   body.
    /// - **A finished replay is not repeated.** A replayed message has left the parking queue,
    ///   so replaying again finds only what is still parked.
    ///
    /// # What it does not cover
    ///
    /// Between the confirm of a copy and the broker processing the ack of the parked message,
    /// a crash or a lost connection leaves the message **both** in the work queue and still
    /// parked (AMQP has no atomic move between queues). A later replay then sends a second
    /// copy. Both copies carry the same message id and the same [`headers::REPLAY_ID`] (the
    /// id depends only on the message id, the body and the replay round), so a consumer
    /// recognises the second one: the [`Idempotent`](crate::idempotency::Idempotent) layer,
    /// keyed on the message id (its default), acks it without running the handler once the
    /// first copy was processed.
    ///
    /// [`headers::REPLAY_ID`]: crate::headers::REPLAY_ID
    pub async fn replay_with(
        &self,
        options: ReplayOptions,
        mut select: impl FnMut(&ParkedMessage) -> bool,
    ) -> Result<ReplayReport> {
        let ch = self.channel().await?;
        let parked_at_start = self.passive_count(&ch).await?;
        let limit = options.limit.unwrap_or(usize::MAX);
        let mut pace = options.interval.map(|every| {
            let mut t = tokio::time::interval(every);
            t.set_missed_tick_behavior(MissedTickBehavior::Delay);
            t
        });
        let mut replayed_content = HashSet::new();
        let mut report = ReplayReport::default();
        let mut looked = 0u32;
        while looked < parked_at_start
            && usize::try_from(report.replayed).unwrap_or(usize::MAX) < limit
        {
            let Some((tag, parked)) = self.get_one(&ch).await? else {
                break;
            };
            looked += 1;
            if !select(&parked) {
                // Held unacked on this channel; requeued when it closes, in order.
                report.passed_over += 1;
                continue;
            }
            if parked
                .source_queue
                .as_deref()
                .is_some_and(|q| q != self.work_queue)
            {
                report.other_queue += 1;
                continue;
            }
            // Id, length and digest: a twin is the same id and the same body.
            let content = parked
                .message_id()
                .map(|id| (id.to_owned(), parked.body.len(), parked.content_digest()));
            if content
                .as_ref()
                .is_some_and(|c| replayed_content.contains(c))
            {
                // Its twin's copy is confirmed in this run: a second copy would duplicate it.
                ch.basic_ack(tag, BasicAckOptions::default())
                    .await
                    .map_err(Error::amqp)?;
                report.duplicates += 1;
                continue;
            }
            if let Some(pace) = pace.as_mut() {
                pace.tick().await;
            }
            // Never an expiration into the work queue (a parked message has none; this
            // also holds for one parked by hand with one).
            let mut replay_headers = parked.replay_headers();
            // Vouch only for what rabbitkit wrote: a parked copy whose own headers verify,
            // or one with none of its own (dead-lettered by the broker, its route from
            // `x-death`).
            let verdict = self.trust.judge(
                parked.properties.headers().as_ref(),
                &parked.body,
                &self.work_queue,
            );
            if self.trust.keys().is_some()
                && !matches!(
                    verdict,
                    crate::trust::Verdict::Signed | crate::trust::Verdict::None
                )
            {
                report.unsigned += 1;
            } else {
                self.trust.sign(&mut replay_headers, &parked.body);
            }
            let props = crate::envelope::without_expiration(&parked.properties)
                .with_headers(replay_headers);
            let copy = Envelope::new("", self.work_queue.as_str(), parked.body.clone())
                .properties(props)
                .mandatory(true);
            match self.publisher.publish(copy).await {
                Ok(PublishOutcome::Confirmed { .. }) => {
                    ch.basic_ack(tag, BasicAckOptions::default())
                        .await
                        .map_err(Error::amqp)?;
                    report.replayed += 1;
                    replayed_content.extend(content);
                }
                other => {
                    let why = match other {
                        Ok(o) => format!("replayed copy not confirmed: {o:?}"),
                        Err(e) => format!("replayed copy refused: {e}"),
                    };
                    tracing::warn!(queue = %self.parking_queue, reason = %why, "replay stopped; message stays parked");
                    report.stopped = Some(why);
                    break;
                }
            }
        }
        // Closing the channel requeues every message still held (passed over, or the one
        // whose copy was refused), and settles before the count.
        let _ = ch.close(200, "rabbitkit parking replay".into()).await;
        let left = u64::from(parked_at_start).saturating_sub(report.replayed + report.duplicates);
        report.remaining = self
            .settled_count(u32::try_from(left).unwrap_or(u32::MAX))
            .await
            .unwrap_or(0);
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_spaces_copies_evenly() {
        let o = ReplayOptions::new().rate(50, Duration::from_secs(1));
        assert_eq!(o.interval, Some(Duration::from_millis(20)));
        assert_eq!(
            ReplayOptions::new()
                .rate(0, Duration::from_secs(1))
                .interval,
            None
        );
        assert_eq!(ReplayOptions::new().limit(3).limit, Some(3));
    }
}
