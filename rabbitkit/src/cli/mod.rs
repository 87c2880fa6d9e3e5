//! The `rabbitkit` operator command line (feature `cli`), callable in-process.
//!
//! ```text
//! rabbitkit parking list|show|replay|purge|migrate <work-queue> ...
//! rabbitkit topology check|apply <work-queue> [--quorum] [--tiers 1s,10s] [--classic-tiers] [--bind EX=KEY]...
//! rabbitkit topology apply <work-queue> --adopt [--mgmt-url URL [--allow-plain-http]] ...
//! rabbitkit topology migrate <work-queue> --tiers 1s,10s [--old-tiers 5m]
//! rabbitkit topology prune [<work-queue>] --config worker.toml --mgmt-url URL [--allow-plain-http] [--yes] [--json]
//! rabbitkit publish --exchange X --routing-key K [--body STR | --file PATH] [--header k=v]...
//! ```
//!
//! The broker comes from `--url` or `RABBITKIT_URL`; its password is never printed. Every
//! command exits [`EXIT_OK`] only when it did its job, [`EXIT_FAILED`] when it did not (a
//! broker error, a missing queue, a copy or publish that was not confirmed, a topology
//! that differs), and [`EXIT_USAGE`] on bad arguments or a refused purge. The commands
//! are thin: the work is done by [`Parking`](crate::Parking),
//! [`Topology`](crate::Topology) and [`Publisher`](crate::Publisher). The guide is
//! `docs/OPERATOR-CLI.md`.
//!
//! This module holds logic although the facade otherwise holds none: the binary has to
//! live in the facade, and a library entry point lets the tests run every command
//! in-process and read what it printed.

mod args;
mod parking;
mod publish;
mod topology;

use std::ffi::OsString;
use std::io::Write;

use clap::Parser;
use clap::error::ErrorKind;

use crate::{BoxError, ConnectionConfig};
use args::{Cli, Command};

/// The command did its job.
pub const EXIT_OK: u8 = 0;
/// The command did not do its job (or not all of it); the reason is on stderr.
pub const EXIT_FAILED: u8 = 1;
/// Bad arguments, no or a malformed broker URL, or a destructive command without its
/// confirmation flag.
pub const EXIT_USAGE: u8 = 2;

/// Where a command writes: results to `out`, problems to `err`.
pub(crate) struct Io<'a> {
    pub(crate) out: &'a mut dyn Write,
    pub(crate) err: &'a mut dyn Write,
}

/// What a command ends with when nothing failed outright.
pub(crate) type Done = Result<u8, BoxError>;

/// Runs the command line `args` (the first item is the program name), writing results
/// to `out` and problems to `err`; returns the exit code.
///
/// ```no_run
/// # async fn run() {
/// let (mut out, mut err) = (Vec::new(), Vec::new());
/// let args = ["rabbitkit", "parking", "list", "orders", "--url", "amqp://guest:guest@127.0.0.1:5672/%2f"];
/// let code = rabbitkit::cli::run(args, &mut out, &mut err).await;
/// assert_eq!(code, rabbitkit::cli::EXIT_OK, "{}", String::from_utf8_lossy(&err));
/// # }
/// ```
pub async fn run<I, T>(args: I, out: &mut dyn Write, err: &mut dyn Write) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let text = e.render().to_string();
            return match e.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
                    let _ = out.write_all(text.as_bytes());
                    EXIT_OK
                }
                _ => {
                    let _ = err.write_all(text.as_bytes());
                    EXIT_USAGE
                }
            };
        }
    };
    let Some(url) = cli.url.clone() else {
        let _ = writeln!(
            err,
            "rabbitkit: no broker URL: pass --url or set RABBITKIT_URL"
        );
        return EXIT_USAGE;
    };
    let mut connection = ConnectionConfig::nodes(rabbitkit_core::connection::split_url_list(&url));
    connection.tls = cli.tls.config();
    if let Err(e) = connection.validate() {
        // The error never holds the URL (it may hold a password).
        let _ = writeln!(err, "rabbitkit: {e}");
        return EXIT_USAGE;
    }
    let mut io = Io { out, err };
    let done = match cli.command {
        Command::Parking(cmd) => parking::run(&connection, cmd, &mut io).await,
        Command::Topology(cmd) => topology::run(&connection, cmd, &mut io).await,
        Command::Publish(cmd) => publish::run(&connection, cmd, &mut io).await,
    };
    match done {
        Ok(code) => code,
        Err(e) => {
            let text = connection.scrub(&error_chain(&*e));
            let _ = writeln!(
                io.err,
                "rabbitkit: {text} (broker {})",
                connection.redacted_url()
            );
            EXIT_FAILED
        }
    }
}

fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let line = s.to_string();
        if !text.contains(&line) {
            text.push_str(": ");
            text.push_str(&line);
        }
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printed_errors_never_hold_the_password() {
        let url = "amqp://app:s3cret@host:5672/%2f";
        let connection = ConnectionConfig::new(url);
        let text = connection.scrub(&format!("cannot reach {url}; auth s3cret refused"));
        assert!(!text.contains("s3cret"), "{text}");
        assert!(text.contains("amqp://app:***@host:5672/%2f"), "{text}");
    }
}
