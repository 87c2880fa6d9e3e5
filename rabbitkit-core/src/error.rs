//! The one error type of the crate boundary.

use std::time::Duration;

/// A boxed error, used wherever a source error is carried.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// `Result` with rabbitkit's [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong outside a handler.
///
/// Failures *inside* a handler are not errors: they become an
/// [`Outcome`](crate::Outcome) and are settled.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A name (queue, exchange, routing key, header) is not valid AMQP.
    #[error("invalid {what} {value:?}: {reason}")]
    InvalidName {
        /// What kind of name it is.
        what: &'static str,
        /// The offending value (truncated when long).
        value: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// A message body is larger than the configured maximum.
    #[error("message body of {size} bytes exceeds the maximum of {max} bytes")]
    BodyTooLarge {
        /// The body size.
        size: usize,
        /// The configured limit.
        max: usize,
    },
    /// A header value cannot be sent (for example a float NaN or a nested value too deep).
    #[error("invalid header {name:?}: {reason}")]
    InvalidHeader {
        /// The header name.
        name: String,
        /// Why it was refused.
        reason: String,
    },
    /// The broker URL could not be parsed.
    #[error("invalid broker URL ({reason})")]
    InvalidUrl {
        /// Why it was refused (the URL itself is not printed: it may hold a password).
        reason: String,
    },
    /// A topology is refused before it is declared (it would lose messages).
    #[error("topology refused: {0}")]
    Topology(String),
    /// A work queue argument that a supported broker refuses at declare time, refused
    /// before anything is declared.
    #[error("queue {queue:?}: argument {argument} is refused: {reason}")]
    QueueArgument {
        /// The queue the argument was set on.
        queue: String,
        /// The argument's name, e.g. `x-queue-mode`.
        argument: String,
        /// Why, and what to use instead.
        reason: String,
    },
    /// A work queue rabbitkit did not declare (topology mode `validate` or `adopt`) does
    /// not have, in effect, a type or an argument rabbitkit needs (above all its dead-letter
    /// target, without which every rejection drops the message). Refused at start.
    #[error("work queue {queue:?}: {argument} {found}; {fix}")]
    WorkQueueMismatch {
        /// The work queue.
        queue: String,
        /// The argument (`x-dead-letter-exchange`, `x-queue-type`, ...).
        argument: String,
        /// What the broker has, and what rabbitkit expected.
        found: String,
        /// What to do about it (for a policy-settable argument, the `rabbitmqctl
        /// set_policy` command to run).
        fix: String,
    },
    /// The broker refused a declaration (for example 406 PRECONDITION_FAILED on inequivalent arguments).
    #[error("broker refused to declare {what}: {source}")]
    Declare {
        /// What was being declared.
        what: String,
        /// The broker's answer.
        #[source]
        source: BoxError,
    },
    /// The parking queue exists but could not be declared as asked, and everything else
    /// was declared; the channel the declaration ran on is closed. Either it is
    /// unavailable: the broker answered with 404 (a classic queue whose node is down) or
    /// did not answer in time; the worker consumes anyway (see GUARANTEES.md), the broker
    /// nacks parking copies until the queue is back, and their originals are requeued. Or
    /// it has another type or other arguments (406, e.g. the classic parking queue of an
    /// earlier release where a quorum one is now declared): it works, the worker uses it as
    /// it is and warns at start; [`Topology::migrate_parking`](crate::Topology::migrate_parking)
    /// replaces it.
    #[error("parking queue {queue:?} is unavailable: {source}")]
    ParkingUnavailable {
        /// The parking queue.
        queue: String,
        /// The broker's answer.
        #[source]
        source: BoxError,
    },
    /// A handler takes `State<T>` but no value of type `T` is registered (on the worker or
    /// the subscriber): every delivery would be parked.
    #[error(
        "subscriber {subscriber:?}: its handler takes State<{type_name}>, but no {type_name} is registered (Worker::state or Subscriber::state)"
    )]
    MissingState {
        /// The subscriber's name.
        subscriber: String,
        /// The missing type.
        type_name: &'static str,
    },
    /// A handler takes a `Settle` handle but its subscriber is not in manual ack mode:
    /// there would be no handle, and every delivery would be requeued.
    #[error(
        "subscriber {subscriber:?}: its handler takes a Settle handle, which needs ack policy manual (AckPolicy::Manual, ack = \"manual\")"
    )]
    SettleOutsideManual {
        /// The subscriber's name.
        subscriber: String,
    },
    /// A retry policy for an error kind (`on_kind`, `[subscribers.retry.kinds.KIND]`)
    /// names a kind no failure of the subscriber can carry: no registered
    /// [`ErrorKind`](crate::kind::ErrorKind) type lists it, it is not declared with
    /// [`Subscriber::kinds`](crate::Subscriber::kinds), and rabbitkit does not give it
    /// itself. The policy would never apply, and those failures would take the default
    /// schedule without a word. Refused at start.
    #[error(
        "subscriber {subscriber:?}: a retry policy names error kind {kind:?}, which no failure \
         of it can carry (registered error types: [{}]; known kinds: {}); register the type \
         that produces it (`.error_kind::<E>()`, or `error_kind = E` in #[subscriber]) or \
         declare an ad-hoc kind (`.kinds([\"{kind}\"])`, or `kinds = [\"{kind}\"]`)",
        registered.join(", "),
        known.join(", ")
    )]
    UnknownKind {
        /// The subscriber's name.
        subscriber: String,
        /// The kind the policy names.
        kind: String,
        /// The registered error types (`std::any::type_name`).
        registered: Vec<String>,
        /// The kinds its failures can carry, sorted.
        known: Vec<String>,
    },
    /// A configuration value is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A worker config file is invalid: which key, where, and why. The message never holds
    /// a password from the file.
    #[error("invalid config key `{key}` at line {line}, column {column}: {message}")]
    ConfigFile {
        /// The key's path, e.g. `subscribers[1].prefetch`.
        key: String,
        /// 1-based line of the offending key or value.
        line: usize,
        /// 1-based column of the offending key or value.
        column: usize,
        /// What is wrong.
        message: String,
    },
    /// A worker config names a handler that was not registered.
    #[error("no handler named {name:?} is registered (registered: {})", registered.join(", "))]
    UnknownHandler {
        /// The name the config asked for.
        name: String,
        /// The names that are registered, sorted.
        registered: Vec<String>,
    },
    /// The connection to the broker could not be opened or was lost.
    #[error("broker connection failed: {0}")]
    Connection(#[source] BoxError),
    /// A node refused the login or the vhost (403 ACCESS_REFUSED: user or password;
    /// 530 NOT_ALLOWED: no access to the vhost, or no such vhost). Not retried: users and
    /// permissions are cluster-wide, so every node would refuse.
    #[error(
        "access refused by {node}: {reason} (check the user, the password and its permissions on the vhost)"
    )]
    AccessRefused {
        /// `host:port` of the node that refused.
        node: String,
        /// The broker's reason (without any password).
        reason: String,
    },
    /// A TLS file (CA, client certificate or key) cannot be read, does not parse, or does
    /// not fit the others (a key that is not the certificate's). Found at start, before
    /// anything connects.
    #[error("TLS file {}: {reason}", file.display())]
    TlsFile {
        /// The file.
        file: std::path::PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The TLS handshake with a node failed on a certificate: the broker's did not verify
    /// (unknown CA, a name it is not valid for, expired), or the broker refused the
    /// client's. Not retried: another try, or another node of the cluster, would fail alike.
    #[error(
        "TLS with {node} failed: {reason} (check the CA file, the server name and the client certificate)"
    )]
    Tls {
        /// `host:port` of the node.
        node: String,
        /// Why.
        reason: String,
    },
    /// A plain `http://` management URL whose host is not loopback (`127.0.0.0/8`, `::1`,
    /// `localhost`): basic authentication would send the password in clear over the
    /// network. Refused before anything connects; allowed only explicitly
    /// ([`ManagementUrl::allow_plain_http`](crate::topology::ManagementUrl::allow_plain_http),
    /// `allow-plain-http = true` in `[topology]`, the CLI's `--allow-plain-http`).
    #[error(
        "plain http refused: the management API at {url} is not on this machine and the request would carry the password in clear; use https:// (rabbitkit's `tls` feature), or allow plain http explicitly (allow-plain-http)"
    )]
    PlainHttpRefused {
        /// The URL, without its password.
        url: String,
    },
    /// An `https://` management URL, and rabbitkit built without its `tls` feature.
    #[error(
        "the management API at {url} is https://, which needs rabbitkit built with its `tls` cargo feature"
    )]
    HttpsUnavailable {
        /// The URL, without its password.
        url: String,
    },
    /// No node answered within the time allowed; each node's last failure is listed.
    #[error("no broker node reachable after {after:?}: {nodes}")]
    Unreachable {
        /// How long the nodes were tried.
        after: Duration,
        /// `host:port: reason` of each node tried, `; `-separated.
        nodes: String,
    },
    /// No connection was available within the given time.
    #[error("not connected to the broker after {0:?}")]
    NotConnected(Duration),
    /// An AMQP operation failed.
    #[error("amqp operation failed: {0}")]
    Amqp(#[source] BoxError),
    /// The publisher (or worker) was closed: nothing more is sent.
    #[error("the {what} is closed")]
    Closed {
        /// What was closed.
        what: &'static str,
    },
    /// JSON encoding failed.
    #[error("json encoding failed: {0}")]
    Json(#[from] serde_json::Error),
}

impl Error {
    pub(crate) fn amqp(e: lapin::Error) -> Self {
        Error::Amqp(Box::new(e))
    }
}
