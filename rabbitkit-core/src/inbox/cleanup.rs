//! Keeping the inbox bounded: claims older than the window are deleted in small batches,
//! by one session at a time.
//!
//! Peers' inboxes deleted table-wide and held locks for seconds at tens of millions of rows,
//! with every instance running the same cleanup (DESIGN.md §6). Here each batch is one short
//! statement (`DELETE … WHERE ctid IN (SELECT ctid … LIMIT n FOR UPDATE SKIP LOCKED)`) found
//! through the `claimed_at` index, rows a handler transaction holds are skipped, there is a
//! pause between batches, and a session-level advisory lock (`pg_try_advisory_lock`) lets one
//! instance run it while the others skip their turn.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgPool;
use tokio::task::JoinHandle;

use super::InboxError;
use super::migrate::lock_key;

/// How the inbox is cleaned.
#[derive(Debug, Clone)]
pub struct CleanupConfig {
    /// Claims older than this are deleted (default 7 days). A redelivery older than the
    /// window is no longer recognised as a duplicate.
    pub window: Duration,
    /// Rows per `DELETE` (default 1 000).
    pub batch: u32,
    /// Pause between batches (default 50 ms).
    pub pause: Duration,
    /// Time between passes of the background cleanup (default 60 s).
    pub every: Duration,
}

impl Default for CleanupConfig {
    fn default() -> Self {
        CleanupConfig {
            window: Duration::from_secs(7 * 24 * 3600),
            batch: 1_000,
            pause: Duration::from_millis(50),
            every: Duration::from_secs(60),
        }
    }
}

/// What one cleanup pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CleanupReport {
    /// Another session holds the cleanup lock: this pass did nothing.
    Skipped,
    /// Rows deleted, in that many `DELETE` statements.
    Done {
        /// Rows deleted.
        deleted: u64,
        /// Statements run.
        batches: u32,
    },
}

fn q(e: sqlx::Error) -> InboxError {
    InboxError::Query(e.to_string())
}

/// One pass: takes the lock or skips, deletes batch after batch until a batch comes back
/// short, releases the lock.
pub(super) async fn once(
    pool: &PgPool,
    schema: &str,
    cfg: &CleanupConfig,
) -> Result<CleanupReport, InboxError> {
    // A connection of its own, out of the pool: the advisory lock is held by the session, and
    // closing the connection at the end (however the pass ends) releases it; a pooled
    // connection would go back to the pool still holding it.
    let mut conn = pool.acquire().await.map_err(q)?.detach();
    let key = lock_key("cleanup", schema);
    let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
        .bind(key)
        .fetch_one(&mut conn)
        .await
        .map_err(q)?;
    if !got {
        return Ok(CleanupReport::Skipped);
    }
    let sql = format!(
        "DELETE FROM \"{schema}\".rabbitkit_inbox WHERE ctid IN (
            SELECT ctid FROM \"{schema}\".rabbitkit_inbox
            WHERE claimed_at < now() - make_interval(secs => $1)
            LIMIT $2 FOR UPDATE SKIP LOCKED)"
    );
    let (mut deleted, mut batches) = (0u64, 0u32);
    let window = cfg.window.as_secs_f64();
    let batch = i64::from(cfg.batch.max(1));
    loop {
        let n = sqlx::query(&sql)
            .bind(window)
            .bind(batch)
            .execute(&mut conn)
            .await
            .map_err(q)?
            .rows_affected();
        batches += 1;
        deleted += n;
        if n < u64::try_from(batch).unwrap_or(u64::MAX) {
            break;
        }
        tokio::time::sleep(cfg.pause).await;
    }
    // Closing the session releases the lock too; unlock first for a clean log.
    let _ = sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(key)
        .execute(&mut conn)
        .await;
    let _ = sqlx::Connection::close(conn).await;
    Ok(CleanupReport::Done { deleted, batches })
}

/// The background cleanup, aborted when the inbox is dropped.
pub(super) struct Running {
    task: JoinHandle<()>,
    last: Arc<Mutex<Option<CleanupReport>>>,
}

impl Running {
    pub(super) fn spawn(pool: PgPool, schema: String, cfg: CleanupConfig) -> Running {
        let last = Arc::new(Mutex::new(None));
        let seen = last.clone();
        let task = tokio::spawn(async move {
            loop {
                match once(&pool, &schema, &cfg).await {
                    Ok(report) => {
                        if let CleanupReport::Done { deleted, batches } = report
                            && deleted > 0
                        {
                            tracing::info!(schema, deleted, batches, "inbox cleanup pass");
                        }
                        *seen.lock().unwrap_or_else(|p| p.into_inner()) = Some(report);
                    }
                    Err(e) => tracing::warn!(schema, error = %e, "inbox cleanup pass failed"),
                }
                tokio::time::sleep(cfg.every).await;
            }
        });
        Running { task, last }
    }

    pub(super) fn last(&self) -> Option<CleanupReport> {
        *self.last.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}
