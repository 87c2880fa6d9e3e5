//! `rabbitkit parking list|show|replay|purge`: thin front ends of [`Parking`]; `rabbitkit
//! parking migrate`: of [`Topology::migrate_parking`].

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rabbitkit_core::amqp::AMQPValue;
use serde_json::{Value, json};

use super::args::{Filters, ParkingCommand, ReplayArgs};
use super::{Done, EXIT_FAILED, EXIT_OK, EXIT_USAGE, Io};
use crate::topology::ParkingMigration;
use crate::{ConnectionConfig, ParkedMessage, Parking, ReplayOptions, Topology};

pub(crate) async fn run(
    connection: &ConnectionConfig,
    cmd: ParkingCommand,
    io: &mut Io<'_>,
) -> Done {
    let work_queue = match &cmd {
        ParkingCommand::List { work_queue, .. }
        | ParkingCommand::Show { work_queue, .. }
        | ParkingCommand::Purge { work_queue, .. } => work_queue,
        ParkingCommand::Replay(a) => &a.work_queue,
        ParkingCommand::Migrate { work_queue } => {
            return migrate(connection, work_queue, io).await;
        }
    };
    if let ParkingCommand::Purge { yes: false, .. } = cmd {
        writeln!(
            io.err,
            "rabbitkit: refusing to purge {work_queue}.parking without --yes; nothing was removed"
        )?;
        return Ok(EXIT_USAGE);
    }
    let parking = Parking::new(connection.clone(), work_queue.as_str())?;
    let done = match cmd {
        ParkingCommand::List {
            filters,
            limit,
            json,
            ..
        } => list(&parking, &filters, limit, json, io).await,
        ParkingCommand::Show {
            filters,
            limit,
            body_bytes,
            json,
            ..
        } => {
            let view = View { body_bytes, json };
            show(&parking, &filters, limit, view, io).await
        }
        ParkingCommand::Replay(args) => replay(&parking, args, io).await,
        ParkingCommand::Purge { .. } => purge(&parking, io).await,
        ParkingCommand::Migrate { .. } => Ok(EXIT_USAGE),
    };
    parking.close().await;
    done
}

async fn migrate(connection: &ConnectionConfig, work_queue: &str, io: &mut Io<'_>) -> Done {
    let report = Topology::new(work_queue)
        .migrate_parking(connection)
        .await?;
    let count = |n: Option<u32>| n.map_or_else(|| "gone".to_owned(), |n| n.to_string());
    writeln!(
        io.out,
        "{}: {} moved out of the old queue, {} moved into the quorum queue; {} parked; holding queue {:?}: {}",
        report.queue,
        report.moved_out,
        report.moved_in,
        count(report.parking_messages),
        report.holding_queue,
        count(report.holding_messages)
    )?;
    match &report.outcome {
        ParkingMigration::Incomplete { why } => {
            writeln!(
                io.err,
                "rabbitkit: migration of {} incomplete (nothing was lost): {why}",
                report.queue
            )?;
            Ok(EXIT_FAILED)
        }
        ParkingMigration::AlreadyQuorum => {
            writeln!(io.out, "{} is the quorum parking queue", report.queue)?;
            Ok(EXIT_OK)
        }
        _ => {
            writeln!(
                io.out,
                "{} migrated: it is the quorum parking queue",
                report.queue
            )?;
            Ok(EXIT_OK)
        }
    }
}

async fn purge(parking: &Parking, io: &mut Io<'_>) -> Done {
    let n = parking.purge().await?;
    writeln!(io.out, "purged {n} from {}", parking.queue())?;
    Ok(EXIT_OK)
}

impl Filters {
    /// Whether `m` passes every filter given (`now` for the ages).
    fn matches(&self, m: &ParkedMessage, now: SystemTime) -> bool {
        let age = m.age(now);
        self.message_id
            .as_deref()
            .is_none_or(|id| m.message_id() == Some(id))
            && self
                .error_kind
                .as_deref()
                .is_none_or(|k| m.error_kind.as_deref() == Some(k))
            && self
                .park_reason
                .as_deref()
                .is_none_or(|r| m.reason.as_deref() == Some(r))
            && self.older_than.is_none_or(|o| age.is_some_and(|a| a >= o))
            && self.newer_than.is_none_or(|n| age.is_some_and(|a| a < n))
    }
}

/// The parked messages `filters` pick, at most `limit`, and how many match in all (`None`
/// without filters: then only `limit` messages are read). Every message read is left
/// parked, in order.
async fn picked(
    parking: &Parking,
    filters: &Filters,
    limit: usize,
    now: SystemTime,
) -> rabbitkit_core::Result<(Vec<ParkedMessage>, Option<usize>)> {
    if !filters.any() {
        return Ok((parking.peek(limit).await?, None));
    }
    let all = parking.peek(usize::MAX).await?;
    let matching: Vec<_> = all
        .into_iter()
        .filter(|m| filters.matches(m, now))
        .collect();
    let n = matching.len();
    Ok((matching.into_iter().take(limit).collect(), Some(n)))
}

async fn list(
    parking: &Parking,
    filters: &Filters,
    limit: usize,
    json: bool,
    io: &mut Io<'_>,
) -> Done {
    let count = parking.count().await?;
    let now = SystemTime::now();
    let (shown, matching) = picked(parking, filters, limit, now).await?;
    if json {
        let messages: Vec<_> = shown.iter().map(|m| summary_json(m, now)).collect();
        let mut doc = json!({ "queue": parking.queue(), "parked": count, "messages": messages });
        if let Some(n) = matching {
            doc["matching"] = json!(n);
        }
        writeln!(io.out, "{}", serde_json::to_string_pretty(&doc)?)?;
        return Ok(EXIT_OK);
    }
    match matching {
        Some(n) => writeln!(io.out, "{}: {count} parked, {n} matching", parking.queue())?,
        None => writeln!(io.out, "{}: {count} parked", parking.queue())?,
    }
    for m in &shown {
        writeln!(io.out, "{}", summary(m, now))?;
    }
    let more = matching
        .unwrap_or_else(|| usize::try_from(count).unwrap_or(usize::MAX))
        .saturating_sub(shown.len());
    if more > 0 {
        writeln!(io.out, "... {more} more not shown (--limit)")?;
    }
    Ok(EXIT_OK)
}

/// What `summary` says, as JSON, plus the parking time (RFC 3339) and the error message.
fn summary_json(m: &ParkedMessage, now: SystemTime) -> Value {
    json!({
        "message_id": m.message_id(),
        "reason": m.reason,
        "error_kind": m.error_kind,
        "error_message": m.error_message,
        "attempts": m.attempts,
        "handler": m.handler,
        "source_queue": m.source_queue,
        "original_exchange": m.original_exchange,
        "original_routing_key": m.original_routing_key,
        "first_failure_at": m.first_failure_at,
        "last_failure_at": m.last_failure_at,
        "parked_at": m.parked_at.map(rfc3339),
        "age_seconds": m.age(now).map(|a| a.as_secs()),
        "replayed": m.replayed,
        "body_size": m.body.len(),
    })
}

/// How `show` prints each message.
struct View {
    body_bytes: usize,
    json: bool,
}

/// One line: message id, reason and error kind, attempts, age, original routing key.
fn summary(m: &ParkedMessage, now: SystemTime) -> String {
    let dash = |v: Option<&str>| v.unwrap_or("-").to_owned();
    format!(
        "{}  reason={} kind={} attempts={} age={} routing-key={}",
        dash(m.message_id()),
        dash(m.reason.as_deref()),
        dash(m.error_kind.as_deref()),
        m.attempts.map_or("-".into(), |a| a.to_string()),
        m.age(now).map_or("-".into(), age),
        dash(m.original_routing_key.as_deref()),
    )
}

fn age(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

async fn show(
    parking: &Parking,
    filters: &Filters,
    limit: usize,
    view: View,
    io: &mut Io<'_>,
) -> Done {
    // With a filter every parked message is read; all of them are requeued by `peek`.
    let now = SystemTime::now();
    let (shown, _) = picked(parking, filters, limit, now).await?;
    let count = parking.count().await?;
    if let (Some(id), true) = (&filters.message_id, shown.is_empty()) {
        let also = if filters.error_kind.is_some()
            || filters.park_reason.is_some()
            || filters.older_than.is_some()
            || filters.newer_than.is_some()
        {
            " that the other filters pick"
        } else {
            ""
        };
        writeln!(
            io.err,
            "rabbitkit: no message with id {id:?}{also} among the {count} in {}",
            parking.queue()
        )?;
        return Ok(EXIT_FAILED);
    }
    if view.json {
        let messages: Vec<_> = shown
            .iter()
            .map(|m| message_json(m, now, view.body_bytes))
            .collect();
        let doc = json!({ "queue": parking.queue(), "parked": count, "messages": messages });
        writeln!(io.out, "{}", serde_json::to_string_pretty(&doc)?)?;
        return Ok(EXIT_OK);
    }
    let body_bytes = view.body_bytes;
    writeln!(
        io.out,
        "{}: {count} parked, {} shown",
        parking.queue(),
        shown.len()
    )?;
    for (i, m) in shown.iter().enumerate() {
        writeln!(io.out, "--- {} #{} ---", parking.queue(), i + 1)?;
        writeln!(io.out, "{}", summary(m, now))?;
        let p = &m.properties;
        let props = [
            ("message-id", p.message_id().as_ref().map(|v| v.to_string())),
            (
                "correlation-id",
                p.correlation_id().as_ref().map(|v| v.to_string()),
            ),
            (
                "content-type",
                p.content_type().as_ref().map(|v| v.to_string()),
            ),
            ("timestamp", p.timestamp().map(seconds_rfc3339)),
        ];
        for (name, value) in props {
            if let Some(v) = value {
                writeln!(io.out, "property {name}: {v}")?;
            }
        }
        if let Some(h) = p.headers() {
            for (k, v) in h.inner() {
                writeln!(io.out, "header {k}: {}", header_text(k.as_str(), v))?;
            }
        }
        let cut = m.body.len().min(body_bytes);
        let preview = String::from_utf8_lossy(&m.body[..cut]);
        write!(
            io.out,
            "body ({} bytes): {}",
            m.body.len(),
            preview.escape_debug()
        )?;
        if cut < m.body.len() {
            write!(io.out, " ...({} more bytes)", m.body.len() - cut)?;
        }
        writeln!(io.out)?;
    }
    Ok(EXIT_OK)
}

/// A whole parked message as JSON: the summary, properties, headers (times as RFC 3339)
/// and the first `body_bytes` of the body (lossy UTF-8).
fn message_json(m: &ParkedMessage, now: SystemTime, body_bytes: usize) -> Value {
    let mut doc = summary_json(m, now);
    let p = &m.properties;
    let headers: serde_json::Map<String, Value> = p
        .headers()
        .as_ref()
        .map(|h| {
            h.inner()
                .iter()
                .map(|(k, v)| (k.to_string(), header_json(k.as_str(), v)))
                .collect()
        })
        .unwrap_or_default();
    let cut = m.body.len().min(body_bytes);
    if let Value::Object(o) = &mut doc {
        o.insert(
            "properties".into(),
            json!({
                "correlation_id": p.correlation_id().as_ref().map(|v| v.to_string()),
                "content_type": p.content_type().as_ref().map(|v| v.to_string()),
                "timestamp": p.timestamp().map(seconds_rfc3339),
                "delivery_mode": p.delivery_mode(),
            }),
        );
        o.insert("headers".into(), Value::Object(headers));
        o.insert(
            "body".into(),
            Value::String(String::from_utf8_lossy(&m.body[..cut]).into_owned()),
        );
        o.insert("body_truncated".into(), Value::Bool(cut < m.body.len()));
    }
    doc
}

/// rabbitkit's failure times are epoch milliseconds: shown as RFC 3339, with the raw value.
fn is_time_header(name: &str) -> bool {
    name == crate::headers::FIRST_FAILURE_AT || name == crate::headers::LAST_FAILURE_AT
}

fn millis_rfc3339(ms: i64) -> Option<String> {
    let ms = u64::try_from(ms).ok()?;
    UNIX_EPOCH
        .checked_add(Duration::from_millis(ms))
        .map(rfc3339)
}

fn seconds_rfc3339(s: u64) -> String {
    UNIX_EPOCH
        .checked_add(Duration::from_secs(s))
        .map_or_else(|| s.to_string(), rfc3339)
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// A header on one line; a time header as RFC 3339 followed by its raw value.
fn header_text(name: &str, v: &AMQPValue) -> String {
    match crate::headers::int(v).filter(|_| is_time_header(name)) {
        Some(ms) => match millis_rfc3339(ms) {
            Some(t) => format!("{t} ({ms})"),
            None => ms.to_string(),
        },
        None => value(v),
    }
}

/// A header as JSON: strings, integers, booleans, arrays and tables as themselves; time
/// headers as RFC 3339 strings; anything else as its debug text.
fn header_json(name: &str, v: &AMQPValue) -> Value {
    if let Some(t) = crate::headers::int(v)
        .filter(|_| is_time_header(name))
        .and_then(millis_rfc3339)
    {
        return Value::String(t);
    }
    match v {
        AMQPValue::LongString(s) => Value::String(s.to_string()),
        AMQPValue::ShortString(s) => Value::String(s.as_str().to_owned()),
        AMQPValue::Boolean(b) => Value::Bool(*b),
        AMQPValue::Timestamp(s) => Value::String(seconds_rfc3339(*s)),
        AMQPValue::FieldArray(a) => {
            Value::Array(a.as_slice().iter().map(|v| header_json("", v)).collect())
        }
        AMQPValue::FieldTable(t) => Value::Object(
            t.inner()
                .iter()
                .map(|(k, v)| (k.to_string(), header_json(k.as_str(), v)))
                .collect(),
        ),
        other => match crate::headers::int(other) {
            Some(n) => Value::from(n),
            None => Value::String(format!("{other:?}")),
        },
    }
}

/// A header value on one line.
fn value(v: &AMQPValue) -> String {
    match v {
        AMQPValue::LongString(s) => s.to_string().escape_debug().to_string(),
        AMQPValue::ShortString(s) => s.as_str().escape_debug().to_string(),
        AMQPValue::FieldArray(a) => {
            let items: Vec<_> = a.as_slice().iter().map(value).collect();
            format!("[{}]", items.join(", "))
        }
        AMQPValue::FieldTable(t) => {
            let items: Vec<_> = t
                .inner()
                .iter()
                .map(|(k, v)| format!("{k}={}", value(v)))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
        other => match crate::headers::int(other) {
            Some(n) => n.to_string(),
            None => format!("{other:?}"),
        },
    }
}

async fn replay(parking: &Parking, args: ReplayArgs, io: &mut Io<'_>) -> Done {
    let mut options = ReplayOptions::new();
    if let Some(n) = args.limit {
        options = options.limit(n);
    }
    if let Some(r) = args.rate {
        options = options.rate(r.count, r.period);
    }
    let now = SystemTime::now();
    let (id, kind, reason, older) = (
        args.message_id,
        args.error_kind,
        args.park_reason,
        args.older_than,
    );
    let select = move |m: &ParkedMessage| {
        id.as_deref().is_none_or(|id| m.message_id() == Some(id))
            && kind
                .as_deref()
                .is_none_or(|k| m.error_kind.as_deref() == Some(k))
            && reason
                .as_deref()
                .is_none_or(|r| m.reason.as_deref() == Some(r))
            && older.is_none_or(|o| m.age(now).is_some_and(|a| a >= o))
    };
    if args.dry_run {
        return dry_run(parking, args.limit, args.json, select, io).await;
    }
    let report = parking.replay_with(options, select).await?;
    if args.json {
        let doc = json!({
            "work_queue": args.work_queue,
            "replayed": report.replayed,
            "duplicates": report.duplicates,
            "passed_over": report.passed_over,
            "other_queue": report.other_queue,
            "remaining": report.remaining,
            "stopped": report.stopped,
        });
        writeln!(io.out, "{}", serde_json::to_string_pretty(&doc)?)?;
        return Ok(if report.stopped.is_some() {
            EXIT_FAILED
        } else {
            EXIT_OK
        });
    }
    writeln!(
        io.out,
        "{} replayed into {}, {} duplicates removed, {} passed over, {} still parked",
        report.replayed, args.work_queue, report.duplicates, report.passed_over, report.remaining
    )?;
    if report.other_queue > 0 {
        writeln!(
            io.out,
            "{} left parked: parked from another work queue (see `parking show`)",
            report.other_queue
        )?;
    }
    match report.stopped {
        Some(why) => {
            writeln!(
                io.err,
                "rabbitkit: replay stopped, the message stays parked: {why}"
            )?;
            Ok(EXIT_FAILED)
        }
        None => Ok(EXIT_OK),
    }
}

/// `replay --dry-run`: every parked message is looked at (and left parked, in order); the
/// ones the filters pick, up to the limit, are listed. A message parked from another work
/// queue would stay parked in a real replay, so it is listed apart.
async fn dry_run(
    parking: &Parking,
    limit: Option<usize>,
    json: bool,
    mut select: impl FnMut(&ParkedMessage) -> bool,
    io: &mut Io<'_>,
) -> Done {
    let now = SystemTime::now();
    let parked = parking.peek(usize::MAX).await?;
    let total = parked.len();
    let (mut picked, mut other_queue) = (Vec::new(), 0usize);
    for m in &parked {
        if picked.len() >= limit.unwrap_or(usize::MAX) || !select(m) {
            continue;
        }
        if m.source_queue
            .as_deref()
            .is_some_and(|q| q != parking.work_queue())
        {
            other_queue += 1;
        } else {
            picked.push(m);
        }
    }
    if json {
        let messages: Vec<_> = picked.iter().map(|m| summary_json(m, now)).collect();
        let doc = json!({
            "dry_run": true,
            "queue": parking.queue(),
            "parked": total,
            "would_replay": picked.len(),
            "other_queue": other_queue,
            "messages": messages,
        });
        writeln!(io.out, "{}", serde_json::to_string_pretty(&doc)?)?;
        return Ok(EXIT_OK);
    }
    for m in &picked {
        writeln!(io.out, "would replay {}", summary(m, now))?;
    }
    writeln!(
        io.out,
        "dry run: {} of {total} parked would be replayed into {}, {other_queue} parked from \
         another work queue would stay; nothing was moved",
        picked.len(),
        parking.work_queue()
    )?;
    Ok(EXIT_OK)
}
