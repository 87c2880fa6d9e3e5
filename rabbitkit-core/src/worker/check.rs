//! The worker's topology check: what `--check` runs.

use crate::connection::Connector;
use crate::error::Result;
use crate::topology::TopologyReport;

use super::Worker;

impl Worker {
    /// Connects and checks, without declaring anything, that every subscriber's exchanges
    /// and queues exist with the kind and arguments [`Worker::start`] would declare. The
    /// report lists what is missing or differs ([`TopologyReport::is_ok`]); an error means
    /// the check could not run (bad subscriber, broker unreachable, a refusal other than
    /// "missing" or "different"). Bindings are not checked: AMQP has no passive binding
    /// check.
    pub async fn check_topology(&self) -> Result<TopologyReport> {
        self.validate()?;
        let connector = Connector::new(self.connection.clone(), "rabbitkit-check")?;
        let conn = connector.get(self.connection.connect_timeout).await?;
        let mut report = TopologyReport::default();
        let mut result = Ok(());
        for s in &self.subscribers {
            match s
                .full_topology()
                .check_on(&conn.conn, s.handler_name())
                .await
            {
                Ok(objects) => {
                    report.objects.extend(objects);
                    report
                        .unchecked_bindings
                        .extend(s.topology().unchecked_bindings());
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        connector.close().await;
        result.map(|()| report)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::connection::ConnectionConfig;
    use crate::error::Error;
    use crate::outcome::Outcome;
    use crate::subscriber::Subscriber;
    use crate::worker::Worker;

    #[tokio::test]
    async fn check_topology_refuses_duplicate_names_before_connecting() {
        let ok = || async { Outcome::Ack };
        // Nothing listens there: an error other than the refusal means it tried to connect.
        let mut cc = ConnectionConfig::new("amqp://127.0.0.1:1/%2f");
        cc.connect_timeout = Duration::from_millis(200);
        let w = Worker::new(cc)
            .subscribe(Subscriber::new("a", ok).name("same"))
            .subscribe(Subscriber::new("b", ok).name("same"));
        let err = w.check_topology().await;
        assert!(
            matches!(&err, Err(Error::Config(m)) if m.contains("two subscribers")),
            "{err:?}"
        );
    }
}
