//! Per-subscriber settlement counters.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($($(#[$m:meta])* $name:ident),* $(,)?) => {
        /// Live counters of one subscriber.
        #[derive(Debug, Default)]
        pub(crate) struct Counters { $(pub(crate) $name: AtomicU64,)* }

        /// A snapshot of a subscriber's counters.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct SubscriberStats { $($(#[$m])* pub $name: u64,)* }

        impl Counters {
            pub(crate) fn snapshot(&self) -> SubscriberStats {
                SubscriberStats { $($name: self.$name.load(Ordering::Relaxed),)* }
            }
        }
    };
}

counters! {
    /// Deliveries received.
    consumed,
    /// Originals acked (successes, and failures whose copy was confirmed).
    acked,
    /// Retry copies confirmed.
    retried,
    /// Parking copies confirmed.
    parked,
    /// Nacked with requeue (requested, fallback, shutdown stragglers, failed copies).
    requeued,
    /// Nacked without requeue.
    rejected,
    /// Copies not confirmed (returned, nacked, timed out, failed): original not acked.
    settlement_failures,
    /// Acks or nacks that found their channel gone (the broker redelivers).
    ack_lost,
    /// Handlers that panicked.
    panics,
    /// Handlers that ran past their deadline.
    timeouts,
    /// Manual handlers that returned without settling.
    unsettled,
}

impl Counters {
    pub(crate) fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}
