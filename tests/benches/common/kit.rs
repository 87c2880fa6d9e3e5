//! rabbitkit's side of the consume workloads: a `Worker` with one subscriber whose handler
//! succeeds (success path, acks one by one or coalesced) or always fails with one retry
//! tier (failure path).

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use lapin::Channel;
use rabbitkit_core::{
    BoxError, ConnectionConfig, QueueType, RetryPolicy, Subscriber, SubscriberStats, Worker,
};

use super::{Mark, Meter, PREFETCH};

/// The one retry tier: long enough that no copy comes back during a run, however long.
pub(crate) const TIER: Duration = Duration::from_secs(3600);

/// What a rabbitkit run does.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Spec {
    /// Every handler call fails: a confirmed retry copy, then the ack.
    pub(crate) fail: bool,
    /// The type of the delay tier the copies go to.
    pub(crate) tiers: QueueType,
    /// The type of the work queue (it must have been declared with this type).
    pub(crate) work: QueueType,
    /// Ack coalescing: flush at this many held acks or after this delay.
    pub(crate) coalesce: Option<(u16, Duration)>,
}

/// The ack coalescing the benches measure: the documented example, at most 32 acks held
/// (a sixth of the prefetch, so most of the window keeps flowing while a batch fills),
/// flushed after 5 ms at the latest. In one alternating run on RabbitMQ 3.10 it was as
/// fast as half the prefetch (100) on the multi-thread runtime and 27–29 % faster on the
/// current-thread one (docs/PROFILE.md, seventh pass).
pub(crate) const COALESCE: (u16, Duration) = (32, Duration::from_millis(5));

impl Spec {
    /// The success path on a classic work queue, one ack frame per message.
    pub(crate) const OK: Spec = Spec {
        fail: false,
        tiers: QueueType::Quorum,
        work: QueueType::Classic,
        coalesce: None,
    };

    /// The failure path with tiers of type `tiers`.
    pub(crate) const fn fail(tiers: QueueType) -> Spec {
        Spec {
            fail: true,
            tiers,
            work: QueueType::Classic,
            coalesce: None,
        }
    }

    /// The success path on a work queue of type `work`, acks coalesced or not.
    pub(crate) const fn ok(work: QueueType, coalesce: bool) -> Spec {
        Spec {
            fail: false,
            tiers: QueueType::Quorum,
            work,
            coalesce: if coalesce { Some(COALESCE) } else { None },
        }
    }
}

/// The tier queue the copies of a failing run on `queue` land in.
pub(crate) fn copies_queue(queue: &str, tiers: QueueType) -> String {
    rabbitkit_core::retry::tier_queue_of(queue, TIER, tiers)
}

fn subscriber(
    queue: &str,
    spec: Spec,
    first: Option<(Arc<OnceLock<Mark>>, Arc<Meter>)>,
) -> Subscriber {
    let fail = spec.fail;
    let handler = move || {
        let first = first.clone();
        async move {
            if let Some((f, meter)) = first {
                f.get_or_init(|| meter.mark());
            }
            if fail {
                Err::<(), BoxError>("bench failure".into())
            } else {
                Ok(())
            }
        }
    };
    let sub = Subscriber::new(queue, handler)
        .retry(RetryPolicy::new([TIER]))
        .tier_queue_type(spec.tiers)
        .queue_type(spec.work)
        .prefetch(PREFETCH);
    match spec.coalesce {
        Some((max_acks, max_delay)) => sub.ack_coalescing(max_acks, max_delay),
        None => sub,
    }
}

/// Starts and stops a worker on the (empty) `queue`: declares the whole topology for
/// `spec` (work queue, retry exchange, the tier of `spec.tiers`, parking).
pub(crate) async fn declare(url: &str, queue: &str, spec: Spec) {
    let h = Worker::new(ConnectionConfig::new(url.to_owned()))
        .subscribe(subscriber(queue, spec, None))
        .start()
        .await
        .expect("worker start (topology)");
    h.shutdown().await;
}

/// Deletes what [`declare`] declared, for both tier types.
pub(crate) async fn cleanup(admin: &Channel, queue: &str) {
    for q in [
        queue.to_owned(),
        copies_queue(queue, QueueType::Classic),
        copies_queue(queue, QueueType::Quorum),
        rabbitkit_core::retry::parking_queue(queue),
    ] {
        super::delete_queue(admin, &q).await;
    }
    super::delete_exchange(admin, &rabbitkit_core::retry::retry_exchange(queue)).await;
}

/// One measured rabbitkit run.
pub(crate) struct Run {
    /// At the handler's first call.
    pub(crate) start: Mark,
    /// When the stats first showed `n` settled.
    pub(crate) end: Mark,
    /// Resident set when `checkpoint` messages were settled, MiB.
    pub(crate) rss_at_checkpoint: Option<f64>,
    /// Resident set at `end`, MiB.
    pub(crate) rss_at_end: f64,
}

/// Consumes `n` preloaded messages from `queue` with a rabbitkit worker on the current
/// runtime. The window runs from the handler's first call to the first stats reading
/// with `n` acked (and, failing, `n` retried); the reading is taken every millisecond,
/// which the process CPU of the window includes (a few µs per reading).
pub(crate) async fn run(
    url: &str,
    queue: &str,
    spec: Spec,
    n: usize,
    meter: Arc<Meter>,
    checkpoint: Option<usize>,
) -> Run {
    let first: Arc<OnceLock<Mark>> = Arc::new(OnceLock::new());
    let sub = subscriber(queue, spec, Some((first.clone(), meter.clone())));
    let handle = Worker::new(ConnectionConfig::new(url.to_owned()))
        .subscribe(sub)
        .start()
        .await
        .expect("worker start");
    let settled = |s: &SubscriberStats| {
        let done = if spec.fail {
            s.acked.min(s.retried)
        } else {
            s.acked
        };
        done as usize
    };
    // Generous: a 1M-message run on a slow machine.
    let deadline = Instant::now() + Duration::from_secs(120 + (n / 500) as u64);
    let mut rss_at_checkpoint = None;
    let end = loop {
        let s = handle.stats(queue).expect("stats");
        let done = settled(&s);
        if done >= n {
            break meter.mark();
        }
        if let Some(c) = checkpoint
            && rss_at_checkpoint.is_none()
            && done >= c
        {
            rss_at_checkpoint = Some(super::rss_mib());
        }
        assert!(Instant::now() < deadline, "worker stalled: {s:?}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    let rss_at_end = super::rss_mib();
    let report = handle.shutdown().await;
    let s = report.subscribers[queue];
    assert_eq!(s.consumed as usize, n, "consumed: {s:?}");
    assert_eq!(s.settlement_failures, 0, "{s:?}");
    Run {
        start: first.get().cloned().expect("handler never ran"),
        end,
        rss_at_checkpoint,
        rss_at_end,
    }
}
