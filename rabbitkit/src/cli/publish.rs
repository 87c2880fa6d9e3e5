//! `rabbitkit publish`: one message through the confirmed [`Publisher`].

use std::time::Duration;

use rabbitkit_core::amqp::{AMQPValue, LongString};

use super::args::PublishArgs;
use super::{Done, EXIT_FAILED, EXIT_OK, EXIT_USAGE, Io};
use crate::{ConnectionConfig, Envelope, Publisher, PublisherConfig};

pub(crate) async fn run(connection: &ConnectionConfig, args: PublishArgs, io: &mut Io<'_>) -> Done {
    let body = match (&args.body, &args.file) {
        (Some(b), _) => b.clone().into_bytes(),
        (None, Some(path)) => {
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?
        }
        (None, None) => Vec::new(),
    };
    let not_json = args
        .json
        .then(|| serde_json::from_slice::<serde_json::Value>(&body).err())
        .flatten();
    if let Some(e) = not_json {
        writeln!(io.err, "rabbitkit: --json, but the body is not JSON: {e}")?;
        return Ok(EXIT_USAGE);
    }
    let message_id = args
        .message_id
        .unwrap_or_else(|| rabbitkit_core::envelope::new_message_id().to_string());
    let mut envelope = Envelope::new(args.exchange.as_str(), args.routing_key.as_str(), body)
        .message_id(message_id.as_str());
    if args.json {
        envelope = envelope.content_type("application/json");
    }
    for (name, value) in args.headers {
        envelope = envelope.header(name, AMQPValue::LongString(LongString::from(value)));
    }
    let publisher = Publisher::new(connection.clone(), PublisherConfig::default())?;
    let outcome = publisher.publish(envelope).await;
    publisher.close(Duration::from_secs(5)).await;
    let outcome = outcome?;
    let line = format!(
        "{}: {outcome} (exchange {:?}, routing key {:?}, message id {message_id})",
        outcome.label(),
        args.exchange,
        args.routing_key
    );
    if outcome.is_confirmed() {
        writeln!(io.out, "{line}")?;
        Ok(EXIT_OK)
    } else {
        writeln!(io.err, "rabbitkit: not confirmed: {line}")?;
        Ok(EXIT_FAILED)
    }
}
