//! `rabbitkit parking list|show|replay|purge`: thin front ends of [`Parking`].

use std::time::{Duration, SystemTime};

use rabbitkit_core::amqp::AMQPValue;

use super::args::{ParkingCommand, ReplayArgs};
use super::{Done, EXIT_FAILED, EXIT_OK, EXIT_USAGE, Io};
use crate::{ConnectionConfig, ParkedMessage, Parking, ReplayOptions};

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
        ParkingCommand::List { limit, .. } => list(&parking, limit, io).await,
        ParkingCommand::Show {
            message_id,
            limit,
            body_bytes,
            ..
        } => show(&parking, message_id, limit, body_bytes, io).await,
        ParkingCommand::Replay(args) => replay(&parking, args, io).await,
        ParkingCommand::Purge { .. } => purge(&parking, io).await,
    };
    parking.close().await;
    done
}

async fn purge(parking: &Parking, io: &mut Io<'_>) -> Done {
    let n = parking.purge().await?;
    writeln!(io.out, "purged {n} from {}", parking.queue())?;
    Ok(EXIT_OK)
}

async fn list(parking: &Parking, limit: usize, io: &mut Io<'_>) -> Done {
    let count = parking.count().await?;
    writeln!(io.out, "{}: {count} parked", parking.queue())?;
    let now = SystemTime::now();
    let shown = parking.peek(limit).await?;
    for m in &shown {
        writeln!(io.out, "{}", summary(m, now))?;
    }
    let more = usize::try_from(count)
        .unwrap_or(usize::MAX)
        .saturating_sub(shown.len());
    if more > 0 {
        writeln!(io.out, "... {more} more not shown (--limit)")?;
    }
    Ok(EXIT_OK)
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
    message_id: Option<String>,
    limit: usize,
    body_bytes: usize,
    io: &mut Io<'_>,
) -> Done {
    // To find one id every parked message is read; all of them are requeued by `peek`.
    let wanted = if message_id.is_some() {
        usize::MAX
    } else {
        limit
    };
    let peeked = parking.peek(wanted).await?;
    let total = peeked.len();
    let shown: Vec<_> = peeked
        .into_iter()
        .filter(|m| message_id.is_none() || m.message_id() == message_id.as_deref())
        .take(limit)
        .collect();
    if let (Some(id), true) = (&message_id, shown.is_empty()) {
        writeln!(
            io.err,
            "rabbitkit: no message with id {id:?} among the {total} in {}",
            parking.queue()
        )?;
        return Ok(EXIT_FAILED);
    }
    let count = parking.count().await?;
    writeln!(
        io.out,
        "{}: {count} parked, {} shown",
        parking.queue(),
        shown.len()
    )?;
    let now = SystemTime::now();
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
            ("timestamp", p.timestamp().map(|v| v.to_string())),
        ];
        for (name, value) in props {
            if let Some(v) = value {
                writeln!(io.out, "property {name}: {v}")?;
            }
        }
        if let Some(h) = p.headers() {
            for (k, v) in h.inner() {
                writeln!(io.out, "header {k}: {}", value(v))?;
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
    let (id, kind, older) = (args.message_id, args.error_kind, args.older_than);
    let select = move |m: &ParkedMessage| {
        id.as_deref().is_none_or(|id| m.message_id() == Some(id))
            && kind
                .as_deref()
                .is_none_or(|k| m.error_kind.as_deref() == Some(k))
            && older.is_none_or(|o| m.age(now).is_some_and(|a| a >= o))
    };
    let report = parking.replay_with(options, select).await?;
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
