//! The worker's topology check: what `--check` runs.

use crate::connection::Connector;
use crate::error::{Error, Result};
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
        if self.subscribers.is_empty() {
            return Err(Error::Config(
                "a worker needs at least one subscriber".into(),
            ));
        }
        for s in &self.subscribers {
            s.validate()?;
        }
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
