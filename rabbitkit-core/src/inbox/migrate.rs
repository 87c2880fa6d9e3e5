//! The inbox's embedded, versioned migration.
//!
//! Idempotent and safe to run from several workers at once: the steps run in one
//! transaction under a transaction-level advisory lock, and each applied version is recorded
//! in `{schema}.rabbitkit_migrations` (component `inbox`).

use sqlx::PgPool;

use super::InboxError;

/// The newest inbox schema version this build knows.
pub const SCHEMA_VERSION: i32 = 1;

/// Each version's statements, in order. `{s}` is the quoted schema. Never edit a released
/// step: add a new one.
const STEPS: &[&[&str]] = &[
    // 1: the inbox table; its primary key is the claim's unique index; claimed_at for cleanup.
    &[
        "CREATE TABLE {s}.rabbitkit_inbox (
            consumer text NOT NULL,
            message_id text NOT NULL,
            body_digest bytea NOT NULL,
            claimed_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (consumer, message_id)
        )",
        "CREATE INDEX rabbitkit_inbox_claimed_at ON {s}.rabbitkit_inbox (claimed_at)",
    ],
];

/// Refuses schema names that would need quoting rules of their own.
pub(super) fn check_schema(schema: &str) -> Result<(), InboxError> {
    let ok = !schema.is_empty()
        && schema.len() <= 63
        && schema
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !schema.as_bytes()[0].is_ascii_digit();
    if ok {
        Ok(())
    } else {
        Err(InboxError::InvalidSchema(schema.to_owned()))
    }
}

/// The advisory lock key of `schema`'s `purpose` (migration, cleanup): the first 8 bytes of
/// SHA-256, stable across processes and builds.
pub(super) fn lock_key(purpose: &str, schema: &str) -> i64 {
    use sha2::Digest;
    let d = sha2::Sha256::digest(format!("rabbitkit:{purpose}:{schema}").as_bytes());
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    i64::from_be_bytes(b)
}

fn db(e: sqlx::Error) -> InboxError {
    InboxError::Migrate(e.to_string())
}

/// Creates (or upgrades) the inbox in `schema`: the schema, the version table, the inbox
/// table and its indexes. Returns the version now in place.
pub async fn migrate(pool: &PgPool, schema: &str) -> Result<i32, InboxError> {
    check_schema(schema)?;
    let s = format!("\"{schema}\"");
    let mut tx = pool.begin().await.map_err(db)?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(lock_key("migrate", schema))
        .execute(&mut *tx)
        .await
        .map_err(db)?;
    sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS {s}"))
        .execute(&mut *tx)
        .await
        .map_err(db)?;
    sqlx::query(&format!(
        "CREATE TABLE IF NOT EXISTS {s}.rabbitkit_migrations (
            component text NOT NULL,
            version int NOT NULL,
            applied_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (component, version)
        )"
    ))
    .execute(&mut *tx)
    .await
    .map_err(db)?;
    let current: Option<i32> = sqlx::query_scalar(&format!(
        "SELECT max(version) FROM {s}.rabbitkit_migrations WHERE component = 'inbox'"
    ))
    .fetch_one(&mut *tx)
    .await
    .map_err(db)?;
    let current = current.unwrap_or(0);
    if current > SCHEMA_VERSION {
        return Err(InboxError::NewerSchema {
            schema: schema.to_owned(),
            found: current,
            known: SCHEMA_VERSION,
        });
    }
    for (i, step) in STEPS
        .iter()
        .enumerate()
        .skip(usize::try_from(current).unwrap_or(0))
    {
        for stmt in *step {
            sqlx::query(&stmt.replace("{s}", &s))
                .execute(&mut *tx)
                .await
                .map_err(db)?;
        }
        let version = i32::try_from(i + 1).unwrap_or(i32::MAX);
        sqlx::query(&format!(
            "INSERT INTO {s}.rabbitkit_migrations (component, version) VALUES ('inbox', $1)"
        ))
        .bind(version)
        .execute(&mut *tx)
        .await
        .map_err(db)?;
        tracing::info!(schema, version, "inbox migration applied");
    }
    tx.commit().await.map_err(db)?;
    Ok(SCHEMA_VERSION)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names() {
        assert!(check_schema("rabbitkit").is_ok());
        assert!(check_schema("t_1").is_ok());
        for bad in ["", "1a", "A", "a-b", "a\"b", &"x".repeat(64)] {
            assert!(check_schema(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn lock_keys_differ_by_purpose_and_schema() {
        assert_ne!(lock_key("migrate", "a"), lock_key("cleanup", "a"));
        assert_ne!(lock_key("cleanup", "a"), lock_key("cleanup", "b"));
        assert_eq!(lock_key("cleanup", "a"), lock_key("cleanup", "a"));
    }
}
