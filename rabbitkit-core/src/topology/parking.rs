//! The parking queue's type: quorum (replicated) wherever the topology uses quorum queues,
//! with a delivery limit that browsing can never reach; and a parking queue of another
//! shape (the classic one of earlier releases) kept working until it is migrated.
//!
//! Browsing a parking queue (`Parking::peek`, `rabbitkit parking list`, the passed-over
//! messages of a replay) takes messages unacked and requeues them. On a quorum queue each
//! requeue counts toward its delivery limit on RabbitMQ 3.10–4.2 (on 4.3 a `basic.nack`
//! does not count, a `basic.reject` does), and a message past the limit is dropped or
//! dead-lettered. Measured here (one message, `basic.get` then nack or reject with requeue,
//! 30 times): `x-delivery-limit = -1` drops it after one requeue on 3.10.8 (it disables the
//! limit only on 4.x); `0` drops it after one requeue on 3.10 and 4.0; `2147483647`
//! (`i32::MAX`) keeps it through 30 nacks and 30 rejects on 3.10.8, 4.0.5 and 4.3.6. So
//! the parking queue is declared with that limit, which no browsing ever reaches (about
//! 2·10⁹ requeues), and with no dead-letter target: nothing ever leaves parking but by a
//! replay or a purge. No broker version is detected: the same arguments work on every line.

use lapin::Connection;
use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, FieldTable};

use super::{PARKING_DECLARE_TIMEOUT, QueueType, Topology, ls};
use crate::error::Error;

/// `x-delivery-limit` of a quorum parking queue: a limit no browsing reaches. `-1` (no
/// limit on 4.x) drops a message after its first requeue on 3.10, so it is not used.
pub(crate) const PARKING_DELIVERY_LIMIT: i32 = i32::MAX;

/// The arguments of a parking queue of type `t`: none for a classic one.
pub(crate) fn parking_arguments(t: QueueType) -> FieldTable {
    let mut a = FieldTable::default();
    if t == QueueType::Quorum {
        a.insert("x-queue-type".into(), ls("quorum"));
        a.insert(
            "x-delivery-limit".into(),
            AMQPValue::LongInt(PARKING_DELIVERY_LIMIT),
        );
    }
    a
}

/// The parking queue exists with another type or other arguments than this release
/// declares (the broker answered `406 PRECONDITION_FAILED`): typically the classic
/// parking queue of an earlier release, where a quorum one is now declared. It is used as
/// it is; `rabbitkit parking migrate` ([`Topology::migrate_parking`]) replaces it.
#[derive(Debug, thiserror::Error)]
#[error(
    "parking queue {queue:?} exists with another type or other arguments than declared (the broker says: {broker}); it is used as it is"
)]
pub(crate) struct OtherParkingQueue {
    pub(crate) queue: String,
    pub(crate) broker: String,
}

/// True when `e` is the fallback to an existing parking queue of another shape.
pub(crate) fn is_other_parking_queue(e: &Error) -> bool {
    matches!(e, Error::ParkingUnavailable { source, .. } if source.is::<OtherParkingQueue>())
}

impl Topology {
    /// The type of the parking queue: quorum when the work queue or the delay tiers are
    /// quorum (the default tiers are: so is the default parking queue), classic only for
    /// an all-classic topology (the shape of earlier releases, or a broker without quorum
    /// queues). A quorum parking queue keeps what it holds through the loss of a node; a
    /// classic one is lost with its node's disk.
    pub fn parking_queue_type(&self) -> QueueType {
        if self.queue_type == QueueType::Quorum || self.tier_queue_type == QueueType::Quorum {
            QueueType::Quorum
        } else {
            QueueType::Classic
        }
    }

    /// The arguments the parking queue is declared with: for a quorum one
    /// `x-queue-type = quorum` and `x-delivery-limit = 2147483647` (browsing requeues, and
    /// no browsing reaches that limit on any RabbitMQ line), no dead-letter target; none
    /// for a classic one.
    pub fn parking_arguments(&self) -> FieldTable {
        parking_arguments(self.parking_queue_type())
    }

    /// At a worker's start (not on its reconnects): when the parking queue exists with
    /// another shape than this topology declares (a classic parking queue of an earlier
    /// release), says so once,
    /// naming the queue, what it holds and the command that migrates it. The queue is
    /// used as it is meanwhile. Looked at on channels of its own (a refused declare closes
    /// the channel).
    pub(crate) async fn warn_other_parking_queue(&self, conn: &Connection) {
        let parking = self.parking_queue();
        let Ok(ch) = conn.create_channel().await else {
            return;
        };
        let declare = ch.queue_declare(
            parking.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            self.parking_arguments(),
        );
        let broker = match tokio::time::timeout(PARKING_DECLARE_TIMEOUT, declare).await {
            Ok(Ok(_)) => {
                let _ = ch.close(200, "rabbitkit parking check".into()).await;
                return;
            }
            Ok(Err(e)) if super::reply::reply_code(&e) == Some(406) => super::reply::reply_text(&e),
            // Unavailable or not answering: the apply step already said so.
            Ok(Err(_)) | Err(_) => return,
        };
        // The fallback: the existing queue, seen on a fresh channel.
        let messages = match conn.create_channel().await {
            Ok(ch) => {
                let passive = QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                };
                match ch
                    .queue_declare(parking.as_str().into(), passive, FieldTable::default())
                    .await
                {
                    Ok(q) => {
                        let _ = ch.close(200, "rabbitkit parking check".into()).await;
                        Some(q.message_count())
                    }
                    Err(_) => None,
                }
            }
            Err(_) => None,
        };
        let command = format!("rabbitkit parking migrate {}", self.queue);
        match self.parking_queue_type() {
            QueueType::Quorum => tracing::warn!(
                queue = %self.queue,
                parking_queue = %parking,
                messages = ?messages,
                broker = %broker,
                command = %command,
                "the parking queue is not the quorum queue this release declares (a classic parking queue of an earlier release?): it is used as it is, and what it holds is lost with its node's disk; move it into a quorum parking queue with the migrate command (stop the workers of earlier releases first)"
            ),
            QueueType::Classic => tracing::warn!(
                queue = %self.queue,
                parking_queue = %parking,
                messages = ?messages,
                broker = %broker,
                "the parking queue has another type or other arguments than this all-classic topology declares: it is used as it is"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers;

    #[test]
    fn parking_is_quorum_with_a_limit_browsing_never_reaches_unless_all_classic() {
        let t = Topology::new("orders");
        assert_eq!(
            t.parking_queue_type(),
            QueueType::Quorum,
            "default tiers are quorum"
        );
        let a = t.parking_arguments();
        assert_eq!(
            a.inner()
                .get("x-queue-type")
                .and_then(headers::string)
                .as_deref(),
            Some("quorum")
        );
        assert_eq!(
            a.inner().get("x-delivery-limit"),
            Some(&AMQPValue::LongInt(i32::MAX))
        );
        assert!(!a.inner().contains_key("x-dead-letter-exchange"));
        let mut c = Topology::new("orders");
        c.tier_queue_type = QueueType::Classic;
        assert_eq!(c.parking_queue_type(), QueueType::Classic);
        assert!(c.parking_arguments().inner().is_empty());
        c.queue_type = QueueType::Quorum;
        assert_eq!(c.parking_queue_type(), QueueType::Quorum);
    }

    #[test]
    fn the_fallback_is_told_apart_from_an_unavailable_queue() {
        let other = Error::ParkingUnavailable {
            queue: "orders.parking".into(),
            source: Box::new(OtherParkingQueue {
                queue: "orders.parking".into(),
                broker: "PRECONDITION_FAILED".into(),
            }),
        };
        assert!(is_other_parking_queue(&other));
        let down = Error::ParkingUnavailable {
            queue: "orders.parking".into(),
            source: "no answer".into(),
        };
        assert!(!is_other_parking_queue(&down));
    }
}
