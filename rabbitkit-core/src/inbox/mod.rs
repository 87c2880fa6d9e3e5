//! Transactional ack mode: a Postgres inbox claimed in the handler's own transaction
//! (feature `postgres`; first stage, see `docs/EXACTLY-ONCE.md`).
//!
//! A subscriber in [`AckPolicy::Transactional`](crate::AckPolicy::Transactional) mode on a
//! worker given an [`Inbox`] ([`Worker::postgres`](crate::Worker::postgres)) settles each
//! delivery this way:
//!
//! 1. `BEGIN`; claim the message in `{schema}.rabbitkit_inbox` (key: the work queue and the
//!    message id, with the SHA-256 of the body beside it) with `INSERT … ON CONFLICT DO
//!    NOTHING`. A copy of a message whose claim is in flight waits on the unique index until
//!    that transaction ends, then resolves as below.
//! 2. Claimed → the handler runs with the live transaction ([`Tx`]).
//!    A committed claim with the same digest → a duplicate: rolled back, acked, the handler
//!    does not run. Another digest → parked (`inbox-conflict`), never acked unprocessed.
//!    No message id → parked (`missing-message-id`).
//! 3. Handler `Ok` → `COMMIT`, then the ack. A failed commit is an unknown outcome: no ack,
//!    the message is requeued and its redelivery resolves through the inbox.
//!    Anything else (error, panic, deadline, decode rejection, shutdown cut-off) →
//!    `ROLLBACK`, then the usual decision (retry copy, parking copy, requeue).
//!
//! Effects written through [`Tx`] therefore happen once per (queue, message id) within the
//! inbox's retention window.

mod claim;
mod cleanup;
mod migrate;
mod redact;
mod tx;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

pub use cleanup::{CleanupConfig, CleanupReport};
pub use migrate::{SCHEMA_VERSION, migrate};
pub use tx::{Tx, TxGone, TxGuard};

pub(crate) use claim::Txn;

/// Errors of the Postgres inbox. Never carries the database password: messages from the
/// driver are scrubbed of it (see [`Inbox::connect`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InboxError {
    /// The Postgres URL does not parse.
    #[error("invalid Postgres URL: {0}")]
    InvalidUrl(String),
    /// Postgres did not answer (refused, timed out, authentication failed).
    #[error("Postgres unreachable at {target}: {reason}")]
    Unreachable {
        /// `host:port/database`, without credentials.
        target: String,
        /// The driver's reason, without the password.
        reason: String,
    },
    /// An invalid schema name.
    #[error(
        "invalid inbox schema name {0:?}: use 1-63 characters a-z, 0-9 and _, not starting with a digit"
    )]
    InvalidSchema(String),
    /// The migration failed.
    #[error("inbox migration failed: {0}")]
    Migrate(String),
    /// The schema holds a newer inbox version than this build knows.
    #[error("inbox schema {schema:?} is at version {found}, newer than this build's {known}")]
    NewerSchema {
        /// The schema.
        schema: String,
        /// The version found.
        found: i32,
        /// The newest version this build knows.
        known: i32,
    },
    /// A query failed.
    #[error("inbox query failed: {0}")]
    Query(String),
}

/// The inbox's counters (this process).
#[derive(Debug, Default)]
pub(crate) struct InboxCounters {
    pub(crate) claimed: AtomicU64,
    pub(crate) duplicates: AtomicU64,
    pub(crate) conflicts: AtomicU64,
    pub(crate) missing_id: AtomicU64,
    pub(crate) committed: AtomicU64,
    pub(crate) rolled_back: AtomicU64,
    pub(crate) commit_unknown: AtomicU64,
    pub(crate) claim_failed: AtomicU64,
}

/// A snapshot of an [`Inbox`]'s counters in this process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct InboxStats {
    /// Claims taken (the handler then ran).
    pub claimed: u64,
    /// Copies found already committed with the same body: acked without running.
    pub duplicates: u64,
    /// Copies whose id was committed with another body: parked (`inbox-conflict`).
    pub conflicts: u64,
    /// Deliveries without a message id: parked (`missing-message-id`).
    pub missing_id: u64,
    /// Transactions committed (then acked).
    pub committed: u64,
    /// Transactions rolled back after a failure.
    pub rolled_back: u64,
    /// Commits whose outcome is unknown (the connection failed during `COMMIT`): requeued.
    pub commit_unknown: u64,
    /// Claims that failed on the database (requeued).
    pub claim_failed: u64,
}

/// The worker's Postgres inbox: a pool, the schema its table lives in, and its counters.
/// Cheap to clone (shared). Its `Debug` never shows the connection options (sqlx's
/// `PgConnectOptions` prints the password in its `Debug`).
#[derive(Clone)]
pub struct Inbox {
    inner: Arc<Inner>,
}

struct Inner {
    pool: PgPool,
    schema: String,
    target: String,
    counters: InboxCounters,
    sql: claim::Sql,
    cleanup: Option<cleanup::Running>,
}

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox")
            .field("target", &self.inner.target)
            .field("schema", &self.inner.schema)
            .field("pool_size", &self.inner.pool.size())
            .finish_non_exhaustive()
    }
}

/// How [`Inbox::connect`] connects and prepares the inbox.
#[derive(Clone)]
pub struct InboxOptions {
    url: String,
    schema: String,
    max_connections: u32,
    connect_timeout: Duration,
    migrate: bool,
    cleanup: Option<CleanupConfig>,
}

impl std::fmt::Debug for InboxOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InboxOptions")
            .field("url", &redact::url(&self.url))
            .field("schema", &self.schema)
            .field("max_connections", &self.max_connections)
            .field("connect_timeout", &self.connect_timeout)
            .field("migrate", &self.migrate)
            .field("cleanup", &self.cleanup)
            .finish()
    }
}

impl InboxOptions {
    /// Options for `url` (`postgres://user:password@host:port/database`): schema
    /// `rabbitkit`, 10 connections, a 10 s connect timeout, no migration, no cleanup.
    pub fn new(url: impl Into<String>) -> Self {
        InboxOptions {
            url: url.into(),
            schema: "rabbitkit".into(),
            max_connections: 10,
            connect_timeout: Duration::from_secs(10),
            migrate: false,
            cleanup: None,
        }
    }

    /// The schema of the inbox table (default `rabbitkit`).
    #[must_use]
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// The pool's size (default 10). Give it at least the subscribers' concurrency: a
    /// delivery holds a connection from its claim to its commit.
    #[must_use]
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// How long connecting (and each pool acquire) may take (default 10 s).
    #[must_use]
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// Run the embedded migration ([`migrate`]) when connecting (default off).
    #[must_use]
    pub fn migrate(mut self, on: bool) -> Self {
        self.migrate = on;
        self
    }

    /// Delete claims older than the window in the background while the inbox lives
    /// (default off; see [`CleanupConfig`]).
    #[must_use]
    pub fn cleanup(mut self, cfg: CleanupConfig) -> Self {
        self.cleanup = Some(cfg);
        self
    }
}

impl Inbox {
    /// Connects, checks that Postgres answers (refusing with [`InboxError::Unreachable`]
    /// otherwise), runs the migration if asked, and starts the cleanup if configured.
    pub async fn connect(options: InboxOptions) -> Result<Inbox, InboxError> {
        migrate::check_schema(&options.schema)?;
        let password = redact::password(&options.url);
        let scrub = |s: String| redact::scrub(&s, password.as_deref());
        let connect: PgConnectOptions = options
            .url
            .parse()
            .map_err(|e: sqlx::Error| InboxError::InvalidUrl(scrub(e.to_string())))?;
        let target = format!(
            "{}:{}/{}",
            connect.get_host(),
            connect.get_port(),
            connect.get_database().unwrap_or("")
        );
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.connect_timeout)
            .connect_with(connect)
            .await
            .map_err(|e| InboxError::Unreachable {
                target: target.clone(),
                reason: scrub(e.to_string()),
            })?;
        if options.migrate {
            migrate(&pool, &options.schema).await.map_err(|e| match e {
                InboxError::Migrate(m) => InboxError::Migrate(scrub(m)),
                other => other,
            })?;
        }
        let cleanup = options
            .cleanup
            .map(|cfg| cleanup::Running::spawn(pool.clone(), options.schema.clone(), cfg));
        Ok(Inbox {
            inner: Arc::new(Inner {
                pool,
                sql: claim::Sql::new(&options.schema),
                schema: options.schema,
                target,
                counters: InboxCounters::default(),
                cleanup,
            }),
        })
    }

    /// An inbox on a pool you built (schema checked, nothing else). The pool's own
    /// `Debug` is sqlx's: keep it out of logs.
    pub fn from_pool(pool: PgPool, schema: impl Into<String>) -> Result<Inbox, InboxError> {
        let schema = schema.into();
        migrate::check_schema(&schema)?;
        Ok(Inbox {
            inner: Arc::new(Inner {
                pool,
                sql: claim::Sql::new(&schema),
                schema,
                target: "(pool)".into(),
                counters: InboxCounters::default(),
                cleanup: None,
            }),
        })
    }

    /// The pool (for the application's own queries).
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The inbox's schema.
    pub fn schema(&self) -> &str {
        &self.inner.schema
    }

    /// This process's counters.
    pub fn stats(&self) -> InboxStats {
        let c = &self.inner.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        InboxStats {
            claimed: l(&c.claimed),
            duplicates: l(&c.duplicates),
            conflicts: l(&c.conflicts),
            missing_id: l(&c.missing_id),
            committed: l(&c.committed),
            rolled_back: l(&c.rolled_back),
            commit_unknown: l(&c.commit_unknown),
            claim_failed: l(&c.claim_failed),
        }
    }

    /// One cleanup pass now (see [`CleanupConfig`]); `Skipped` when another session holds
    /// the cleanup lock.
    pub async fn cleanup_once(&self, cfg: &CleanupConfig) -> Result<CleanupReport, InboxError> {
        cleanup::once(&self.inner.pool, &self.inner.schema, cfg).await
    }

    /// The last background cleanup's report, if the cleanup runs and has finished a pass.
    pub fn last_cleanup(&self) -> Option<CleanupReport> {
        self.inner.cleanup.as_ref().and_then(|c| c.last())
    }

    pub(crate) fn counters(&self) -> &InboxCounters {
        &self.inner.counters
    }

    fn sql(&self) -> &claim::Sql {
        &self.inner.sql
    }
}
