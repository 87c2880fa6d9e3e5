//! A subscriber: a handler (any tower service) bound to a queue, with its policies.

use std::sync::Arc;
use std::time::Duration;

use lapin::types::AMQPValue;
use tower::util::BoxCloneService;
use tower::{Layer, Service, ServiceExt};

use crate::coalesce::AckCoalescing;
use crate::decide::SettleSpec;
use crate::delivery::{Delivery, Extensions};
use crate::error::BoxError;
use crate::extract::Requirements;
use crate::handler::{Handler, handler_service};
use crate::kind::{Classify, DefaultClassifier};
use crate::outcome::Outcome;
use crate::policy::{AckPolicy, ManualFallback};
use crate::retry::RetryPolicy;
use crate::topology::{Binding, QueueType, Topology, TopologyMode};

/// The deadline of a handler run when none is set ([`Subscriber::deadline`]): five minutes,
/// well below the broker's default consumer timeout (30 min).
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(300);

/// The boxed service type subscribers run.
pub type BoxDeliveryService = BoxCloneService<Delivery, Outcome, BoxError>;

/// Default requeue limit: requeues allowed per message before the next one parks it with
/// reason `requeue-limit` (RabbitMQ 4.0's default quorum delivery limit is 20 too).
pub const DEFAULT_REQUEUE_LIMIT: u32 = 20;

/// Default prefetch: bounded, so a slow handler never buffers a whole queue in memory.
pub const DEFAULT_PREFETCH: u16 = 50;

/// A handler bound to a work queue, with its topology and policies.
///
/// Built with [`Subscriber::new`] (an async fn with extractors) or [`Subscriber::service`]
/// (any tower service), then configured. Layers added with [`Subscriber::layer`] wrap the
/// handler in the order added: the last one added runs first (outermost).
#[must_use]
#[derive(Clone)]
pub struct Subscriber {
    pub(crate) name: String,
    pub(crate) topology: Topology,
    pub(crate) mode: TopologyMode,
    pub(crate) retry: RetryPolicy,
    pub(crate) policy: AckPolicy,
    pub(crate) fallback: ManualFallback,
    /// Whether [`Subscriber::manual_fallback`] was called: refused at start unless manual.
    pub(crate) fallback_set: bool,
    /// Whether [`Subscriber::delivery_limit`] was called: refused at start unless quorum.
    pub(crate) delivery_limit_set: bool,
    pub(crate) requeue_limit: u32,
    pub(crate) classifier: Arc<dyn Classify>,
    /// The kinds its failures can carry: `on_kind` policies are checked against them.
    pub(crate) kinds: crate::kind::KnownKinds,
    pub(crate) prefetch: u16,
    pub(crate) concurrency: usize,
    pub(crate) concurrency_set: bool,
    /// The deadline set with [`Subscriber::deadline`]; `None` for the default.
    deadline: Option<Duration>,
    /// [`Subscriber::no_deadline`] was called.
    no_deadline: bool,
    pub(crate) consumer_timeout: Option<Duration>,
    pub(crate) ack_coalescing: Option<AckCoalescing>,
    pub(crate) service: BoxDeliveryService,
    pub(crate) extensions: Extensions,
    /// What the handler's extractors need; checked at start.
    pub(crate) requirements: Requirements,
}

impl std::fmt::Debug for Subscriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscriber")
            .field("name", &self.name)
            .field("queue", &self.topology.queue)
            .field("topology", &self.topology)
            .field("mode", &self.mode)
            .field("policy", &self.policy)
            .field("fallback", &self.fallback)
            .field("requeue_limit", &self.requeue_limit)
            .field("retry", &self.retry)
            .field("prefetch", &self.prefetch)
            .field("concurrency", &self.concurrency)
            .field("deadline", &self.effective_deadline())
            .field("consumer_timeout", &self.consumer_timeout)
            .field("ack_coalescing", &self.ack_coalescing)
            .finish_non_exhaustive()
    }
}

impl Subscriber {
    /// A subscriber running `handler` (an async fn whose arguments are extractors).
    pub fn new<H, Args>(queue: impl Into<String>, handler: H) -> Self
    where
        H: Handler<Args>,
        Args: 'static,
    {
        let requirements = handler.requirements();
        let mut s = Self::service(queue, handler_service(handler));
        s.requirements = requirements;
        s
    }

    /// A subscriber running any tower service from [`Delivery`] to [`Outcome`]. Service
    /// errors (a `tower::timeout` elapsing, say) are classified like handler errors.
    pub fn service<S>(queue: impl Into<String>, service: S) -> Self
    where
        S: Service<Delivery, Response = Outcome> + Clone + Send + 'static,
        S::Error: Into<BoxError>,
        S::Future: Send + 'static,
    {
        let queue = queue.into();
        Self {
            name: queue.clone(),
            topology: Topology::new(queue),
            mode: TopologyMode::Declare,
            retry: RetryPolicy::default(),
            policy: AckPolicy::Auto,
            fallback: ManualFallback::NackRequeue,
            fallback_set: false,
            delivery_limit_set: false,
            requeue_limit: DEFAULT_REQUEUE_LIMIT,
            classifier: Arc::new(DefaultClassifier),
            kinds: crate::kind::KnownKinds::default(),
            prefetch: DEFAULT_PREFETCH,
            concurrency: usize::from(DEFAULT_PREFETCH),
            concurrency_set: false,
            deadline: None,
            no_deadline: false,
            consumer_timeout: None,
            ack_coalescing: None,
            service: BoxCloneService::new(service.map_err(Into::into)),
            extensions: Extensions::default(),
            requirements: Requirements::default(),
        }
    }

    /// Wraps the handler in a tower layer (timeout, concurrency limit, your own).
    pub fn layer<L>(mut self, layer: L) -> Self
    where
        L: Layer<BoxDeliveryService>,
        L::Service: Service<Delivery, Response = Outcome> + Clone + Send + 'static,
        <L::Service as Service<Delivery>>::Error: Into<BoxError>,
        <L::Service as Service<Delivery>>::Future: Send + 'static,
    {
        let wrapped = layer.layer(self.service);
        self.service = BoxCloneService::new(wrapped.map_err(Into::into));
        self
    }

    /// The handler's name (logs, metrics, evidence headers, registry lookups).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Binds the work queue to `exchange` with `routing_key` (the exchange is declared).
    pub fn bind(mut self, exchange: impl Into<String>, routing_key: impl Into<String>) -> Self {
        self.topology.bindings.push(Binding {
            exchange: exchange.into(),
            routing_key: routing_key.into(),
        });
        self
    }

    /// The kind of the bound exchanges (`topic` by default).
    pub fn exchange_kind(mut self, kind: impl Into<String>) -> Self {
        self.topology.exchange_kind = kind.into();
        self
    }

    /// Classic (default) or quorum work queue.
    pub fn queue_type(mut self, t: QueueType) -> Self {
        self.topology.queue_type = t;
        self
    }

    /// Quorum only: the broker-side requeue limit before it dead-letters to parking.
    /// [`Worker::start`](crate::Worker::start) refuses it on a classic work queue, which
    /// has no such limit.
    pub fn delivery_limit(mut self, n: u32) -> Self {
        self.topology.delivery_limit = n;
        self.delivery_limit_set = true;
        self
    }

    /// The type of the delay tiers. Quorum (the default) dead-letters expired copies into
    /// the work queue at-least-once; [`QueueType::Classic`] is an opt-in for brokers or
    /// operators that cannot run quorum queues, with the risk that a copy expiring while the
    /// work queue cannot take it (a quorum work queue electing its leader after a restart,
    /// no majority, a length limit) is dropped by the broker, after its original was acked.
    /// Classic tiers are named `{q}.retry.{delay}`, quorum tiers `{q}.delay.{delay}`.
    pub fn tier_queue_type(mut self, t: QueueType) -> Self {
        self.topology.tier_queue_type = t;
        self
    }

    /// An extra work-queue argument (checked for dead-letter cycles at startup).
    pub fn queue_argument(mut self, name: &str, value: impl Into<AMQPValue>) -> Self {
        self.topology
            .queue_arguments
            .insert(name.into(), value.into());
        self
    }

    /// Declare the topology (default), only validate it, or adopt a work queue someone
    /// else declared ([`TopologyMode`]).
    pub fn topology_mode(mut self, mode: TopologyMode) -> Self {
        self.mode = mode;
        self
    }

    /// The management API, `https://[user:password@]host:port` (user and password default
    /// to the broker URL's): read by the `validate` and `adopt` topology modes to see the
    /// work queue's type, arguments and effective policy, so that a dead-letter exchange
    /// set by a policy counts ([`Topology::management`]). A plain `http://` URL to a host
    /// that is not loopback is refused unless allowed
    /// ([`ManagementUrl::allow_plain_http`](crate::topology::ManagementUrl::allow_plain_http)).
    pub fn management_url(mut self, url: impl Into<crate::topology::ManagementUrl>) -> Self {
        self.topology.management = Some(url.into());
        self
    }

    /// The retry schedule.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// The ack policy.
    pub fn ack_policy(mut self, policy: AckPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// What applies when a manual handler returns without settling.
    /// [`Worker::start`](crate::Worker::start) refuses it unless the ack policy is
    /// [`AckPolicy::Manual`], the only one it applies to.
    pub fn manual_fallback(mut self, fallback: ManualFallback) -> Self {
        self.fallback = fallback;
        self.fallback_set = true;
        self
    }

    /// Requeues allowed per message (`Outcome::Requeue`, a manual `requeue`, the
    /// `nack-requeue` fallback); the next requeue parks the message with reason
    /// `requeue-limit` instead, so a message nothing can handle never loops for ever.
    /// Default [`DEFAULT_REQUEUE_LIMIT`]; at least 1.
    pub fn requeue_limit(mut self, n: u32) -> Self {
        self.requeue_limit = n.max(1);
        self
    }

    /// The error classifier. It replaces the classifier so far, kinds registered with
    /// [`Subscriber::error_kind`] included: set it first. Its kinds are its own: `on_kind`
    /// policies are no longer checked at start against the kinds known to rabbitkit.
    pub fn classifier(mut self, c: impl Classify) -> Self {
        self.classifier = Arc::new(c);
        self.kinds.open = true;
        self
    }

    /// Failures of kind `kind` follow `policy` ([`RetryPolicy::on_kind`] on the current
    /// policy): a `#[subscriber]` function's policy can be extended this way,
    /// `charge::subscriber().on_kind("validation", KindPolicy::park())`.
    pub fn on_kind(mut self, kind: impl Into<String>, policy: crate::kind::KindPolicy) -> Self {
        self.retry.kinds.insert(kind.into(), policy);
        self
    }

    /// Errors of type `E` (anywhere in a handler error's chain) take their kind and
    /// permanence from `E`'s [`ErrorKind`](crate::kind::ErrorKind) impl, so a `thiserror`
    /// enum's variants get their own kinds, and [`RetryPolicy::on_kind`] their own
    /// policies. Other errors keep the classifier's answer. Repeatable for several types.
    ///
    /// `E`'s [`KINDS`](crate::kind::ErrorKind::KINDS) are what `on_kind` policies are
    /// checked against at start: a policy for a kind nothing produces is refused
    /// ([`Error::UnknownKind`](crate::Error::UnknownKind)).
    pub fn error_kind<E: crate::kind::ErrorKind>(mut self) -> Self {
        self.kinds.register::<E>();
        self.classifier = Arc::new(crate::kind::KindsOf::<E> {
            inner: self.classifier,
            _e: std::marker::PhantomData,
        });
        self
    }

    /// Declares kinds the handler gives its failures ad hoc, without a registered
    /// [`ErrorKind`](crate::kind::ErrorKind) type: `.kind("validation")?`
    /// ([`ResultExt::kind`](crate::kind::ResultExt::kind)), [`Kinded::new`](crate::kind::Kinded::new),
    /// a `Failure` of its own. `on_kind` policies are checked against the kinds registered
    /// types list, these, and [`BUILTIN_KINDS`](crate::kind::BUILTIN_KINDS); a policy for a
    /// kind none of them names is refused at start. Repeatable.
    pub fn kinds<K>(mut self, kinds: impl IntoIterator<Item = K>) -> Self
    where
        K: Into<std::borrow::Cow<'static, str>>,
    {
        self.kinds.declare(kinds.into_iter().map(Into::into));
        self
    }

    /// Unacked deliveries the broker may push (per consumer, never global: global QoS with
    /// a quorum queue closes the connection on 3.10). Also caps memory.
    pub fn prefetch(mut self, n: u16) -> Self {
        self.prefetch = n.max(1);
        if !self.concurrency_set {
            self.concurrency = usize::from(self.prefetch);
        }
        self
    }

    /// Handlers running at once (at most `prefetch` are ever available). Follows
    /// `prefetch` unless set.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency_set = true;
        self.concurrency = n.max(1);
        self
    }

    /// A deadline per handler run; past it the run is a `timeout` failure (retried, then
    /// parked) and its concurrency slot is free again. Keep it well below the broker's
    /// consumer timeout (30 min by default). Without this call a handler run has
    /// [`DEFAULT_DEADLINE`] (or half the [`consumer_timeout`](Self::consumer_timeout) when
    /// that is shorter): a handler that hangs would otherwise hold its slot until the
    /// broker's consumer timeout, and each redelivery would hang the next slot.
    pub fn deadline(mut self, d: Duration) -> Self {
        self.deadline = Some(d);
        self.no_deadline = false;
        self
    }

    /// No deadline at all: a handler run may take as long as it likes. A hanging handler
    /// then holds its concurrency slot until the channel dies; the worker says so at start
    /// (a warning naming the subscriber), and `/readyz` reports a subscriber that consumes
    /// nothing while messages wait.
    pub fn no_deadline(mut self) -> Self {
        self.deadline = None;
        self.no_deadline = true;
        self
    }

    /// The deadline a handler run gets: the one set, the default, or `None` after
    /// [`no_deadline`](Self::no_deadline).
    pub fn effective_deadline(&self) -> Option<Duration> {
        if self.no_deadline {
            return None;
        }
        Some(
            self.deadline
                .unwrap_or_else(|| match self.consumer_timeout {
                    Some(ct) => DEFAULT_DEADLINE.min(ct / 2).max(Duration::from_millis(1)),
                    None => DEFAULT_DEADLINE,
                }),
        )
    }

    /// Whether [`no_deadline`](Self::no_deadline) was asked for.
    pub fn has_no_deadline(&self) -> bool {
        self.no_deadline
    }

    /// The broker's consumer timeout for this subscriber's consumer, sent as the
    /// `x-consumer-timeout` consume argument: a delivery left unacknowledged longer than
    /// this makes the broker give up on the consumer. RabbitMQ 4.0–4.2 close the channel
    /// (406); 4.3 enforces it only on quorum queues and cancels the consumer
    /// (`basic.cancel`). Either way rabbitkit subscribes again within seconds, and
    /// deliveries still in flight settle on their own channel. RabbitMQ 3.10 ignores the
    /// argument. Must be above [`deadline`](Self::deadline) when both are set.
    pub fn consumer_timeout(mut self, d: Duration) -> Self {
        self.consumer_timeout = Some(d);
        self
    }

    /// Coalesces acks: a run of successes on one channel is acked with one
    /// `basic.ack multiple=true`, sent once `max_acks` acks are held or `max_delay` after
    /// the first of them, and before the channel closes at shutdown. A multiple ack never
    /// covers a delivery still being handled, requeued, rejected or copied. Off by default.
    ///
    /// Fewer ack frames for the broker to process, for a wider duplicate window: acks held
    /// when the connection or the process dies are never sent, and the broker redelivers
    /// those messages (at most `max_acks` per channel). `max_acks` must be at most the
    /// prefetch (at most half keeps deliveries flowing) and `max_delay` at most 1 s; not with
    /// [`AckPolicy::AckFirst`], whose ack is written before the handler runs. See
    /// [`coalesce`](crate::coalesce).
    pub fn ack_coalescing(mut self, max_acks: u16, max_delay: Duration) -> Self {
        self.ack_coalescing = Some(AckCoalescing::new(max_acks, max_delay));
        self
    }

    /// Turns ack coalescing off (the default): every ack is its own frame.
    pub fn no_ack_coalescing(mut self) -> Self {
        self.ack_coalescing = None;
        self
    }

    /// Shared state for [`State`](crate::extract::State) extractors.
    pub fn state<T: Clone + Send + Sync + 'static>(mut self, value: T) -> Self {
        self.extensions.insert(value);
        self
    }

    /// The queue name.
    pub fn queue(&self) -> &str {
        &self.topology.queue
    }

    /// The handler's name.
    pub fn handler_name(&self) -> &str {
        &self.name
    }

    /// The topology this subscriber declares.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Checks without a broker what [`Worker::start`](crate::Worker::start) refuses: names,
    /// retry policy (an `on_kind` policy for a kind no failure can carry included), topology, settings that would do nothing, and a handler's `Settle`
    /// argument outside manual mode.
    pub fn validate(&self) -> crate::Result<()> {
        self.retry.validate()?;
        self.kinds.check(&self.name, self.retry.kinds.keys())?;
        if self.deadline.is_some_and(|d| d.is_zero()) {
            return Err(crate::Error::Config(format!(
                "subscriber {:?}: the handler deadline must be above 0 (every run would time out)",
                self.name
            )));
        }
        if let Some(ct) = self.consumer_timeout {
            if ct.as_millis() == 0 || ct.as_millis() > i64::MAX as u128 {
                return Err(crate::Error::Config(format!(
                    "subscriber {:?}: consumer_timeout must be at least 1 ms",
                    self.name
                )));
            }
            if let Some(d) = self.deadline.filter(|d| *d >= ct) {
                return Err(crate::Error::Config(format!(
                    "subscriber {:?}: the handler deadline ({d:?}) must be below the \
                     consumer_timeout ({ct:?}), or the broker gives up on the consumer first",
                    self.name
                )));
            }
        }
        // Settings that would be taken and then do nothing.
        if self.delivery_limit_set && self.topology.queue_type != QueueType::Quorum {
            return Err(crate::Error::Config(format!(
                "subscriber {:?}: delivery_limit applies only to a quorum work queue \
                 (queue_type(QueueType::Quorum)); a classic queue has no delivery limit",
                self.name
            )));
        }
        if self.fallback_set && self.policy != AckPolicy::Manual {
            return Err(crate::Error::Config(format!(
                "subscriber {:?}: manual_fallback applies only with AckPolicy::Manual \
                 (the ack policy is {:?})",
                self.name, self.policy
            )));
        }
        if let Some(c) = &self.ack_coalescing {
            c.check(Some(self.prefetch)).map_err(|(k, m)| {
                crate::Error::Config(format!(
                    "subscriber {:?}: ack coalescing {k} {m}",
                    self.name
                ))
            })?;
            if self.policy == AckPolicy::AckFirst {
                return Err(crate::Error::Config(format!(
                    "subscriber {:?}: ack coalescing does nothing with the ack-first policy \
                     (its ack is written before the handler runs)",
                    self.name
                )));
            }
        }
        self.check_settle()?;
        self.full_topology().validate()
    }

    /// Refuses a handler whose `Settle` argument could never be given (not manual mode).
    fn check_settle(&self) -> crate::Result<()> {
        if self.requirements.needs_settle() && self.policy != AckPolicy::Manual {
            return Err(crate::Error::SettleOutsideManual {
                subscriber: self.name.clone(),
            });
        }
        Ok(())
    }

    /// Refuses a handler whose `State<T>` argument finds nothing in `worker` state, this
    /// subscriber's state, or what the worker provides itself (the `Publisher`).
    pub(crate) fn check_state(&self, worker: &Extensions) -> crate::Result<()> {
        let publisher = std::any::TypeId::of::<crate::publisher::Publisher>();
        let missing = self.requirements.missing_state(|id| {
            id == publisher || worker.contains(id) || self.extensions.contains(id)
        });
        match missing {
            Some(type_name) => Err(crate::Error::MissingState {
                subscriber: self.name.clone(),
                type_name,
            }),
            None => Ok(()),
        }
    }

    pub(crate) fn settle_spec(&self) -> SettleSpec {
        SettleSpec {
            queue: self.topology.queue.as_str().into(),
            handler: self.name.as_str().into(),
            retry: self.retry.clone(),
            tier_queue_type: self.topology.tier_queue_type,
            classifier: self.classifier.clone(),
            policy: self.policy,
            fallback: self.fallback,
            requeue_limit: self.requeue_limit,
            trust: crate::trust::HeaderTrust::default(),
        }
    }

    pub(crate) fn full_topology(&self) -> Topology {
        let mut t = self.topology.clone();
        t.tiers = self.retry.distinct_tiers();
        t
    }
}

/// Anything that builds a [`Subscriber`]: a `Subscriber` itself, or the value a
/// `#[subscriber]` function expands to.
pub trait IntoSubscriber {
    /// Builds the subscriber.
    fn into_subscriber(self) -> Subscriber;
}

impl IntoSubscriber for Subscriber {
    fn into_subscriber(self) -> Subscriber {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_that_would_do_nothing_are_refused_before_start() {
        let sub = || Subscriber::new("orders", || async { Ok::<(), crate::BoxError>(()) });
        // A classic work queue has no delivery limit: the broker would never apply it.
        let classic = sub().delivery_limit(5);
        assert!(
            matches!(classic.validate(), Err(crate::Error::Config(m)) if m.contains("delivery_limit")),
            "delivery_limit on a classic queue"
        );
        let quorum = sub().delivery_limit(5).queue_type(QueueType::Quorum);
        assert!(quorum.validate().is_ok(), "{:?}", quorum.validate());
        // The fallback applies only to manual handlers that return without settling.
        let auto = sub().manual_fallback(ManualFallback::Reject);
        assert!(
            matches!(auto.validate(), Err(crate::Error::Config(m)) if m.contains("manual_fallback")),
            "manual_fallback with the auto policy"
        );
        // Builder order does not matter: the check runs on the finished definition.
        let manual = sub()
            .manual_fallback(ManualFallback::Reject)
            .ack_policy(AckPolicy::Manual);
        assert!(manual.validate().is_ok(), "{:?}", manual.validate());
        // Defaults are never refused.
        assert!(sub().validate().is_ok());
    }

    #[test]
    fn a_handler_run_has_a_deadline_unless_one_is_refused_explicitly() {
        let s = || Subscriber::new("q", || async {});
        assert_eq!(s().effective_deadline(), Some(DEFAULT_DEADLINE));
        assert_eq!(
            s().consumer_timeout(Duration::from_secs(60))
                .effective_deadline(),
            Some(Duration::from_secs(30)),
            "below a shorter consumer timeout"
        );
        assert_eq!(
            s().deadline(Duration::from_secs(9)).effective_deadline(),
            Some(Duration::from_secs(9))
        );
        let none = s().no_deadline();
        assert_eq!(none.effective_deadline(), None);
        assert!(none.has_no_deadline());
        assert_eq!(
            s().no_deadline()
                .deadline(Duration::from_secs(2))
                .effective_deadline(),
            Some(Duration::from_secs(2))
        );
    }

    #[derive(Debug, thiserror::Error)]
    #[error("declined")]
    struct Declined;

    impl crate::kind::ErrorKind for Declined {
        const KINDS: &'static [&'static str] = &["card"];
        fn kind(&self) -> std::borrow::Cow<'static, str> {
            "card".into()
        }
    }

    #[test]
    fn on_kind_for_a_kind_no_registered_type_produces_is_refused_before_start() {
        use crate::kind::KindPolicy;
        let sub = || {
            Subscriber::new("charge", || async { Ok::<(), crate::BoxError>(()) })
                .on_kind("card", KindPolicy::park())
        };
        // The type that produces `card` was never registered: the policy would never apply.
        assert!(
            matches!(sub().validate(), Err(crate::Error::UnknownKind { kind, .. }) if kind == "card"),
            "{:?}",
            sub().validate()
        );
        assert!(sub().error_kind::<Declined>().validate().is_ok());
        assert!(sub().kinds(["card"]).validate().is_ok(), "declared ad hoc");
        assert!(
            sub()
                .classifier(crate::kind::DefaultClassifier)
                .validate()
                .is_ok(),
            "a custom classifier's kinds are its own"
        );
        // Kinds rabbitkit gives itself need nothing.
        let builtin = Subscriber::new("charge", || async { Ok::<(), crate::BoxError>(()) })
            .on_kind("timeout", KindPolicy::park())
            .on_kind("decode", KindPolicy::park());
        assert!(builtin.validate().is_ok());
        // A typo in a kind is refused too, with the registered type named.
        let typo = sub()
            .error_kind::<Declined>()
            .on_kind("crad", KindPolicy::park());
        let msg = typo
            .validate()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            msg.contains("\"crad\"") && msg.contains("Declined"),
            "{msg}"
        );
    }

    #[test]
    fn a_zero_deadline_is_refused_before_start() {
        let s = Subscriber::new("orders", || async { Ok::<(), crate::BoxError>(()) })
            .deadline(Duration::ZERO);
        assert!(
            matches!(s.validate(), Err(crate::Error::Config(m)) if m.contains("deadline")),
            "a zero deadline times out every run"
        );
        let ok = Subscriber::new("orders", || async { Ok::<(), crate::BoxError>(()) })
            .deadline(Duration::from_millis(1));
        assert!(ok.validate().is_ok());
    }
}
