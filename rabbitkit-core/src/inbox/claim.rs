//! One delivery in transactional mode: claim, run, commit or roll back.
//!
//! The worker's pipeline calls [`Txn::run`] in place of the plain handler run and
//! [`Txn::finish`] on the decision before settling; everything transactional is here.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sqlx::{PgPool, Postgres, Transaction};
use tokio::sync::Mutex;

use super::Inbox;
use super::tx::{Slot, TxSlot};
use crate::decide::Decision;
use crate::delivery::{Delivery, Extensions};
use crate::outcome::{Failure, Outcome};
use crate::policy::AckPolicy;
use crate::run::Runner;

/// What the claim found.
enum Claim {
    /// The row is ours (uncommitted): run the handler in this transaction.
    Claimed(Transaction<'static, Postgres>),
    /// Committed before with the same body digest.
    Duplicate,
    /// Committed before with another body digest.
    Conflict,
}

/// The inbox's statements for one schema, built once.
#[derive(Debug)]
pub(super) struct Sql {
    insert: String,
    read: String,
}

impl Sql {
    pub(super) fn new(schema: &str) -> Sql {
        Sql {
            insert: format!(
                "INSERT INTO \"{schema}\".rabbitkit_inbox (consumer, message_id, body_digest, claimed_at) \
                 VALUES ($1, $2, $3, now()) ON CONFLICT (consumer, message_id) DO NOTHING"
            ),
            read: format!(
                "SELECT body_digest FROM \"{schema}\".rabbitkit_inbox WHERE consumer = $1 AND message_id = $2"
            ),
        }
    }
}

/// BEGIN and claim. Under READ COMMITTED, an `INSERT … ON CONFLICT DO NOTHING` that meets an
/// uncommitted row with the same key waits for that transaction: if it commits, ours inserts
/// nothing and the read (a new snapshot) sees the committed row; if it rolls back, ours
/// inserts. So two copies never both hold the claim.
async fn claim(
    pool: &PgPool,
    sql: &Sql,
    consumer: &str,
    id: &str,
    digest: &[u8],
) -> Result<Option<Claim>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let inserted = sqlx::query(&sql.insert)
        .bind(consumer)
        .bind(id)
        .bind(digest)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    if inserted == 1 {
        return Ok(Some(Claim::Claimed(tx)));
    }
    let found: Option<Vec<u8>> = sqlx::query_scalar(&sql.read)
        .bind(consumer)
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
    // Nothing was written: dropping would roll back too, this says so at once.
    tx.rollback().await?;
    Ok(match found {
        Some(d) if d == digest => Some(Claim::Duplicate),
        Some(_) => Some(Claim::Conflict),
        // Deleted between the two statements (cleanup): claim again.
        None => None,
    })
}

fn inc(a: &AtomicU64) {
    a.fetch_add(1, Ordering::Relaxed);
}

fn metric(queue: &str, result: &'static str) {
    metrics::counter!("rabbitkit_inbox_total", "queue" => queue.to_owned(), "result" => result)
        .increment(1);
}

/// One delivery's transactional state.
pub(crate) struct Txn {
    inbox: Option<Inbox>,
    slot: Slot,
}

impl Txn {
    /// In transactional mode: the delivery's state and the extensions its handler sees (the
    /// worker's, plus the slot [`Tx`](super::Tx) reads). `None` in every other mode.
    pub(crate) fn for_delivery(
        policy: AckPolicy,
        worker: &Arc<Extensions>,
    ) -> Option<(Txn, Arc<Extensions>)> {
        if policy != AckPolicy::Transactional {
            return None;
        }
        let slot: Slot = Arc::new(Mutex::new(None));
        let mut ext = Extensions::clone(worker);
        ext.insert(TxSlot(slot.clone()));
        let txn = Txn {
            inbox: worker.get::<Inbox>().cloned(),
            slot,
        };
        Some((txn, Arc::new(ext)))
    }

    /// Claims the message, then runs the handler with the transaction in the slot. A
    /// duplicate becomes `Ack` (the handler does not run), a conflict or a missing id a
    /// parking outcome, a database failure a requeue.
    pub(crate) async fn run(&self, runner: &Runner, delivery: &Delivery) -> Outcome {
        let queue = delivery.queue();
        let Some(inbox) = &self.inbox else {
            // The worker refuses to start like this; never run a handler without its claim.
            return Outcome::park(Failure::new(
                "no-inbox",
                "transactional subscriber on a worker without an inbox (Worker::postgres)",
            ));
        };
        let c = inbox.counters();
        let Some(id) = delivery.message_id().filter(|id| !id.is_empty()) else {
            inc(&c.missing_id);
            metric(queue, "missing-message-id");
            return Outcome::park(Failure::new(
                "missing-message-id",
                "transactional mode keys the inbox by message id, and this delivery has none",
            ));
        };
        let digest = {
            use sha2::Digest;
            sha2::Sha256::digest(delivery.body()).to_vec()
        };
        let mut found = None;
        // Twice at most: a second miss means the row keeps vanishing; requeue below.
        for _ in 0..2 {
            match claim(inbox.pool(), inbox.sql(), queue, id, &digest).await {
                Ok(Some(claim)) => {
                    found = Some(claim);
                    break;
                }
                Ok(None) => continue,
                Err(e) => {
                    inc(&c.claim_failed);
                    metric(queue, "claim-failed");
                    tracing::warn!(queue, message_id = id, error = %e, "inbox claim failed; requeueing the message");
                    return Outcome::Requeue;
                }
            }
        }
        match found {
            Some(Claim::Claimed(tx)) => {
                inc(&c.claimed);
                *self.slot.lock().await = Some(tx);
                runner.run(delivery).await
            }
            Some(Claim::Duplicate) => {
                inc(&c.duplicates);
                metric(queue, "duplicate");
                tracing::info!(
                    queue,
                    message_id = id,
                    "duplicate: already processed (inbox claim committed); acked without running the handler"
                );
                Outcome::Ack
            }
            Some(Claim::Conflict) => {
                inc(&c.conflicts);
                metric(queue, "inbox-conflict");
                tracing::warn!(
                    queue,
                    message_id = id,
                    "message id already processed with another body; parking"
                );
                Outcome::park(Failure::new(
                    "inbox-conflict",
                    format!(
                        "message id {id:?} was processed before with another body (its inbox claim holds another digest)"
                    ),
                ))
            }
            None => {
                inc(&c.claim_failed);
                Outcome::Requeue
            }
        }
    }

    /// The decision after the transaction: an `Ack` commits first, and becomes a requeue
    /// when the commit fails (its outcome is unknown: the redelivery finds the claim if it
    /// committed, and runs again if not); anything else rolls back.
    pub(crate) async fn finish(&self, decision: Decision, delivery: &Delivery) -> Decision {
        let Some(tx) = self.slot.lock().await.take() else {
            return decision;
        };
        let Some(inbox) = &self.inbox else {
            return decision;
        };
        let c = inbox.counters();
        let queue = delivery.queue();
        if matches!(decision, Decision::Ack) {
            match tx.commit().await {
                Ok(()) => {
                    inc(&c.committed);
                    metric(queue, "committed");
                    Decision::Ack
                }
                Err(e) => {
                    inc(&c.commit_unknown);
                    metric(queue, "commit-unknown");
                    tracing::warn!(
                        queue,
                        message_id = delivery.message_id().unwrap_or(""),
                        error = %e,
                        "COMMIT failed, its outcome is unknown; not acking: the message is requeued and its redelivery resolves through the inbox"
                    );
                    Decision::Requeue
                }
            }
        } else {
            if let Err(e) = tx.rollback().await {
                // The connection is gone: so is the transaction.
                tracing::debug!(queue, error = %e, "rollback failed");
            }
            inc(&c.rolled_back);
            metric(queue, "rolled-back");
            decision
        }
    }
}
