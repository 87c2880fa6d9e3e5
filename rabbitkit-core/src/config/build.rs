//! From a parsed config and a registry to a [`Worker`], and the `--check` behind it.

use crate::error::{Error, Result};
use crate::policy::AckPolicy;
use crate::subscriber::Subscriber;
use crate::topology::{ManagementUrl, QueueType, Topology, TopologyMode, TopologyReport};
use crate::worker::Worker;

use super::{Handlers, SubscriberConfig, WorkerConfig};

/// Builds the worker `config` describes, with the handlers of `handlers`. Nothing connects
/// yet: add shared state with [`Worker::state`], then `start` or `run_until`.
///
/// Fails with [`Error::UnknownHandler`] (naming it and the registered ones) when a
/// subscriber names a handler that is not registered, and with the subscriber's own
/// validation error (names, topology, retry tiers) otherwise.
pub fn from_config(config: &WorkerConfig, handlers: &Handlers) -> Result<Worker> {
    if let Some(name) = handlers.registered_twice() {
        return Err(Error::Config(format!(
            "handler {name:?} is registered twice"
        )));
    }
    let mut worker = Worker::new(config.connection.to_connection_config())
        .publisher_config(config.publisher.clone())
        .shutdown_deadline(config.shutdown_deadline);
    #[cfg(feature = "http")]
    if let Some(addr) = config.observability.http_listen {
        worker = worker.http(addr);
    }
    if let Some(every) = config.observability.parking_depth_interval {
        worker = worker.parking_depth_interval(every);
    }
    if config.topology.management_url.is_some() && config.topology.mode == TopologyMode::Declare {
        return Err(Error::Config(
            "topology.management-url is read only in the validate and adopt modes; \
             mode is declare"
                .into(),
        ));
    }
    if config.topology.allow_plain_http && config.topology.management_url.is_none() {
        return Err(Error::Config(
            "topology.allow-plain-http applies to topology.management-url, which is not set".into(),
        ));
    }
    for (i, s) in config.subscribers.iter().enumerate() {
        let template = handlers
            .get(&s.handler)
            .ok_or_else(|| Error::UnknownHandler {
                name: s.handler.clone(),
                registered: handlers.names().map(str::to_owned).collect(),
            })?;
        let sub = apply(s, template.clone());
        refuse_ignored(i, s, &sub)?;
        let mut sub = sub.topology_mode(config.topology.mode);
        if let Some(url) = &config.topology.management_url {
            let mut url = ManagementUrl::new(url.clone());
            if config.topology.allow_plain_http {
                url = url.allow_plain_http();
            }
            sub = sub.management_url(url);
        }
        worker = worker.subscribe(sub);
    }
    worker.validate()?;
    Ok(worker)
}

/// Validates `config` against the broker without declaring anything: connects, checks that
/// every exchange and queue of every subscriber exists with the arguments the worker would
/// declare, and returns what is missing or differs ([`TopologyReport::is_ok`]).
pub async fn check(config: &WorkerConfig, handlers: &Handlers) -> Result<TopologyReport> {
    from_config(config, handlers)?.check_topology().await
}

/// The topology of each subscriber `config` describes, from the file alone: keys it leaves
/// out take rabbitkit's defaults, since the handlers' own code (a `#[subscriber]` retry
/// schedule, say) is not known here. The operator CLI's `topology check --config` uses it;
/// a worker's own [`check`] knows its handlers and is exact.
pub fn topologies(config: &WorkerConfig) -> Result<Vec<Topology>> {
    config
        .subscribers
        .iter()
        .map(|s| {
            // Never run: only the topology of this subscriber is read.
            let placeholder = || async { crate::outcome::Outcome::Requeue };
            let mut sub = apply(s, Subscriber::new(String::new(), placeholder));
            // The handler's own ack policy and queue type are not known here: a
            // `manual-fallback` or `delivery-limit` the worker would refuse is its check's
            // to refuse (`from_config`), not the topology tool's.
            sub.fallback_set = false;
            sub.delivery_limit_set = false;
            // Nor the kinds its errors carry: a `kinds.NAME` policy is checked by the
            // worker, which knows the handler's registered error types.
            sub.kinds.open = true;
            sub.validate()?;
            Ok(sub.full_topology())
        })
        .collect()
}

/// Refuses a key the file sets that the subscriber it builds (the registered handler's
/// settings with the file's on top) would ignore: no setting is parsed and then ignored.
/// A setting the code set and a file key turned off is refused at the file's key; one the
/// code alone got wrong is left to [`Subscriber::validate`].
fn refuse_ignored(i: usize, s: &SubscriberConfig, sub: &Subscriber) -> Result<()> {
    if sub.delivery_limit_set && sub.topology.queue_type != QueueType::Quorum {
        if s.delivery_limit.is_some() {
            return Err(Error::Config(format!(
                "subscribers[{i}].delivery-limit: only a quorum work queue has a delivery \
                 limit; {:?} is a {:?} queue (set queue-type = \"quorum\", or remove the key)",
                s.queue, sub.topology.queue_type
            )));
        }
        if s.queue_type.is_some() {
            return Err(Error::Config(format!(
                "subscribers[{i}].queue-type: the handler registered for {:?} sets a delivery \
             limit, which only a quorum work queue has (keep queue-type = \"quorum\", or \
             drop the handler's delivery_limit)",
                s.display_name()
            )));
        }
    }
    if sub.fallback_set && sub.policy != AckPolicy::Manual {
        if s.manual_fallback.is_some() {
            return Err(Error::Config(format!(
                "subscribers[{i}].manual-fallback: only used with ack = \"manual\"; the ack \
                 policy of {:?} is {:?}",
                s.display_name(),
                sub.policy
            )));
        }
        if s.ack.is_some() {
            return Err(Error::Config(format!(
                "subscribers[{i}].ack: the handler registered for {:?} sets a manual fallback, \
                 used only with ack = \"manual\" (keep it, or drop the handler's manual_fallback)",
                s.display_name()
            )));
        }
    }
    Ok(())
}

/// The keys `s` sets, over what the registered subscriber has.
fn apply(s: &SubscriberConfig, mut sub: Subscriber) -> Subscriber {
    sub.topology.queue.clone_from(&s.queue);
    sub = sub.name(s.display_name());
    if let Some(t) = s.queue_type {
        sub = sub.queue_type(t);
    }
    if let Some(n) = s.delivery_limit {
        sub = sub.delivery_limit(n);
    }
    if let Some(t) = s.tier_queue_type {
        sub = sub.tier_queue_type(t);
    }
    if let Some(k) = &s.exchange_kind {
        sub = sub.exchange_kind(k.clone());
    }
    if let Some(b) = &s.bindings {
        sub.topology.bindings.clone_from(b);
    }
    if let Some(n) = s.prefetch {
        sub = sub.prefetch(n.get());
    }
    if let Some(n) = s.concurrency {
        sub = sub.concurrency(n.get());
    }
    if let Some(p) = s.ack {
        sub = sub.ack_policy(p);
    }
    if let Some(f) = s.manual_fallback {
        sub = sub.manual_fallback(f);
    }
    if let Some(n) = s.requeue_limit {
        sub = sub.requeue_limit(n.get());
    }
    if let Some(d) = s.deadline {
        sub = sub.deadline(d);
    }
    if let Some(r) = &s.retry {
        let registered = sub.retry.clone();
        sub = sub.retry(r.apply(registered));
    }
    if let Some(c) = s.ack_coalescing {
        sub = sub.ack_coalescing(c.max_acks, c.max_delay);
    }
    sub
}
