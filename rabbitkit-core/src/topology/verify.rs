//! Checking a work queue rabbitkit did not declare (topology modes `validate` and `adopt`):
//! its type and the arguments rabbitkit would have declared, in effect.
//!
//! A passive `queue.declare` reports only counts, never arguments. Two ways see more:
//!
//! - the management API (`GET /api/queues/{vhost}/{name}`): the type, the arguments and the
//!   effective policy. A dead-letter exchange set by a policy counts there. Used when a
//!   management URL is configured;
//! - otherwise a non-passive `queue.declare` of the (existing) queue with the expected
//!   arguments: the broker answers `406 PRECONDITION_FAILED` naming the first argument that
//!   differs ("inequivalent arg 'x-dead-letter-exchange' for queue 'q' in vhost '/':
//!   received the value '' of type 'longstr' but current is none") and closes the channel.
//!   The broker compares declared arguments only: a dead-letter exchange set by a policy
//!   is not one, so without the management API such a queue is refused, with a message
//!   saying that the policy could not be seen.

use lapin::Channel;
use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, FieldTable};
use serde_json::Value;

use super::mgmt::Management;
use super::{QueueType, Topology, declare_err, ls};
use crate::error::{Error, Result};
use crate::headers;

/// What [`Topology::apply_in`](super::Topology::apply_in) knows of the broker beyond the
/// channel: the vhost (for the commands it prints) and the management API, when configured.
#[derive(Default)]
pub(crate) struct Site {
    pub(crate) vhost: Option<String>,
    pub(crate) management: Option<Management>,
}

/// Queue arguments a policy can also set: the policy key is the argument without `x-`.
const POLICY_KEYS: &[&str] = &[
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-dead-letter-strategy",
    "x-overflow",
    "x-delivery-limit",
    "x-message-ttl",
    "x-expires",
    "x-max-length",
    "x-max-length-bytes",
];

/// One thing the work queue does not have.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mismatch {
    argument: String,
    found: String,
}

impl Topology {
    /// The type and arguments the work queue must have in effect: rabbitkit's, with the
    /// type always explicit (`x-queue-type = classic` is accepted by the broker for a
    /// classic queue declared without it, and RabbitMQ 3.13+ no longer compares a declare
    /// without a type against the queue's).
    pub(super) fn expected_work_arguments(&self) -> FieldTable {
        let mut a = self.work_arguments();
        if !a.inner().contains_key("x-queue-type") {
            let t = match self.queue_type {
                QueueType::Classic => "classic",
                QueueType::Quorum => "quorum",
            };
            a.insert("x-queue-type".into(), ls(t));
        }
        a
    }

    /// Checks the existing work queue against [`Topology::expected_work_arguments`]; a
    /// difference is [`Error::WorkQueueMismatch`], naming the queue, the argument and the
    /// fix. On `channel`, which the broker closes when it refuses the comparing declare.
    pub(super) async fn verify_work_queue(&self, channel: &Channel, site: &Site) -> Result<()> {
        let expected = self.expected_work_arguments();
        let (mismatch, policy) = match &site.management {
            Some(api) => {
                let Some(described) = api.queue(&self.queue).await? else {
                    // Deleted since the passive declare: the next start says it is missing.
                    return Err(Error::Topology(format!(
                        "work queue {:?} disappeared while it was checked",
                        self.queue
                    )));
                };
                let policy = described["policy"].as_str().map(str::to_owned);
                (mismatches(&described, &expected).into_iter().next(), policy)
            }
            None => {
                let opts = QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                };
                match channel
                    .queue_declare(self.queue.as_str().into(), opts, expected.clone())
                    .await
                {
                    Ok(_) => (None, None),
                    Err(e) if super::reply::reply_code(&e) == Some(406) => {
                        let text = super::reply::reply_text(&e);
                        (Some(from_refusal(&text)), None)
                    }
                    Err(e) => return Err(declare_err(format!("work queue {:?}", self.queue), e)),
                }
            }
        };
        let Some(m) = mismatch else {
            return Ok(());
        };
        let fix = self.fix(&m.argument, site, policy.as_deref());
        Err(Error::WorkQueueMismatch {
            queue: self.queue.clone(),
            argument: m.argument,
            found: m.found,
            fix,
        })
    }

    /// What to do about `argument`: the policy to apply, or the setting to change.
    fn fix(&self, argument: &str, site: &Site, policy: Option<&str>) -> String {
        if argument == "x-queue-type" {
            return "set this subscriber's queue type (queue-type) to the queue's, or move \
                    its messages to a new queue of the type rabbitkit declares"
                .into();
        }
        if !POLICY_KEYS.contains(&argument) {
            return format!(
                "{argument} cannot be set by a policy: the queue must be declared again with \
                 it (or drop it from this subscriber's queue arguments)"
            );
        }
        let command = policy_command(
            site.vhost.as_deref(),
            &self.queue,
            &self.policy_definition(),
        );
        let mut fix = format!("apply rabbitkit's dead-letter policy to it: {command}");
        match (policy, &site.management) {
            (Some(p), _) => fix.push_str(&format!(
                " (policy {p:?} applies to the queue now and only one policy applies to a \
                 queue: add these keys to its definition instead, or give this one a higher \
                 priority with --priority)"
            )),
            (None, None) => fix.push_str(
                " (if a policy already sets it: rabbitkit cannot see policies without the \
                 management API; set management-url in [topology] or \
                 Subscriber::management_url so the effective policy is read)",
            ),
            (None, Some(_)) => {}
        }
        fix
    }

    /// The policy definition that gives the work queue rabbitkit's policy-settable
    /// arguments, as JSON.
    pub fn policy_definition(&self) -> String {
        let mut pairs: Vec<(String, Value)> = self
            .work_arguments()
            .inner()
            .iter()
            .filter(|(k, _)| POLICY_KEYS.contains(&k.as_str()))
            .filter_map(|(k, v)| Some((k.as_str().trim_start_matches("x-").to_owned(), json(v)?)))
            .collect();
        // The dead-letter target first: it is what the reader looks for.
        pairs.sort_by_key(|(k, _)| {
            (
                !k.starts_with("dead-letter-e"),
                !k.starts_with("dead-letter-r"),
                k.clone(),
            )
        });
        let body: Vec<String> = pairs
            .iter()
            .map(|(k, v)| format!("{}:{v}", Value::String(k.clone())))
            .collect();
        format!("{{{}}}", body.join(","))
    }

    /// The `rabbitmqctl set_policy` command that gives the work queue rabbitkit's
    /// dead-letter target (and, for a quorum queue, its dead-letter strategy, overflow
    /// and delivery limit): what a team adopting rabbitkit on a queue it already runs
    /// applies once ([`TopologyMode::Adopt`](super::TopologyMode::Adopt)).
    pub fn policy_command(&self, vhost: &str) -> String {
        policy_command(Some(vhost), &self.queue, &self.policy_definition())
    }
}

/// `rabbitmqctl set_policy -p VHOST --apply-to queues rabbitkit-QUEUE '^QUEUE$' 'DEFINITION'`,
/// quoted for a POSIX shell.
fn policy_command(vhost: Option<&str>, queue: &str, definition: &str) -> String {
    format!(
        "rabbitmqctl set_policy -p {} --apply-to queues {} {} {}",
        vhost.map_or_else(|| "<vhost>".to_owned(), shell_quote),
        shell_quote(&format!("rabbitkit-{queue}")),
        shell_quote(&format!("^{}$", regex_escape(queue))),
        shell_quote(definition)
    )
}

/// The queue's differences from `expected`, as the management API describes it: the
/// `type`, and each argument from the queue's arguments or, failing that, its effective
/// policy (an argument wins over a policy for the dead-letter keys).
fn mismatches(described: &Value, expected: &FieldTable) -> Vec<Mismatch> {
    let mut out = Vec::new();
    let mut keys: Vec<_> = expected.inner().iter().collect();
    // The type first, then the dead-letter target: what matters most is named first.
    keys.sort_by_key(|(k, _)| {
        let k = k.as_str();
        (
            k != "x-queue-type",
            !k.starts_with("x-dead-letter-e"),
            !k.starts_with("x-dead-letter-r"),
            k.to_owned(),
        )
    });
    for (k, v) in keys {
        let k = k.as_str();
        let want = json(v);
        if k == "x-queue-type" {
            let has = described["type"].as_str().unwrap_or("unknown");
            if want.as_ref().and_then(Value::as_str) != Some(has) {
                out.push(Mismatch {
                    argument: k.to_owned(),
                    found: format!("is {has:?}, rabbitkit expects {}", show(want.as_ref())),
                });
            }
            continue;
        }
        let argument = described["arguments"].get(k);
        let policy = described["effective_policy_definition"].get(k.trim_start_matches("x-"));
        let (has, from) = match (argument, policy) {
            (Some(a), _) => (Some(a), "as an argument"),
            (None, Some(p)) => (Some(p), "by policy"),
            (None, None) => (None, ""),
        };
        if !same(has, want.as_ref()) {
            let found = match has {
                Some(h) => format!("is {h} {from}, rabbitkit expects {}", show(want.as_ref())),
                None => format!(
                    "is not set (neither as an argument nor by a policy), rabbitkit expects {}",
                    show(want.as_ref())
                ),
            };
            out.push(Mismatch {
                argument: k.to_owned(),
                found,
            });
        }
    }
    out
}

/// The argument and the difference named by a `406 PRECONDITION_FAILED` on a declare.
fn from_refusal(text: &str) -> Mismatch {
    let Some((argument, received, current)) = parse_inequivalent(text) else {
        return Mismatch {
            argument: "its declaration".into(),
            found: format!("is refused by the broker: {text}"),
        };
    };
    Mismatch {
        found: format!(
            "differs as an argument: the broker has {current}, rabbitkit expects {received}"
        ),
        argument,
    }
}

/// `(argument, received, current)` from the broker's "inequivalent arg 'A' for queue 'q'
/// in vhost 'v': received R but current is C".
fn parse_inequivalent(text: &str) -> Option<(String, String, String)> {
    let rest = text.split_once("inequivalent arg '")?.1;
    let (argument, rest) = rest.split_once('\'')?;
    let rest = rest.split_once(": received ")?.1;
    let (received, current) = rest.rsplit_once(" but current is ")?;
    Some((argument.to_owned(), received.to_owned(), current.to_owned()))
}

/// A queue argument as the management API shows it; `None` for what it cannot.
fn json(v: &AMQPValue) -> Option<Value> {
    if let Some(s) = headers::string(v) {
        return Some(Value::String(s));
    }
    if let Some(n) = headers::int(v) {
        return Some(Value::from(n));
    }
    match v {
        AMQPValue::Boolean(b) => Some(Value::Bool(*b)),
        _ => None,
    }
}

fn same(has: Option<&Value>, want: Option<&Value>) -> bool {
    match (has, want) {
        (Some(h), Some(w)) => match (h.as_i64(), w.as_i64()) {
            (Some(a), Some(b)) => a == b,
            _ => h == w,
        },
        (None, None) => true,
        _ => false,
    }
}

fn show(v: Option<&Value>) -> String {
    v.map_or_else(|| "no value".to_owned(), Value::to_string)
}

/// Single quotes for a POSIX shell.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// `s` matched literally in a policy pattern (an Erlang regular expression).
fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if r"\^$.|?*+()[]{}".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn classic() -> Topology {
        Topology::new("orders.v1")
    }

    #[test]
    fn the_broker_refusal_names_the_argument() {
        let text = "PRECONDITION_FAILED - inequivalent arg 'x-dead-letter-exchange' for queue \
                    'orders' in vhost '/': received the value '' of type 'longstr' but current is none";
        let (a, r, c) = parse_inequivalent(text).unwrap_or_default();
        assert_eq!(a, "x-dead-letter-exchange");
        assert_eq!(r, "the value '' of type 'longstr'");
        assert_eq!(c, "none");
        let m = from_refusal(text);
        assert_eq!(m.argument, "x-dead-letter-exchange");
        assert!(m.found.contains("the broker has none"), "{}", m.found);
        let other = from_refusal("PRECONDITION_FAILED - something else");
        assert!(other.found.contains("something else"), "{}", other.found);
    }

    #[test]
    fn the_policy_command_targets_only_the_queue_and_quotes_for_the_shell() {
        let t = classic();
        assert_eq!(
            t.policy_command("/"),
            r#"rabbitmqctl set_policy -p '/' --apply-to queues 'rabbitkit-orders.v1' '^orders\.v1$' '{"dead-letter-exchange":"","dead-letter-routing-key":"orders.v1.parking"}'"#
        );
        let mut q = Topology::new("it's");
        q.queue_type = QueueType::Quorum;
        let cmd = q.policy_command("prod");
        assert!(cmd.contains(r"'^it'\''s$'"), "{cmd}");
        assert!(
            cmd.contains(r#""delivery-limit":20,"dead-letter-strategy":"at-least-once","overflow":"reject-publish"}"#)
                || cmd.contains(r#""dead-letter-strategy":"at-least-once","delivery-limit":20,"overflow":"reject-publish"}"#),
            "{cmd}"
        );
        assert!(!cmd.contains("queue-type"), "{cmd}");
    }

    #[test]
    fn a_dead_letter_exchange_set_by_a_policy_counts() {
        let t = classic();
        let e = t.expected_work_arguments();
        let by_policy = json!({
            "type": "classic",
            "arguments": {},
            "policy": "dlx",
            "effective_policy_definition": {
                "dead-letter-exchange": "",
                "dead-letter-routing-key": "orders.v1.parking"
            }
        });
        assert_eq!(mismatches(&by_policy, &e), []);
        let as_arguments = json!({
            "type": "classic",
            "arguments": {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "orders.v1.parking"},
            "effective_policy_definition": null
        });
        assert_eq!(mismatches(&as_arguments, &e), []);
    }

    #[test]
    fn a_queue_without_dead_letter_exchange_or_of_another_type_is_named() {
        let t = classic();
        let e = t.expected_work_arguments();
        let bare = json!({"type": "classic", "arguments": {}, "effective_policy_definition": []});
        let m = mismatches(&bare, &e);
        assert_eq!(m[0].argument, "x-dead-letter-exchange");
        assert!(m[0].found.contains("not set"), "{}", m[0].found);
        let quorum = json!({
            "type": "quorum",
            "arguments": {"x-queue-type": "quorum"},
            "effective_policy_definition": {"dead-letter-exchange": "", "dead-letter-routing-key": "orders.v1.parking"}
        });
        assert_eq!(mismatches(&quorum, &e)[0].argument, "x-queue-type");
        let elsewhere = json!({
            "type": "classic",
            "arguments": {"x-dead-letter-exchange": "dlx"},
            "effective_policy_definition": {"dead-letter-exchange": "", "dead-letter-routing-key": "orders.v1.parking"}
        });
        let m = mismatches(&elsewhere, &e);
        assert_eq!(m[0].argument, "x-dead-letter-exchange");
        assert!(m[0].found.contains("as an argument"), "{}", m[0].found);
    }

    #[test]
    fn quorum_numbers_compare_by_value() {
        let mut q = classic();
        q.queue_type = QueueType::Quorum;
        let e = q.expected_work_arguments();
        let ok = json!({
            "type": "quorum",
            "arguments": {"x-queue-type": "quorum", "x-delivery-limit": 20},
            "effective_policy_definition": {
                "dead-letter-exchange": "", "dead-letter-routing-key": "orders.v1.parking",
                "dead-letter-strategy": "at-least-once", "overflow": "reject-publish"
            }
        });
        assert_eq!(mismatches(&ok, &e), []);
    }

    #[test]
    fn the_fix_says_what_could_not_be_checked_without_the_management_api() {
        let t = classic();
        let fix = t.fix("x-dead-letter-exchange", &Site::default(), None);
        assert!(fix.contains("rabbitmqctl set_policy -p <vhost>"), "{fix}");
        assert!(fix.contains("without the management API"), "{fix}");
        let fix = t.fix("x-dead-letter-exchange", &Site::default(), Some("ha"));
        assert!(fix.contains("policy \"ha\" applies"), "{fix}");
        assert!(
            t.fix("x-queue-type", &Site::default(), None)
                .contains("queue type")
        );
    }
}
