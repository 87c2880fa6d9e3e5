//! A subscriber: a handler (any tower service) bound to a queue, with its policies.

use std::sync::Arc;
use std::time::Duration;

use lapin::types::AMQPValue;
use tower::util::BoxCloneService;
use tower::{Layer, Service, ServiceExt};

use crate::decide::SettleSpec;
use crate::delivery::{Delivery, Extensions};
use crate::error::BoxError;
use crate::handler::{Handler, handler_service};
use crate::outcome::{Classify, DefaultClassifier, Outcome};
use crate::policy::{AckPolicy, ManualFallback};
use crate::retry::RetryPolicy;
use crate::topology::{Binding, QueueType, Topology, TopologyMode};

/// The boxed service type subscribers run.
pub type BoxDeliveryService = BoxCloneService<Delivery, Outcome, BoxError>;

/// Default prefetch: bounded, so a slow handler never buffers a whole queue in memory.
pub const DEFAULT_PREFETCH: u16 = 50;

/// A handler bound to a work queue, with its topology and policies.
///
/// Built with [`Subscriber::new`] (an async fn with extractors) or [`Subscriber::service`]
/// (any tower service), then configured. Layers added with [`Subscriber::layer`] wrap the
/// handler in the order added: the last one added runs first (outermost).
#[must_use]
pub struct Subscriber {
    pub(crate) name: String,
    pub(crate) topology: Topology,
    pub(crate) mode: TopologyMode,
    pub(crate) retry: RetryPolicy,
    pub(crate) policy: AckPolicy,
    pub(crate) fallback: ManualFallback,
    pub(crate) classifier: Arc<dyn Classify>,
    pub(crate) prefetch: u16,
    pub(crate) concurrency: usize,
    pub(crate) concurrency_set: bool,
    pub(crate) deadline: Option<Duration>,
    pub(crate) service: BoxDeliveryService,
    pub(crate) extensions: Extensions,
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
            .field("retry", &self.retry)
            .field("prefetch", &self.prefetch)
            .field("concurrency", &self.concurrency)
            .field("deadline", &self.deadline)
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
        Self::service(queue, handler_service(handler))
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
            classifier: Arc::new(DefaultClassifier),
            prefetch: DEFAULT_PREFETCH,
            concurrency: usize::from(DEFAULT_PREFETCH),
            concurrency_set: false,
            deadline: None,
            service: BoxCloneService::new(service.map_err(Into::into)),
            extensions: Extensions::default(),
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
    pub fn delivery_limit(mut self, n: u32) -> Self {
        self.topology.delivery_limit = n;
        self
    }

    /// An extra work-queue argument (checked for dead-letter cycles at startup).
    pub fn queue_argument(mut self, name: &str, value: impl Into<AMQPValue>) -> Self {
        self.topology
            .queue_arguments
            .insert(name.into(), value.into());
        self
    }

    /// Declare the topology (default) or only validate it passively.
    pub fn topology_mode(mut self, mode: TopologyMode) -> Self {
        self.mode = mode;
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
    pub fn manual_fallback(mut self, fallback: ManualFallback) -> Self {
        self.fallback = fallback;
        self
    }

    /// The error classifier.
    pub fn classifier(mut self, c: impl Classify) -> Self {
        self.classifier = Arc::new(c);
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

    /// A deadline per handler run; past it the run is a `timeout` failure (retried). Keep
    /// it well below the broker's consumer timeout (30 min by default).
    pub fn deadline(mut self, d: Duration) -> Self {
        self.deadline = Some(d);
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

    /// Checks names, retry policy and topology without a broker.
    pub fn validate(&self) -> crate::Result<()> {
        self.retry.validate()?;
        let mut t = self.topology.clone();
        t.tiers = self.retry.distinct_tiers();
        t.validate()
    }

    /// A copy for another queue (the registry hands one template to several entries).
    pub(crate) fn duplicate(&self) -> Subscriber {
        Subscriber {
            name: self.name.clone(),
            topology: self.topology.clone(),
            mode: self.mode,
            retry: self.retry.clone(),
            policy: self.policy,
            fallback: self.fallback,
            classifier: self.classifier.clone(),
            prefetch: self.prefetch,
            concurrency: self.concurrency,
            concurrency_set: self.concurrency_set,
            deadline: self.deadline,
            service: self.service.clone(),
            extensions: self.extensions.clone(),
        }
    }

    pub(crate) fn settle_spec(&self) -> SettleSpec {
        SettleSpec {
            queue: self.topology.queue.as_str().into(),
            handler: self.name.as_str().into(),
            retry: self.retry.clone(),
            classifier: self.classifier.clone(),
            policy: self.policy,
            fallback: self.fallback,
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
