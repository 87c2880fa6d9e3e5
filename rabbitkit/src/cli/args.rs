//! The command line: commands, flags and the parsers of their values.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// Operator tooling for rabbitkit: parking queues, topology, confirmed publishes.
#[derive(Debug, Parser)]
#[command(name = "rabbitkit", version)]
pub(crate) struct Cli {
    /// Broker URL, `amqp://user:pass@host:port/vhost`. The password is never printed.
    #[arg(long, env = "RABBITKIT_URL", global = true, hide_env_values = true)]
    pub(crate) url: Option<String>,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Inspect, replay and purge the parking queue of a work queue (`<work-queue>.parking`).
    #[command(subcommand)]
    Parking(ParkingCommand),
    /// Check (passive) or declare the topology of a work queue.
    #[command(subcommand)]
    Topology(TopologyCommand),
    /// Publish one message through the confirmed publisher; exits 0 only when confirmed.
    Publish(PublishArgs),
}

#[derive(Debug, Subcommand)]
pub(crate) enum ParkingCommand {
    /// Count parked messages and summarise each on one line (removes nothing).
    List {
        /// The work queue whose parking queue to read.
        work_queue: String,
        /// Most messages to summarise.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Show headers and a body preview of parked messages (removes nothing).
    Show {
        /// The work queue whose parking queue to read.
        work_queue: String,
        /// Only the message with this message id (an error when none has it).
        #[arg(long)]
        message_id: Option<String>,
        /// Most messages to show.
        #[arg(long, default_value_t = 10)]
        limit: usize,
        /// Bytes of each body to show.
        #[arg(long, default_value_t = 512)]
        body_bytes: usize,
    },
    /// Move parked messages back to their work queue (confirmed copy first, then the ack).
    Replay(ReplayArgs),
    /// Delete every parked message. Refused without --yes.
    Purge {
        /// The work queue whose parking queue to purge.
        work_queue: String,
        /// Confirm that the parked messages are to be deleted for good.
        #[arg(long)]
        yes: bool,
    },
}

#[derive(Debug, Args)]
pub(crate) struct ReplayArgs {
    /// The work queue to replay into (its parking queue is `<work-queue>.parking`).
    pub(crate) work_queue: String,
    /// Most messages to replay.
    #[arg(long)]
    pub(crate) limit: Option<usize>,
    /// Only the message with this message id.
    #[arg(long)]
    pub(crate) message_id: Option<String>,
    /// Only messages whose last error kind is this (`error`, `timeout`, `decode`, ...).
    #[arg(long)]
    pub(crate) error_kind: Option<String>,
    /// Only messages parked at least this long ago (`10m`, `2h`); messages of unknown age
    /// stay parked.
    #[arg(long, value_parser = duration)]
    pub(crate) older_than: Option<Duration>,
    /// Most copies per second, minute or hour: `50/s`, `100/m`, `10/h` (`50` is per second).
    #[arg(long, value_parser = rate)]
    pub(crate) rate: Option<Rate>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum TopologyCommand {
    /// Look for every queue and exchange without creating anything; exits 1 on any
    /// missing or different object.
    Check(TopologyArgs),
    /// Declare every queue, exchange and binding (idempotent).
    Apply(TopologyArgs),
}

#[derive(Debug, Args)]
pub(crate) struct TopologyArgs {
    /// The work queue.
    pub(crate) work_queue: String,
    /// A quorum work queue (default: classic).
    #[arg(long)]
    pub(crate) quorum: bool,
    /// Retry delays, one tier queue each: `1s,10s,1m`.
    #[arg(long, value_delimiter = ',', value_parser = duration)]
    pub(crate) tiers: Vec<Duration>,
    /// A binding `EXCHANGE=ROUTING_KEY` (repeatable).
    #[arg(long = "bind", value_parser = pair)]
    pub(crate) bindings: Vec<(String, String)>,
    /// Kind of the bound exchanges: topic, direct, fanout, headers.
    #[arg(long, default_value = "topic")]
    pub(crate) exchange_kind: String,
    /// Quorum only: the broker-side delivery limit.
    #[arg(long, default_value_t = 20)]
    pub(crate) delivery_limit: u32,
}

#[derive(Debug, Args)]
pub(crate) struct PublishArgs {
    /// The exchange (`""` is the default exchange).
    #[arg(long)]
    pub(crate) exchange: String,
    /// The routing key.
    #[arg(long)]
    pub(crate) routing_key: String,
    /// The body (default: empty).
    #[arg(long, conflicts_with = "file")]
    pub(crate) body: Option<String>,
    /// Read the body from this file.
    #[arg(long)]
    pub(crate) file: Option<PathBuf>,
    /// A string header `NAME=VALUE` (repeatable).
    #[arg(long = "header", value_parser = pair)]
    pub(crate) headers: Vec<(String, String)>,
    /// The body is JSON: checked before sending, sent as `application/json`.
    #[arg(long)]
    pub(crate) json: bool,
    /// The message id (default: a generated one, printed).
    #[arg(long)]
    pub(crate) message_id: Option<String>,
}

/// `count` copies per `period`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rate {
    pub(crate) count: u32,
    pub(crate) period: Duration,
}

fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (try 30s, 10m, 2h)"))
}

fn rate(s: &str) -> Result<Rate, String> {
    let (n, per) = s.split_once('/').unwrap_or((s, "s"));
    let count: u32 = n
        .trim()
        .parse()
        .map_err(|_| format!("{n:?} is not a whole number (try 50/s)"))?;
    let period = match per.trim() {
        "s" | "sec" | "second" => Duration::from_secs(1),
        "m" | "min" | "minute" => Duration::from_secs(60),
        "h" | "hour" => Duration::from_secs(3600),
        other => return Err(format!("unknown period {other:?}: use /s, /m or /h")),
    };
    if count == 0 {
        return Err("a rate of 0 would replay nothing".into());
    }
    Ok(Rate { count, period })
}

fn pair(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("{s:?} is not NAME=VALUE"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_per_second_minute_and_hour() {
        let r = |count, secs| {
            Ok(Rate {
                count,
                period: Duration::from_secs(secs),
            })
        };
        assert_eq!(rate("50/s"), r(50, 1));
        assert_eq!(rate("50"), r(50, 1));
        assert_eq!(rate("100/m"), r(100, 60));
        assert_eq!(rate("10/h"), r(10, 3600));
        assert!(rate("0/s").is_err());
        assert!(rate("fast").is_err());
        assert!(rate("5/d").is_err());
    }

    #[test]
    fn pairs_split_at_the_first_equals_sign() {
        assert_eq!(pair("shop=order.*"), Ok(("shop".into(), "order.*".into())));
        assert_eq!(pair("a=b=c"), Ok(("a".into(), "b=c".into())));
        assert!(pair("nokey").is_err());
    }

    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
