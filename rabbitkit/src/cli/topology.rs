//! `rabbitkit topology check|apply`: [`Topology::check`] and [`Topology::declare`].

use rabbitkit_core::topology::{Binding, ObjectState};

use super::args::{TopologyArgs, TopologyCommand};
use super::{Done, EXIT_FAILED, EXIT_OK, Io};
use crate::{ConnectionConfig, QueueType, Topology};

pub(crate) async fn run(
    connection: &ConnectionConfig,
    cmd: TopologyCommand,
    io: &mut Io<'_>,
) -> Done {
    match cmd {
        TopologyCommand::Check(args) => {
            let topology = topology(args);
            let report = topology.check(connection).await?;
            for o in &report.objects {
                match &o.state {
                    ObjectState::Present => writeln!(io.out, "ok         {}", o.what)?,
                    ObjectState::Missing => writeln!(io.out, "MISSING    {}", o.what)?,
                    ObjectState::Different(why) => {
                        writeln!(io.out, "DIFFERENT  {}: {why}", o.what)?
                    }
                    other => writeln!(io.out, "{other:?}  {}", o.what)?,
                }
            }
            for b in &report.unchecked_bindings {
                writeln!(
                    io.out,
                    "unchecked  binding {b} (AMQP has no passive binding check)"
                )?;
            }
            let problems = report.problems().count();
            if problems == 0 {
                writeln!(io.out, "topology of {:?}: as expected", topology.queue)?;
                Ok(EXIT_OK)
            } else {
                writeln!(
                    io.err,
                    "rabbitkit: topology of {:?}: {problems} missing or different (nothing was declared)",
                    topology.queue
                )?;
                Ok(EXIT_FAILED)
            }
        }
        TopologyCommand::Apply(args) => {
            let topology = topology(args);
            topology.declare(connection).await?;
            writeln!(
                io.out,
                "declared topology of {:?}: work queue, {}, {} retry tiers, {} bindings",
                topology.queue,
                topology.parking_queue(),
                topology.tiers.len(),
                topology.bindings.len()
            )?;
            Ok(EXIT_OK)
        }
    }
}

fn topology(args: TopologyArgs) -> Topology {
    let mut t = Topology::new(args.work_queue);
    if args.quorum {
        t.queue_type = QueueType::Quorum;
    }
    t.tiers = args.tiers;
    t.exchange_kind = args.exchange_kind;
    t.delivery_limit = args.delivery_limit;
    t.bindings = args
        .bindings
        .into_iter()
        .map(|(exchange, routing_key)| Binding {
            exchange,
            routing_key,
        })
        .collect();
    t
}
