//! [`Tx`]: the handler's view of its delivery's transaction.
//!
//! The runtime opens the transaction and claims the message before the handler runs, puts it
//! in a per-delivery slot, and takes it back after the handler returns to commit or roll back.
//! The handler borrows it through [`Tx::lock`]; the lock is released when the guard drops,
//! which is always before the runtime takes the transaction back (a handler's future is done
//! or dropped by then).

use std::sync::Arc;

use sqlx::postgres::PgConnection;
use sqlx::{Postgres, Transaction};
use tokio::sync::{Mutex, OwnedMappedMutexGuard, OwnedMutexGuard};

use crate::delivery::Delivery;
use crate::extract::{FromDelivery, Requirements};
use crate::outcome::{Failure, Outcome};

pub(super) type Slot = Arc<Mutex<Option<Transaction<'static, Postgres>>>>;

/// The per-delivery slot, stored in the delivery's extensions in transactional mode.
#[derive(Clone)]
pub(super) struct TxSlot(pub(super) Slot);

/// The delivery's live Postgres transaction, in which the inbox claim was taken
/// ([`AckPolicy::Transactional`](crate::AckPolicy::Transactional), feature `postgres`).
///
/// Write the handler's effects through it; they commit together with the claim after the
/// handler returns `Ok`, and roll back with it otherwise. Do not commit it yourself (it cannot
/// be taken out), and do not keep its guard past the handler's return.
///
/// ```ignore
/// async fn deposit(Json(d): Json<Deposit>, tx: Tx) -> Result<(), BoxError> {
///     let mut db = tx.lock().await?;
///     sqlx::query("UPDATE accounts SET balance = balance + $1 WHERE id = $2")
///         .bind(d.amount).bind(&d.account).execute(&mut *db).await?;
///     Ok(())
/// }
/// ```
#[derive(Clone)]
pub struct Tx {
    slot: Slot,
}

impl std::fmt::Debug for Tx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tx").finish_non_exhaustive()
    }
}

/// The transaction is no longer there: the handler's run is over (a guard asked for after
/// the runtime took it back).
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the delivery's transaction is closed (asked for after the handler's run)")]
pub struct TxGone;

/// Exclusive access to the delivery's connection, inside its transaction. Derefs to
/// [`PgConnection`]: pass `&mut *guard` as a sqlx executor.
pub struct TxGuard(OwnedMappedMutexGuard<Option<Transaction<'static, Postgres>>, PgConnection>);

impl std::fmt::Debug for TxGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxGuard").finish_non_exhaustive()
    }
}

impl std::ops::Deref for TxGuard {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        &self.0
    }
}

impl std::ops::DerefMut for TxGuard {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.0
    }
}

impl Tx {
    /// Waits for exclusive access to the transaction's connection.
    pub async fn lock(&self) -> Result<TxGuard, TxGone> {
        let guard: OwnedMutexGuard<_> = self.slot.clone().lock_owned().await;
        OwnedMutexGuard::try_map(guard, |t| t.as_mut().map(|t| &mut **t))
            .map(TxGuard)
            .map_err(|_| TxGone)
    }
}

impl FromDelivery for Tx {
    type Rejection = Outcome;

    fn from_delivery(d: &Delivery) -> Result<Self, Outcome> {
        match d.extensions().get::<TxSlot>() {
            Some(s) => Ok(Tx { slot: s.0.clone() }),
            // A handler taking `Tx` on a subscriber not in transactional mode: its effects
            // would commit with no inbox claim. Parked (replayable once wired), not run.
            None => Err(Outcome::park(Failure::new(
                "no-transaction",
                "the handler takes a Tx, which needs ack policy transactional (AckPolicy::Transactional) and a worker inbox (Worker::postgres)",
            ))),
        }
    }

    fn requirements(r: &mut Requirements) {
        r.state::<super::Inbox>();
    }
}
