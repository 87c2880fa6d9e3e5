//! The command line: commands, flags and the parsers of their values.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// Operator tooling for rabbitkit: parking queues, topology, confirmed publishes.
#[derive(Debug, Parser)]
#[command(name = "rabbitkit", version)]
pub(crate) struct Cli {
    /// Broker URL, `amqp://user:pass@host:port/vhost`, or several nodes comma-separated.
    /// The password is never printed.
    #[arg(long, env = "RABBITKIT_URL", global = true, hide_env_values = true)]
    pub(crate) url: Option<String>,
    #[command(flatten)]
    pub(crate) tls: TlsArgs,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// TLS settings of `amqps://` URLs (the binary built with rabbitkit's `tls` feature); the
/// variables are those a worker's config file takes too.
#[derive(Debug, Args)]
pub(crate) struct TlsArgs {
    /// PEM file of CA certificates trusted to sign the broker's certificate.
    #[arg(long, env = "RABBITKIT_TLS_CA_FILE", global = true)]
    pub(crate) tls_ca_file: Option<PathBuf>,
    /// PEM file of the client certificate (needs --tls-key-file).
    #[arg(long, env = "RABBITKIT_TLS_CERT_FILE", global = true)]
    pub(crate) tls_cert_file: Option<PathBuf>,
    /// PEM file of the client certificate's private key.
    #[arg(long, env = "RABBITKIT_TLS_KEY_FILE", global = true)]
    pub(crate) tls_key_file: Option<PathBuf>,
    /// The name the broker's certificate is checked against (default: the URL's host).
    #[arg(long, env = "RABBITKIT_TLS_SERVER_NAME", global = true)]
    pub(crate) tls_server_name: Option<String>,
}

impl TlsArgs {
    /// The settings given, if any.
    pub(crate) fn config(self) -> Option<crate::TlsConfig> {
        let given = self.tls_ca_file.is_some()
            || self.tls_cert_file.is_some()
            || self.tls_key_file.is_some()
            || self.tls_server_name.is_some();
        given.then_some(crate::TlsConfig {
            ca_file: self.tls_ca_file,
            cert_file: self.tls_cert_file,
            key_file: self.tls_key_file,
            server_name: self.tls_server_name,
        })
    }
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
        /// Which messages: the filters of `replay`.
        #[command(flatten)]
        filters: Filters,
        /// Most messages to summarise.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// One JSON document on stdout instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Show headers and a body preview of parked messages (removes nothing).
    Show {
        /// The work queue whose parking queue to read.
        work_queue: String,
        /// Which messages: the filters of `replay` (with `--message-id`, an error when
        /// none has it).
        #[command(flatten)]
        filters: Filters,
        /// Most messages to show.
        #[arg(long, default_value_t = 10)]
        limit: usize,
        /// Bytes of each body to show.
        #[arg(long, default_value_t = 512)]
        body_bytes: usize,
        /// One JSON document on stdout instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Move parked messages back to their work queue (confirmed copy first, then the ack).
    Replay(ReplayArgs),
    /// Replace a classic parking queue (earlier releases) by the quorum one, moving every
    /// parked message unchanged through `<work-queue>.parking.migrating`, each acked only
    /// after its copy is confirmed; exits 1 unless the parking queue ends quorum. Stop the
    /// workers of earlier releases first.
    Migrate {
        /// The work queue whose parking queue to migrate.
        work_queue: String,
    },
    /// Delete every parked message. Refused without --yes.
    Purge {
        /// The work queue whose parking queue to purge.
        work_queue: String,
        /// Confirm that the parked messages are to be deleted for good.
        #[arg(long)]
        yes: bool,
    },
}

/// The filters `parking list` and `show` share with `replay`: a message is listed when it
/// passes every filter given.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct Filters {
    /// Only the message with this message id.
    #[arg(long)]
    pub(crate) message_id: Option<String>,
    /// Only messages whose last error kind is this (`error`, `timeout`, `decode`, ...).
    #[arg(long)]
    pub(crate) error_kind: Option<String>,
    /// Only messages parked for this reason: rabbitkit's (`max-attempts`, `permanent`,
    /// `decode`, ...) or the broker's dead-letter reason (`rejected`, `delivery_limit`, ...).
    #[arg(long, visible_alias = "reason")]
    pub(crate) park_reason: Option<String>,
    /// Only messages parked at least this long ago (`10m`, `2h`); messages of unknown age
    /// are left out.
    #[arg(long, value_parser = duration)]
    pub(crate) older_than: Option<Duration>,
    /// Only messages parked less than this long ago (`10m`, `2h`); messages of unknown age
    /// are left out.
    #[arg(long, value_parser = duration, visible_alias = "since")]
    pub(crate) newer_than: Option<Duration>,
}

impl Filters {
    /// Whether any filter is given.
    pub(crate) fn any(&self) -> bool {
        self.message_id.is_some()
            || self.error_kind.is_some()
            || self.park_reason.is_some()
            || self.older_than.is_some()
            || self.newer_than.is_some()
    }
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
    /// Only messages parked for this reason: rabbitkit's (`max-attempts`, `permanent`,
    /// `decode`, ...) or the broker's dead-letter reason (`rejected`, `delivery_limit`, ...).
    #[arg(long, visible_alias = "reason")]
    pub(crate) park_reason: Option<String>,
    /// List what would be replayed, and replay nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// One JSON document on stdout instead of text.
    #[arg(long)]
    pub(crate) json: bool,
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
    /// Move every message of the classic delay tiers (`{queue}.retry.{delay}`) into the
    /// quorum tiers of the same delays (`{queue}.delay.{delay}`), each acked only after its
    /// copy is confirmed, then delete the emptied classic tiers; exits 1 unless every
    /// classic tier is gone.
    Migrate(MigrateArgs),
    /// List the delay tier queues (`{queue}.delay.{d}`, `{queue}.retry.{d}`) of the config
    /// file's work queues that no subscriber uses any more; with --yes, delete those that
    /// are empty (a queue holding a message is kept).
    Prune(PruneArgs),
}

#[derive(Debug, Args)]
pub(crate) struct PruneArgs {
    /// Only this work queue's tiers (default: every subscriber's).
    pub(crate) work_queue: Option<String>,
    /// The worker config file: its `[[subscribers]]` say which tiers are in use. A
    /// subscriber whose `[subscribers.retry]` is not in the file is not judged.
    #[arg(long)]
    pub(crate) config: PathBuf,
    /// The management API that lists the vhost's queues, `https://[user:pass@]host:15671`
    /// (needs the `tls` feature) or `http://[user:pass@]host:15672` (default user and
    /// password: the broker URL's). Plain http to a host that is not loopback is refused
    /// unless --allow-plain-http.
    #[arg(long, env = "RABBITKIT_MGMT_URL", hide_env_values = true)]
    pub(crate) mgmt_url: String,
    /// Send the management API's credentials over plain http to a host that is not
    /// loopback (they cross the network in clear).
    #[arg(long)]
    pub(crate) allow_plain_http: bool,
    /// Delete the unused tiers that are empty (`queue.delete` with if-empty).
    #[arg(long)]
    pub(crate) yes: bool,
    /// One JSON document on stdout instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct MigrateArgs {
    /// The work queue (it must exist).
    pub(crate) work_queue: String,
    /// The retry delays of the schedule: `1s,10s,1m`.
    #[arg(long, value_delimiter = ',', value_parser = duration, required = true)]
    pub(crate) tiers: Vec<Duration>,
    /// Delays dropped from the schedule whose classic tiers may still hold copies.
    #[arg(long, value_delimiter = ',', value_parser = duration)]
    pub(crate) old_tiers: Vec<Duration>,
}

#[derive(Debug, Args)]
pub(crate) struct TopologyArgs {
    /// The work queue. With `--config`, only that subscriber's queue (default: all of them).
    #[arg(required_unless_present = "config")]
    pub(crate) work_queue: Option<String>,
    /// Read the topology from a worker config file (its `[[subscribers]]`) instead of the
    /// flags below; keys the file leaves out take rabbitkit's defaults.
    #[arg(long, conflicts_with_all = ["quorum", "tiers", "bindings", "exchange_kind", "delivery_limit", "classic_tiers"])]
    pub(crate) config: Option<PathBuf>,
    /// One JSON document on stdout instead of text (`check` only).
    #[arg(long)]
    pub(crate) json: bool,
    /// A quorum work queue (default: classic).
    #[arg(long)]
    pub(crate) quorum: bool,
    /// Retry delays, one tier queue each: `1s,10s,1m`.
    #[arg(long, value_delimiter = ',', value_parser = duration)]
    pub(crate) tiers: Vec<Duration>,
    /// Classic delay tiers (`{queue}.retry.{delay}`; at-most-once dead-lettering) instead of
    /// quorum ones (`{queue}.delay.{delay}`).
    #[arg(long)]
    pub(crate) classic_tiers: bool,
    /// A binding `EXCHANGE=ROUTING_KEY` (repeatable).
    #[arg(long = "bind", value_parser = pair)]
    pub(crate) bindings: Vec<(String, String)>,
    /// Kind of the bound exchanges: topic, direct, fanout, headers (default topic).
    #[arg(long)]
    pub(crate) exchange_kind: Option<String>,
    /// Quorum only: the broker-side delivery limit (default 20). Refused without
    /// `--quorum`: a classic queue has no delivery limit.
    #[arg(long, requires = "quorum")]
    pub(crate) delivery_limit: Option<u32>,
    /// `apply` only: the work queue exists and someone else declared it. It is checked
    /// (it must have rabbitkit's dead-letter target, as an argument or by a policy; when it
    /// has not, the `rabbitmqctl set_policy` command that gives it is printed and nothing
    /// is declared), then only rabbitkit's own objects are declared beside it: exchanges,
    /// bindings, retry exchange, delay tiers, parking queue.
    #[arg(long)]
    pub(crate) adopt: bool,
    /// The management API, `https://[user:pass@]host:15671` (needs the `tls` feature) or
    /// `http://[user:pass@]host:15672` (default user and password: the broker URL's): with
    /// `--adopt`, read to see the work queue's effective policy, so that a dead-letter
    /// exchange set by a policy counts. Plain http to a host that is not loopback is
    /// refused unless --allow-plain-http.
    #[arg(long, env = "RABBITKIT_MGMT_URL", hide_env_values = true)]
    pub(crate) mgmt_url: Option<String>,
    /// Send the management API's credentials over plain http to a host that is not
    /// loopback (they cross the network in clear).
    #[arg(long, requires = "mgmt_url")]
    pub(crate) allow_plain_http: bool,
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
#[allow(clippy::expect_used)]
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
    fn a_mistyped_command_or_flag_gets_a_suggestion() {
        let err = Cli::try_parse_from(["rabbitkit", "parking", "lst", "orders"])
            .expect_err("no such command")
            .render()
            .to_string();
        assert!(err.contains("'list'"), "{err}");
        let err = Cli::try_parse_from(["rabbitkit", "parking", "replay", "q", "--dry-rn"])
            .expect_err("no such flag")
            .render()
            .to_string();
        assert!(err.contains("--dry-run"), "{err}");
    }

    #[test]
    fn a_delivery_limit_needs_a_quorum_queue() {
        let parse = |extra: &[&str]| {
            let mut argv = vec!["rabbitkit", "topology", "apply", "orders"];
            argv.extend_from_slice(extra);
            Cli::try_parse_from(argv)
        };
        let err = parse(&["--delivery-limit", "5"])
            .expect_err("a classic queue has no delivery limit")
            .render()
            .to_string();
        assert!(err.contains("--quorum"), "{err}");
        assert!(parse(&["--delivery-limit", "5", "--quorum"]).is_ok());
    }

    #[test]
    fn topology_takes_a_work_queue_or_a_config_file() {
        assert!(Cli::try_parse_from(["rabbitkit", "topology", "check"]).is_err());
        assert!(Cli::try_parse_from(["rabbitkit", "topology", "check", "orders"]).is_ok());
        assert!(
            Cli::try_parse_from(["rabbitkit", "topology", "check", "--config", "w.toml"]).is_ok()
        );
        assert!(
            Cli::try_parse_from([
                "rabbitkit",
                "topology",
                "apply",
                "--config",
                "w.toml",
                "--tiers",
                "1s"
            ])
            .is_err()
        );
    }

    #[test]
    fn tls_flags_make_tls_settings_only_when_given() {
        let cli = Cli::try_parse_from([
            "rabbitkit",
            "parking",
            "list",
            "orders",
            "--tls-ca-file",
            "ca.pem",
            "--tls-server-name",
            "rabbit.test",
        ])
        .expect("parses");
        let tls = cli.tls.config().expect("settings");
        assert_eq!(tls.ca_file, Some(PathBuf::from("ca.pem")));
        assert_eq!(tls.server_name.as_deref(), Some("rabbit.test"));
        assert_eq!(tls.cert_file, None);
        let cli = Cli::try_parse_from(["rabbitkit", "parking", "list", "orders"]).expect("parses");
        if std::env::vars().all(|(k, _)| !k.starts_with("RABBITKIT_TLS_")) {
            assert!(cli.tls.config().is_none());
        }
    }

    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
