//! The handler registry: subscribers by name, for a config file to pick from.

use std::collections::BTreeMap;

use tower::Service;

use crate::delivery::Delivery;
use crate::error::BoxError;
use crate::handler::Handler;
use crate::outcome::Outcome;
use crate::subscriber::{IntoSubscriber, Subscriber};

/// Handlers registered by name. A config's `[[subscribers]]` table names one with
/// `handler = "..."`; its keys then override what the registered subscriber has (queue,
/// bindings, policies). The same handler may serve several config entries.
///
/// Everything registered is a [`Subscriber`], so settlement is the worker's own whatever
/// was registered: an async fn with extractors, a tower service, a `#[subscriber]`
/// function, or a subscriber built by hand (with its layers, classifier and state).
///
/// ```
/// # use rabbitkit_core::config::Handlers;
/// # use rabbitkit_core::{extract::Body, Subscriber, Outcome, RetryPolicy};
/// async fn greet(Body(b): Body) -> Result<(), std::io::Error> { Ok(()) }
/// let handlers = Handlers::new()
///     .handler("greet", greet)
///     .service("noop", tower::service_fn(|_d| async { Ok::<_, std::io::Error>(Outcome::Ack) }))
///     .subscriber("strict", Subscriber::new("ignored", greet).retry(RetryPolicy::none()));
/// assert_eq!(handlers.names().collect::<Vec<_>>(), ["greet", "noop", "strict"]);
/// ```
#[derive(Default)]
#[must_use]
pub struct Handlers {
    map: BTreeMap<String, Subscriber>,
    twice: Vec<String>,
}

impl std::fmt::Debug for Handlers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handlers")
            .field("names", &self.map.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Handlers {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers an async fn handler (its arguments are extractors) under `name`.
    pub fn handler<H, Args>(self, name: impl Into<String>, handler: H) -> Self
    where
        H: Handler<Args>,
        Args: 'static,
    {
        self.subscriber(name, Subscriber::new(String::new(), handler))
    }

    /// Registers a tower service from [`Delivery`] to [`Outcome`] under `name`.
    pub fn service<S>(self, name: impl Into<String>, service: S) -> Self
    where
        S: Service<Delivery, Response = Outcome> + Clone + Send + 'static,
        S::Error: Into<BoxError>,
        S::Future: Send + 'static,
    {
        self.subscriber(name, Subscriber::service(String::new(), service))
    }

    /// Registers a subscriber (a `#[subscriber]` function, or one built by hand) under
    /// `name`. Its settings are the defaults the config overrides; its queue is replaced by
    /// the config's.
    pub fn subscriber(mut self, name: impl Into<String>, s: impl IntoSubscriber) -> Self {
        let name = name.into();
        if self.map.insert(name.clone(), s.into_subscriber()).is_some() {
            self.twice.push(name);
        }
        self
    }

    /// The registered names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.map.keys().map(String::as_str)
    }

    pub(crate) fn get(&self, name: &str) -> Option<&Subscriber> {
        self.map.get(name)
    }

    pub(crate) fn registered_twice(&self) -> Option<&str> {
        self.twice.first().map(String::as_str)
    }
}
