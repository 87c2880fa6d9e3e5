//! A worker from a config file: the binary a team copies. Handlers are registered by name;
//! `worker.toml` says which queue each one consumes and how it is settled.
//!
//! - `greet` succeeds at once;
//! - `flaky` fails transiently on its first two attempts, then succeeds from a retry tier;
//! - `orders` decodes JSON: a body that is not an order is parked at once.
//!
//! Runs until Ctrl-C or SIGTERM, then prints a settlement summary. `--check` validates
//! the file, then the topology against the broker without declaring anything, and exits
//! non-zero with a report when something is missing or differs. `--self-test` (what
//! `scripts/examples` runs) publishes a few messages, checks how each was settled and the
//! topology, then stops.
//!
//! Run with:
//!
//! ```sh
//! scripts/broker start --version 3
//! export RABBITKIT_URL=$(scripts/broker url --version 3)   # overrides connection.url
//! cargo run -p rabbitkit-examples --bin config_worker -- --config examples/worker.toml
//! cargo run -p rabbitkit-examples --bin config_worker -- --config examples/worker.toml --check
//! ```

use std::process::ExitCode;
use std::time::Duration;

use rabbitkit::config::{Handlers, LogFormat, Observability, WorkerConfig};
use rabbitkit::kind::Kinded;
use rabbitkit::prelude::*;
use rabbitkit::{Parking, WorkerHandle, WorkerReport};
use rabbitkit_examples::{check, wait_for};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct Order {
    id: u32,
}

async fn greet(Body(body): Body) -> Result<(), BoxError> {
    println!("greeting: {}", String::from_utf8_lossy(&body));
    Ok(())
}

/// A downstream that is not ready yet: attempts 1 and 2 fail and are retried.
async fn flaky(attempt: Attempt) -> Result<(), BoxError> {
    if attempt.number < 3 {
        return Err(format!("downstream busy (attempt {})", attempt.number).into());
    }
    println!("job done on attempt {}", attempt.number);
    Ok(())
}

/// Order 0 names no order (kind `validation`, parked at once by `worker.toml`); orders
/// from 1 000 000 up are not stocked yet (kind `inventory`, retried up to 5 times).
async fn orders(Json(order): Json<Order>) -> Result<(), BoxError> {
    if order.id == 0 {
        return Err(Kinded::new("validation", "order 0 names no order").into());
    }
    if order.id >= 1_000_000 {
        return Err(Kinded::new("inventory", "not stocked yet").into());
    }
    println!("order {}", order.id);
    Ok(())
}

/// The names `worker.toml` refers to with `handler = "..."`.
fn handlers() -> Handlers {
    Handlers::new()
        .handler("greet", greet)
        .handler("flaky", flaky)
        // The kinds its errors carry ad hoc, which `worker.toml` gives policies: a policy
        // for a kind nothing produces is refused at start.
        .subscriber(
            "orders",
            Subscriber::new("", orders).kinds(["validation", "inventory"]),
        )
}

struct Args {
    config: String,
    check: bool,
    self_test: bool,
}

const USAGE: &str = "usage: config_worker [--config PATH] [--check] [--self-test]";

fn parse_args() -> Result<Args, BoxError> {
    let mut args = Args {
        config: "examples/worker.toml".into(),
        check: false,
        self_test: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--config" => args.config = it.next().ok_or(USAGE)?,
            "--check" => args.check = true,
            "--self-test" => args.self_test = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}; {USAGE}").into()),
        }
    }
    Ok(args)
}

fn init_logging(o: Observability) {
    let fmt = tracing_subscriber::fmt()
        .with_max_level(o.log_level.as_tracing())
        .with_target(false)
        // Colour only on a terminal: scripts/examples writes this to a log file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match o.log_format {
        LogFormat::Full => fmt.init(),
        LogFormat::Compact => fmt.compact().init(),
        LogFormat::Pretty => fmt.pretty().init(),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("config_worker: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<ExitCode, BoxError> {
    let args = parse_args()?;
    let config = WorkerConfig::load(&args.config)?;
    init_logging(config.observability);
    let handlers = handlers();
    if args.check {
        let report = rabbitkit::config::check(&config, &handlers).await?;
        println!("{}: {report}", args.config);
        return Ok(if report.is_ok() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    let worker = rabbitkit::worker::from_config(&config, &handlers)?
        .start()
        .await?;
    let outcome = if args.self_test {
        self_test(&worker, &config, &handlers).await
    } else {
        // SIGINT or SIGTERM (what an orchestrator sends): drain, then print the summary.
        rabbitkit::shutdown_signal().await;
        Ok(())
    };
    let report = worker.shutdown().await;
    print_summary(&report);
    outcome.map(|()| ExitCode::SUCCESS)
}

fn print_summary(report: &WorkerReport) {
    println!("settlement summary:");
    let mut names: Vec<_> = report.subscribers.keys().collect();
    names.sort();
    for name in names {
        let s = &report.subscribers[name];
        println!(
            "  {name:<26} consumed {:>4}  acked {:>4}  retried {:>4}  parked {:>4}  requeued {:>4}  \
             rejected {:>4}  copies not confirmed {:>4}",
            s.consumed, s.acked, s.retried, s.parked, s.requeued, s.rejected, s.settlement_failures
        );
    }
}

/// Publishes to each subscriber of the reference config and checks the settlements.
async fn self_test(
    worker: &WorkerHandle,
    config: &WorkerConfig,
    handlers: &Handlers,
) -> Result<(), BoxError> {
    let report = rabbitkit::config::check(config, handlers).await?;
    println!("{report}");
    check(report.is_ok(), "the declared topology passes --check")?;

    let p = worker.publisher();
    for i in 0..3 {
        let m = Envelope::new(
            "example.config",
            "greeting.new",
            format!("hello {i}").into_bytes(),
        );
        check(p.publish(m).await?.is_confirmed(), "greeting published")?;
    }
    for _ in 0..2 {
        let m = Envelope::new("example.config.direct", "job", &b"job"[..]);
        check(p.publish(m).await?.is_confirmed(), "job published")?;
    }
    let good = Envelope::json("example.config", "order.created", &Order { id: 7 })?;
    let poison = Envelope::new("example.config", "order.paid", &b"{not json"[..]);
    for m in [good, poison] {
        check(p.publish(m).await?.is_confirmed(), "order published")?;
    }

    let wait = Duration::from_secs(30);
    wait_for(worker, "example.config.greetings", wait, |s| s.acked >= 3).await?;
    // Two jobs, each failing twice: four retry copies, six acks.
    let jobs = wait_for(worker, "flaky-jobs", wait, |s| s.acked >= 6).await?;
    check(
        jobs.retried >= 4,
        "each job was retried twice, then succeeded",
    )?;
    let orders = wait_for(worker, "example.config.orders", wait, |s| {
        s.acked >= 2 && s.parked >= 1
    })
    .await?;
    check(orders.parked >= 1, "the poison order was parked")?;
    // Leave the broker as it was: the parked poison order is evidence of this run only.
    let parking = Parking::new(
        config.connection.to_connection_config(),
        "example.config.orders",
    )?;
    let purged = parking.purge().await?;
    parking.close().await;
    check(purged >= 1, "the parked order was purged")?;
    Ok(())
}
