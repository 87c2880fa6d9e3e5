//! `rabbitkit topology check|apply`: [`Topology::check`] and [`Topology::declare`], for one
//! work queue described by flags or for the subscribers of a worker config file; and
//! `rabbitkit topology migrate`: [`Topology::migrate_tiers`]; and `rabbitkit topology
//! prune`: [`unused_tiers`] of the queues the management API lists, [`delete_if_empty`].

use rabbitkit_core::retry::is_tier_of;
use rabbitkit_core::retry::tier_label;
use rabbitkit_core::topology::{
    Binding, ManagementUrl, MigratedTier, ObjectState, PruneOutcome, TopologyReport,
    delete_if_empty, unused_tiers,
};
use serde_json::json;

use super::args::{MigrateArgs, PruneArgs, TopologyArgs, TopologyCommand};
use super::{Done, EXIT_FAILED, EXIT_OK, EXIT_USAGE, Io};
use crate::config::WorkerConfig;
use crate::{ConnectionConfig, QueueType, Topology};

pub(crate) async fn run(
    connection: &ConnectionConfig,
    cmd: TopologyCommand,
    io: &mut Io<'_>,
) -> Done {
    let (check, args) = match cmd {
        TopologyCommand::Check(args) => (true, args),
        TopologyCommand::Apply(args) => (false, args),
        TopologyCommand::Migrate(args) => return migrate(connection, args, io).await,
        TopologyCommand::Prune(args) => return prune(connection, args, io).await,
    };
    let json = args.json;
    let adopt = args.adopt;
    if adopt && check {
        writeln!(io.err, "rabbitkit: --adopt is for `topology apply`")?;
        return Ok(EXIT_USAGE);
    }
    let mgmt_url = args.mgmt_url.clone().map(|url| {
        let url = ManagementUrl::new(url);
        if args.allow_plain_http {
            url.allow_plain_http()
        } else {
            url
        }
    });
    let topologies = match topologies(args) {
        Ok(t) if t.is_empty() => {
            writeln!(
                io.err,
                "rabbitkit: no subscriber of that queue in the config"
            )?;
            return Ok(EXIT_USAGE);
        }
        Ok(t) => t,
        Err(e) => {
            writeln!(io.err, "rabbitkit: {e}")?;
            return Ok(EXIT_USAGE);
        }
    };
    if adopt {
        return adopt_all(connection, topologies, mgmt_url, io).await;
    }
    if !check {
        for topology in &topologies {
            topology.declare(connection).await?;
            writeln!(
                io.out,
                "declared topology of {:?}: work queue, {}, {} retry tiers, {} bindings",
                topology.queue,
                topology.parking_queue(),
                topology.tiers.len(),
                topology.bindings.len()
            )?;
        }
        return Ok(EXIT_OK);
    }
    let mut reports = Vec::with_capacity(topologies.len());
    for topology in &topologies {
        reports.push(topology.check(connection).await?);
    }
    let problems: usize = reports.iter().map(|r| r.problems().count()).sum();
    if json {
        let doc: Vec<_> = topologies
            .iter()
            .zip(&reports)
            .map(|(t, r)| report_json(&t.queue, r))
            .collect();
        writeln!(io.out, "{}", serde_json::to_string_pretty(&doc)?)?;
    } else {
        for (topology, report) in topologies.iter().zip(&reports) {
            print_report(&topology.queue, report, io)?;
        }
    }
    if problems == 0 {
        Ok(EXIT_OK)
    } else {
        let queues: Vec<_> = topologies
            .iter()
            .map(|t| format!("{:?}", t.queue))
            .collect();
        writeln!(
            io.err,
            "rabbitkit: topology of {}: {problems} missing or different (nothing was declared)",
            queues.join(", ")
        )?;
        Ok(EXIT_FAILED)
    }
}

/// `topology apply --adopt`: rabbitkit's own objects beside work queues someone else
/// declared; a work queue without rabbitkit's dead-letter target is reported with the
/// command that gives it, and exits 1.
async fn adopt_all(
    connection: &ConnectionConfig,
    topologies: Vec<Topology>,
    mgmt_url: Option<ManagementUrl>,
    io: &mut Io<'_>,
) -> Done {
    let mut refused = 0;
    for mut topology in topologies {
        topology.management = mgmt_url.clone();
        match topology.adopt(connection).await {
            Ok(()) => writeln!(
                io.out,
                "adopted work queue {:?}: declared {}, {} retry tiers, {} bindings beside it",
                topology.queue,
                topology.parking_queue(),
                topology.tiers.len(),
                topology.bindings.len()
            )?,
            Err(e @ crate::Error::WorkQueueMismatch { .. }) => {
                refused += 1;
                writeln!(io.err, "rabbitkit: {e}")?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    if refused > 0 {
        writeln!(
            io.err,
            "rabbitkit: {refused} work queues not adopted (nothing was declared for them)"
        )?;
        return Ok(EXIT_FAILED);
    }
    Ok(EXIT_OK)
}

async fn migrate(connection: &ConnectionConfig, args: MigrateArgs, io: &mut Io<'_>) -> Done {
    let mut topology = Topology::new(args.work_queue);
    topology.tiers = args.tiers;
    let report = topology.migrate_tiers(connection, &args.old_tiers).await?;
    for t in &report.tiers {
        let label = tier_label(t.delay);
        match &t.outcome {
            MigratedTier::Absent => writeln!(io.out, "absent     {label}: no {:?}", t.old_queue)?,
            MigratedTier::Deleted => writeln!(
                io.out,
                "migrated   {label}: {} moved from {:?} into {:?}; {:?} deleted",
                t.moved, t.old_queue, t.new_queue, t.old_queue
            )?,
            MigratedTier::Kept { messages, why } => writeln!(
                io.out,
                "KEPT       {label}: {} moved into {:?}; {:?} kept with {messages} messages: {why}",
                t.moved, t.new_queue, t.old_queue
            )?,
            other => writeln!(io.out, "{other:?}  {label}")?,
        }
    }
    if report.is_complete() {
        writeln!(
            io.out,
            "{} moved; no classic delay tier of {:?} left",
            report.moved(),
            topology.queue
        )?;
        Ok(EXIT_OK)
    } else {
        writeln!(
            io.err,
            "rabbitkit: classic delay tiers of {:?} kept (nothing in them was lost); run the migration again",
            topology.queue
        )?;
        Ok(EXIT_FAILED)
    }
}

async fn prune(connection: &ConnectionConfig, args: PruneArgs, io: &mut Io<'_>) -> Done {
    let all = WorkerConfig::load(&args.config).and_then(|c| {
        let topologies = crate::config::topologies(&c)?;
        Ok((c, topologies))
    });
    let (config, topologies) = match all {
        Ok(all) => all,
        Err(e) => {
            writeln!(io.err, "rabbitkit: {e}")?;
            return Ok(EXIT_USAGE);
        }
    };
    // A schedule the file leaves out may be the handler's own (`#[subscriber(retry = ..)]`):
    // the tiers of such a work queue are not judged, so that none in use is listed.
    let mut judged = Vec::new();
    let mut skipped = std::collections::BTreeSet::new();
    for (s, t) in config.subscribers.iter().zip(topologies) {
        if args.work_queue.as_ref().is_some_and(|q| *q != t.queue) {
            continue;
        }
        // `[subscribers.retry]` without `tiers` keeps the handler's own tiers too.
        if s.retry.as_ref().is_none_or(|r| r.tiers.is_none()) {
            skipped.insert(t.queue.clone());
        } else {
            judged.push(t);
        }
    }
    judged.retain(|t| !skipped.contains(&t.queue));
    if judged.is_empty() && skipped.is_empty() {
        writeln!(
            io.err,
            "rabbitkit: no subscriber of that queue in the config"
        )?;
        return Ok(EXIT_USAGE);
    }
    let mut api = ManagementUrl::new(args.mgmt_url.clone());
    if args.allow_plain_http {
        api = api.allow_plain_http();
    }
    let on_broker = api.queues(connection).await?;
    let unused = unused_tiers(&judged, on_broker.iter().map(|q| q.name.as_str()));
    let outcomes = if args.yes && !unused.is_empty() {
        delete_if_empty(connection, &unused).await?
    } else {
        Vec::new()
    };
    let messages = |name: &str| on_broker.iter().find(|q| q.name == name)?.messages;
    let work_queue = |name: &str| {
        judged
            .iter()
            .find(|t| is_tier_of(name, &t.queue))
            .map(|t| t.queue.clone())
    };
    let outcome = |name: &str| outcomes.iter().find(|(q, _)| q == name).map(|(_, o)| o);
    let kept = outcomes
        .iter()
        .filter(|(_, o)| matches!(o, PruneOutcome::Kept(_)))
        .count();
    let why_skipped = "its [subscribers.retry] tiers are not in the file (the handler's code may set the schedule): its tiers are not judged";
    if args.json {
        let unused: Vec<_> = unused
            .iter()
            .map(|q| {
                let (state, detail) = match outcome(q) {
                    None => ("unused", None),
                    Some(PruneOutcome::Deleted) => ("deleted", None),
                    Some(PruneOutcome::Gone) => ("gone", None),
                    Some(PruneOutcome::Kept(why)) => ("kept", Some(why.clone())),
                    Some(_) => ("unknown", None),
                };
                json!({
                    "queue": q,
                    "work_queue": work_queue(q),
                    "messages": messages(q),
                    "state": state,
                    "detail": detail,
                })
            })
            .collect();
        let skipped: Vec<_> = skipped
            .iter()
            .map(|q| json!({ "work_queue": q, "why": why_skipped }))
            .collect();
        let doc = json!({ "unused": unused, "skipped": skipped, "deleted": args.yes });
        writeln!(io.out, "{}", serde_json::to_string_pretty(&doc)?)?;
    } else {
        for q in &unused {
            let n = messages(q).map_or("?".to_owned(), |n| n.to_string());
            match outcome(q) {
                None => writeln!(io.out, "unused     {q} ({n} messages)")?,
                Some(PruneOutcome::Deleted) => writeln!(io.out, "deleted    {q}")?,
                Some(PruneOutcome::Gone) => writeln!(io.out, "gone       {q} (deleted meanwhile)")?,
                Some(PruneOutcome::Kept(why)) => {
                    writeln!(io.out, "KEPT       {q} ({n} messages): {why}")?
                }
                Some(other) => writeln!(io.out, "{other:?}  {q}")?,
            }
        }
        for q in &skipped {
            writeln!(io.out, "skipped    {q:?}: {why_skipped}")?;
        }
        if !args.yes && !unused.is_empty() {
            writeln!(
                io.out,
                "{} unused tier queues; run again with --yes to delete the empty ones",
                unused.len()
            )?;
        } else if unused.is_empty() {
            writeln!(io.out, "no unused tier queue")?;
        }
    }
    if kept > 0 {
        writeln!(
            io.err,
            "rabbitkit: {kept} unused tier queues kept: they hold messages (nothing was lost); let them drain, or move them with `topology migrate`"
        )?;
        return Ok(EXIT_FAILED);
    }
    Ok(EXIT_OK)
}

fn print_report(queue: &str, report: &TopologyReport, io: &mut Io<'_>) -> Done {
    for o in &report.objects {
        match &o.state {
            ObjectState::Present => writeln!(io.out, "ok         {}", o.what)?,
            ObjectState::Missing => writeln!(io.out, "MISSING    {}", o.what)?,
            ObjectState::Different(why) => writeln!(io.out, "DIFFERENT  {}: {why}", o.what)?,
            other => writeln!(io.out, "{other:?}  {}", o.what)?,
        }
    }
    for b in &report.unchecked_bindings {
        writeln!(
            io.out,
            "unchecked  binding {b} (AMQP has no passive binding check)"
        )?;
    }
    if report.is_ok() {
        writeln!(io.out, "topology of {queue:?}: as expected")?;
    }
    Ok(EXIT_OK)
}

fn report_json(queue: &str, report: &TopologyReport) -> serde_json::Value {
    let objects: Vec<_> = report
        .objects
        .iter()
        .map(|o| {
            let (state, detail) = match &o.state {
                ObjectState::Present => ("present", None),
                ObjectState::Missing => ("missing", None),
                ObjectState::Different(why) => ("different", Some(why.as_str())),
                _ => ("unknown", None),
            };
            json!({ "object": o.what, "state": state, "detail": detail })
        })
        .collect();
    json!({
        "work_queue": queue,
        "ok": report.is_ok(),
        "objects": objects,
        "unchecked_bindings": report.unchecked_bindings,
    })
}

/// The topologies the arguments describe: one from the flags, or those of a config file's
/// subscribers (only the named work queue's when one is given).
fn topologies(args: TopologyArgs) -> crate::Result<Vec<Topology>> {
    if let Some(path) = &args.config {
        let config = WorkerConfig::load(path)?;
        let all = crate::config::topologies(&config)?;
        return Ok(all
            .into_iter()
            .filter(|t| args.work_queue.as_ref().is_none_or(|q| *q == t.queue))
            .collect());
    }
    let Some(queue) = args.work_queue else {
        // clap requires the work queue without --config.
        return Ok(Vec::new());
    };
    let mut t = Topology::new(queue);
    if args.quorum {
        t.queue_type = QueueType::Quorum;
    }
    t.tiers = args.tiers;
    if args.classic_tiers {
        t.tier_queue_type = QueueType::Classic;
    }
    if let Some(kind) = args.exchange_kind {
        t.exchange_kind = kind;
    }
    if let Some(n) = args.delivery_limit {
        t.delivery_limit = n;
    }
    t.bindings = args
        .bindings
        .into_iter()
        .map(|(exchange, routing_key)| Binding {
            exchange,
            routing_key,
        })
        .collect();
    Ok(vec![t])
}
