//! The confirmed publisher against a real broker.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use lapin::types::{AMQPValue, FieldTable};
use rabbitkit_core::{
    ConnectionConfig, Envelope, Error, PublishOutcome, Publisher, PublisherConfig,
};
use rabbitkit_tests::proxy::{Mode, Proxy};
use rabbitkit_tests::{Broker, table, wait_until};

fn publisher(url: String, cfg: PublisherConfig) -> Publisher {
    Publisher::new(ConnectionConfig::new(url), cfg).unwrap()
}

fn reject_publish() -> FieldTable {
    table(&[
        ("x-max-length", AMQPValue::LongInt(0)),
        ("x-overflow", AMQPValue::LongString("reject-publish".into())),
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn routable_is_confirmed_unroutable_is_returned_full_queue_is_nacked() {
    let vh = Broker::from_env().vhost("pub-basic");
    vh.declare_queue("ok", FieldTable::default()).await;
    vh.declare_queue("full", reject_publish()).await;
    let p = publisher(vh.url(), PublisherConfig::default());

    let ok = p.publish(Envelope::new("", "ok", "a")).await.unwrap();
    assert!(ok.is_confirmed(), "{ok}");
    let ret = p.publish(Envelope::new("", "nowhere", "b")).await.unwrap();
    assert!(
        matches!(
            ret,
            PublishOutcome::Returned {
                reply_code: 312,
                ..
            }
        ),
        "unroutable mandatory must be Returned, got {ret}"
    );
    assert!(!ret.is_confirmed());
    let nack = p.publish(Envelope::new("", "full", "c")).await.unwrap();
    assert!(matches!(nack, PublishOutcome::Nacked), "got {nack}");
    assert_eq!(vh.depth("ok").await, 1);
    assert_eq!(vh.depth("full").await, 0);
    let s = p.stats();
    assert_eq!((s.confirmed, s.returned, s.nacked), (1, 1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_mixed_publishes_are_attributed_exactly() {
    let vh = Broker::from_env().vhost("pub-stress");
    vh.declare_queue("ok", FieldTable::default()).await;
    vh.declare_queue("full", reject_publish()).await;
    let p = publisher(
        vh.url(),
        PublisherConfig {
            max_in_flight: 16,
            ..Default::default()
        },
    );
    let tasks = 32;
    let per_task = 120;
    let mut joins = Vec::new();
    for t in 0..tasks {
        let p = p.clone();
        joins.push(tokio::spawn(async move {
            let mut wrong = 0u32;
            for i in 0..per_task {
                let (rk, kind) = match (t + i) % 3 {
                    0 => ("ok", 0),
                    1 => ("nowhere", 1),
                    _ => ("full", 2),
                };
                let o = p
                    .publish(Envelope::new("", rk, vec![7u8; 64]))
                    .await
                    .unwrap();
                let good = match kind {
                    0 => o.is_confirmed(),
                    1 => matches!(o, PublishOutcome::Returned { .. }),
                    _ => matches!(o, PublishOutcome::Nacked),
                };
                if !good {
                    wrong += 1;
                }
            }
            wrong
        }));
    }
    let mut wrong = 0;
    for j in joins {
        wrong += j.await.unwrap();
    }
    assert_eq!(wrong, 0, "misattributed outcomes");
    let s = p.stats();
    let expect_ok = (0..tasks)
        .flat_map(|t| (0..per_task).map(move |i| (t + i) % 3))
        .filter(|k| *k == 0)
        .count() as u64;
    assert_eq!(s.confirmed, expect_ok);
    assert_eq!(
        u64::from(vh.depth("ok").await),
        expect_ok,
        "queue count agrees with confirms"
    );
    assert!(p.in_flight() == 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn publish_many_streams_every_outcome() {
    let vh = Broker::from_env().vhost("pub-many");
    vh.declare_queue("ok", FieldTable::default()).await;
    let p = publisher(
        vh.url(),
        PublisherConfig {
            max_in_flight: 8,
            ..Default::default()
        },
    );
    use futures_util::StreamExt;
    let envs = (0..200).map(|i| Envelope::new("", if i % 10 == 0 { "nowhere" } else { "ok" }, "m"));
    let outcomes: Vec<_> = p.publish_many(envs).collect().await;
    assert_eq!(outcomes.len(), 200);
    for (i, o) in &outcomes {
        let o = o.as_ref().unwrap();
        if i % 10 == 0 {
            assert!(matches!(o, PublishOutcome::Returned { .. }), "#{i}: {o}");
        } else {
            assert!(o.is_confirmed(), "#{i}: {o}");
        }
    }
    assert_eq!(vh.depth("ok").await, 180);
}

/// The trap lapin sets with several mandatory publishes in flight on one channel: a
/// `basic.return` rides on whichever confirm lapin resolves next, often another message's.
/// One channel, a wide window, routable (fsync-delayed, so acks come in multi-ack batches),
/// unroutable and nacked publishes interleaved: every outcome must name its own message.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_channel_many_mandatory_in_flight_are_attributed_exactly() {
    use futures_util::StreamExt;
    let vh = Broker::from_env().vhost("pub-one-channel");
    vh.declare_queue("ok", FieldTable::default()).await;
    vh.declare_queue("full", reject_publish()).await;
    let p = publisher(
        vh.url(),
        PublisherConfig {
            max_in_flight: 512,
            channels: 1,
            ..Default::default()
        },
    );
    let n = 6000usize;
    // A pattern without period 2 or 3, so neighbours differ in every combination.
    let kind = |i: usize| match (i * 7 + i / 5) % 5 {
        0..=2 => 0,
        3 => 1,
        _ => 2,
    };
    let envs = (0..n).map(move |i| {
        let rk = ["ok", "nowhere", "full"][kind(i)];
        // Mostly transient: their confirms come as fast as the returns' ones, so the broker
        // folds routable and returned publishes into one multi-ack (where lapin hands a
        // return to whichever confirm of the batch it resolves first).
        Envelope::new("", rk, vec![1u8; 256])
            .message_id(format!("m-{i}"))
            .persistent(i % 4 == 0)
    });
    let outcomes: Vec<_> = p.publish_many(envs).collect().await;
    assert_eq!(outcomes.len(), n);
    let mut wrong = Vec::new();
    let mut counts = [0u64; 3];
    for (i, o) in &outcomes {
        let o = o.as_ref().unwrap();
        let good = match kind(*i) {
            0 => o.is_confirmed(),
            1 => matches!(
                o,
                PublishOutcome::Returned {
                    reply_code: 312,
                    ..
                }
            ),
            _ => matches!(o, PublishOutcome::Nacked),
        };
        counts[kind(*i)] += 1;
        if !good {
            wrong.push(format!("#{i} (kind {}): {o}", kind(*i)));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} misattributed: {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(10)]
    );
    let s = p.stats();
    assert_eq!(
        (s.confirmed, s.returned, s.nacked),
        (counts[0], counts[1], counts[2])
    );
    assert_eq!(
        u64::from(vh.depth("ok").await),
        counts[0],
        "queue depth agrees with confirms"
    );
    assert_eq!(p.in_flight(), 0);
}

/// Returns are attributed by message id (and a publish token when one id is in flight
/// twice on a channel): many publishes sharing a few ids, half unroutable, each exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn publishes_sharing_a_message_id_are_each_attributed() {
    let vh = Broker::from_env().vhost("pub-same-id");
    vh.declare_queue("ok", FieldTable::default()).await;
    let p = publisher(
        vh.url(),
        PublisherConfig {
            max_in_flight: 64,
            channels: 1,
            ..Default::default()
        },
    );
    let mut pending = Vec::new();
    for i in 0..200 {
        let rk = if i % 2 == 0 { "ok" } else { "nowhere" };
        let env = Envelope::new("", rk, "same").message_id(format!("dup-{}", i % 4));
        pending.push((i, p.send(env).await.unwrap()));
    }
    for (i, confirm) in pending {
        let o = confirm.await;
        if i % 2 == 0 {
            assert!(o.is_confirmed(), "#{i}: {o}");
        } else {
            assert!(matches!(o, PublishOutcome::Returned { .. }), "#{i}: {o}");
        }
    }
    assert_eq!(vh.depth("ok").await, 100);
}

/// Publishes sharing a message id do not wait for each other's confirm (retry copies keep
/// the original's id: waiting would serialise a worker's settlement), and each one's
/// outcome is still exact. The broker's replies are held by a proxy: every publish must be
/// written and awaiting its confirm at once. A forged publish token on an envelope is
/// replaced, so a returned message is never filed under a token the lane did not write.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn publishes_sharing_a_message_id_do_not_wait_for_each_other() {
    let vh = Broker::from_env().vhost("pub-same-id-held");
    vh.declare_queue("ok", FieldTable::default()).await;
    let proxy = Proxy::start(&vh.hostport(), Mode::Forward).await;
    let p = publisher(
        proxy.url("guest:guest", &vh.name),
        PublisherConfig {
            max_in_flight: 64,
            channels: 1,
            ..Default::default()
        },
    );
    assert!(
        p.publish(Envelope::new("", "ok", "warm-up"))
            .await
            .unwrap()
            .is_confirmed()
    );
    proxy.set(Mode::Freeze);
    let mut pending = Vec::new();
    for i in 0..20 {
        let rk = if i % 2 == 0 { "ok" } else { "nowhere" };
        let mut env = Envelope::new("", rk, "same").message_id("one-id");
        if i % 3 == 0 {
            env = env.header("x-rabbitkit-publish-token", AMQPValue::LongLongInt(7));
        }
        pending.push((i, p.send(env).await.unwrap()));
    }
    wait_until(
        Duration::from_secs(5),
        "all 20 same-id publishes written and awaiting their confirms",
        || async { p.stats().unconfirmed == 20 },
    )
    .await;
    proxy.set(Mode::Forward);
    for (i, confirm) in pending {
        let o = confirm.await;
        if i % 2 == 0 {
            assert!(o.is_confirmed(), "#{i}: {o}");
        } else {
            assert!(
                matches!(
                    o,
                    PublishOutcome::Returned {
                        reply_code: 312,
                        ..
                    }
                ),
                "#{i}: {o}"
            );
        }
    }
    assert_eq!(vh.depth("ok").await, 11);
    assert_eq!(p.stats().unconfirmed, 0);
}

/// Several channels: the window is shared (by every channel and every batch), every
/// outcome is still exact, and a `channels = 0` config is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn several_channels_share_one_window() {
    use futures_util::StreamExt;
    let vh = Broker::from_env().vhost("pub-lanes");
    vh.declare_queue("ok", FieldTable::default()).await;
    let bad = Publisher::new(
        ConnectionConfig::new(vh.url()),
        PublisherConfig {
            channels: 0,
            ..Default::default()
        },
    );
    assert!(matches!(bad, Err(Error::Config(_))));
    let p = publisher(
        vh.url(),
        PublisherConfig {
            max_in_flight: 32,
            channels: 3,
            ..Default::default()
        },
    );
    let envs =
        || (0..900).map(|i| Envelope::new("", if i % 4 == 0 { "nowhere" } else { "ok" }, "x"));
    // Two batches at once, their passes spread over the three channels, under one window.
    let one = Box::pin(p.publish_many(envs()));
    let other = Box::pin(p.publish_many(envs()));
    let mut both = futures_util::stream::select(one, other);
    let mut peak = 0;
    let mut seen = 0;
    while let Some((i, o)) = both.next().await {
        // Counted by the lanes as they write, not derived from the window.
        peak = peak.max(p.stats().unconfirmed);
        let o = o.unwrap();
        if i % 4 == 0 {
            assert!(matches!(o, PublishOutcome::Returned { .. }), "#{i}: {o}");
        } else {
            assert!(o.is_confirmed(), "#{i}: {o}");
        }
        seen += 1;
    }
    assert_eq!(seen, 1800);
    assert!(peak <= 32, "window exceeded: {peak}");
    assert_eq!(vh.depth("ok").await, 1350);
    assert_eq!(p.in_flight(), 0);
}

/// The publisher connection's open channels in `vh` (rabbitmqctl: no statistics delay).
fn channels_in(vh: &rabbitkit_tests::Vhost) -> usize {
    vh.broker
        .ctl(&["list_channels", "-q", "--no-table-headers", "vhost"])
        .lines()
        .filter(|l| l.trim() == vh.name)
        .count()
}

/// A batch goes out on the publisher's channel (no channel of its own), in its order with
/// `channels = 1`, each outcome exact. A stream dropped half-way publishes nothing more,
/// but what it handed over is made, confirmed and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_goes_out_in_order_on_the_publisher_channel() {
    use futures_util::StreamExt;
    let vh = Broker::from_env().vhost("pub-batch");
    vh.declare_queue("ok", FieldTable::default()).await;
    let p = publisher(
        vh.url(),
        PublisherConfig {
            max_in_flight: 64,
            channels: 1,
            ..Default::default()
        },
    );
    let batch = |tag: &'static str, n: usize| {
        (0..n).map(move |i| {
            let rk = if i % 7 == 3 { "nowhere" } else { "ok" };
            Envelope::new("", rk, format!("{tag}-{i}")).message_id(format!("{tag}-{i}"))
        })
    };
    for tag in ["first", "second"] {
        let outcomes: Vec<_> = p.publish_many(batch(tag, 300)).collect().await;
        assert_eq!(outcomes.len(), 300);
        for (i, o) in &outcomes {
            let o = o.as_ref().unwrap();
            if i % 7 == 3 {
                assert!(
                    matches!(
                        o,
                        PublishOutcome::Returned {
                            reply_code: 312,
                            ..
                        }
                    ),
                    "{tag} #{i}: {o}"
                );
            } else {
                assert!(o.is_confirmed(), "{tag} #{i}: {o}");
            }
        }
        let got = vh.get_all("ok", 1000).await;
        let bodies: Vec<String> = got
            .iter()
            .map(|g| String::from_utf8_lossy(&g.body).into_owned())
            .collect();
        let expected: Vec<String> = (0..300)
            .filter(|i| i % 7 != 3)
            .map(|i| format!("{tag}-{i}"))
            .collect();
        assert_eq!(
            bodies, expected,
            "{tag}: the batch is in the queue in its order"
        );
        assert_eq!(
            channels_in(&vh),
            1,
            "{tag}: the publisher's one channel, no other"
        );
    }
    let s = p.stats();
    assert_eq!((s.sent, s.confirmed, s.returned), (600, 514, 86));

    // Dropped after 10 outcomes: the rest of what it handed over is still made.
    let mut stream = Box::pin(p.publish_many(batch("third", 1000)));
    for _ in 0..10 {
        let (i, o) = stream.next().await.unwrap();
        assert!(o.is_ok(), "#{i}");
    }
    drop(stream);
    wait_until(
        Duration::from_secs(10),
        "every publish handed over is reported",
        || async { p.in_flight() == 0 },
    )
    .await;
    let s = p.stats();
    let handed = s.sent - 600;
    // At least what was yielded; outcomes taken but not yet yielded free slots the same
    // poll refills, so the bound above is the batch, not the window.
    assert!((10..1000).contains(&handed), "handed over: {handed}");
    assert_eq!(
        s.confirmed + s.returned,
        s.sent,
        "all confirmed or returned: {s:?}"
    );
    assert_eq!(u64::from(vh.depth("ok").await), s.confirmed - 514);
    assert_eq!(s.unconfirmed, 0);
}

/// A batch whose stream is not polled does not hold the window: its publishes are made and
/// their slots freed by the channel's task, and it does not queue for a slot while it has
/// publishes in flight (a queued wait is handed a freed slot even unpolled), so other
/// publishes, and another batch, go on. A window of one makes any slot held show.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_left_unpolled_does_not_hold_the_window() {
    use futures_util::StreamExt;
    let vh = Broker::from_env().vhost("pub-batch-idle");
    vh.declare_queue("ok", FieldTable::default()).await;
    let p = publisher(
        vh.url(),
        PublisherConfig {
            max_in_flight: 1,
            ..Default::default()
        },
    );
    let envs = |n: usize| (0..n).map(|i| Envelope::new("", "ok", format!("m{i}")));
    let mut idle = Box::pin(p.publish_many(envs(100)));
    let (_, first) = idle.next().await.unwrap();
    assert!(first.unwrap().is_confirmed());
    // `idle` is not polled from here on: it must hold no slot.
    wait_until(
        Duration::from_secs(10),
        "the unpolled batch holds no window slot",
        || async { p.in_flight() == 0 },
    )
    .await;
    let one = tokio::time::timeout(
        Duration::from_secs(10),
        p.publish(Envelope::new("", "ok", "one")),
    )
    .await
    .expect("a publish beside an unpolled batch must not wait for it")
    .unwrap();
    assert!(one.is_confirmed(), "{one}");
    let other: Vec<_> = tokio::time::timeout(
        Duration::from_secs(10),
        p.publish_many(envs(30)).collect::<Vec<_>>(),
    )
    .await
    .expect("a batch beside an unpolled batch must not wait for it");
    assert_eq!(other.len(), 30);
    assert!(
        other
            .iter()
            .all(|(_, o)| o.as_ref().unwrap().is_confirmed())
    );
    // The unpolled batch resumes where it stopped.
    let rest: Vec<_> = idle.collect().await;
    assert_eq!(rest.len(), 99);
    assert!(rest.iter().all(|(_, o)| o.as_ref().unwrap().is_confirmed()));
    assert_eq!(vh.depth("ok").await, 131);
    assert_eq!(p.in_flight(), 0);
}

/// A batch refuses bad envelopes one by one (typed, before sending) and publishes the
/// rest; after `close`, a batch is refused whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_refuses_bad_envelopes_alone_and_nothing_after_close() {
    use futures_util::StreamExt;
    let vh = Broker::from_env().vhost("pub-batch-bad");
    vh.declare_queue("ok", FieldTable::default()).await;
    let p = publisher(
        vh.url(),
        PublisherConfig {
            max_body: 1024,
            ..Default::default()
        },
    );
    let envs = (0..40).map(|i| {
        let size = if i % 10 == 5 { 4096 } else { 8 };
        Envelope::new("", "ok", vec![b'x'; size])
    });
    let outcomes: Vec<_> = p.publish_many(envs).collect().await;
    assert_eq!(outcomes.len(), 40);
    for (i, o) in &outcomes {
        match o {
            Err(Error::BodyTooLarge { .. }) => assert_eq!(i % 10, 5, "#{i}"),
            Ok(o) => assert!(i % 10 != 5 && o.is_confirmed(), "#{i}: {o}"),
            Err(e) => panic!("#{i}: {e}"),
        }
    }
    assert_eq!(vh.depth("ok").await, 36);
    p.close(Duration::from_secs(5)).await;
    let outcomes: Vec<_> = p
        .publish_many((0..20).map(|_| Envelope::new("", "ok", "late")))
        .collect()
        .await;
    assert_eq!(outcomes.len(), 20);
    assert!(
        outcomes
            .iter()
            .all(|(_, o)| matches!(o, Err(Error::Closed { .. })))
    );
    assert_eq!(vh.depth("ok").await, 36);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connections_closed_mid_stream_fail_pending_then_resume() {
    let vh = Arc::new(Broker::from_env().vhost("pub-close"));
    vh.declare_queue("ok", FieldTable::default()).await;
    let p = publisher(
        vh.url(),
        PublisherConfig {
            max_in_flight: 8,
            ..Default::default()
        },
    );
    p.connect().await.unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let p_watch = p.clone();
    let mut joins = Vec::new();
    for _ in 0..8 {
        let p = p.clone();
        let stop = stop.clone();
        joins.push(tokio::spawn(async move {
            let (mut confirmed, mut other) = (0u32, 0u32);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match p
                    .publish(Envelope::new("", "ok", vec![1u8; 256]))
                    .await
                    .unwrap()
                {
                    o if o.is_confirmed() => confirmed += 1,
                    _ => other += 1,
                }
            }
            (confirmed, other)
        }));
    }
    // A forced close lands between two frames of the broker: it may find every written
    // publish already confirmed. Closed again (up to 10 times, each while publishes await
    // their confirms) until one strikes in flight.
    let mut closes = 0;
    loop {
        wait_until(
            Duration::from_secs(10),
            "publishes awaiting confirms",
            || async { p_watch.stats().unconfirmed > 0 },
        )
        .await;
        let closer = vh.clone();
        tokio::task::spawn_blocking(move || closer.close_connections())
            .await
            .unwrap();
        closes += 1;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let s = p_watch.stats();
        if s.failed + s.timed_out > 0 || closes == 10 {
            break;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut confirmed, mut other) = (0, 0);
    for j in joins {
        let (c, o) = j.await.unwrap();
        confirmed += c;
        other += o;
    }
    // Publishing resumed after the forced close.
    let after = p.publish(Envelope::new("", "ok", "after")).await.unwrap();
    assert!(
        after.is_confirmed(),
        "publishing resumes after reconnect: {after}"
    );
    confirmed += 1;
    let depth = vh.depth("ok").await;
    assert!(
        depth >= confirmed,
        "{confirmed} confirmed but only {depth} in the queue"
    );
    assert!(depth <= confirmed + other, "more messages than publishes");
    assert!(
        other >= 1,
        "the close struck while publishes awaited their confirms: they fail"
    );
    let s = p.stats();
    assert!(
        s.failed + s.timed_out == u64::from(other),
        "non-confirmed outcomes are failures: {s:?}"
    );
    eprintln!(
        "{closes} forced close(s): {confirmed} confirmed, {other} failed/unknown, {depth} in queue"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_typed_before_sending() {
    let vh = Broker::from_env().vhost("pub-bad");
    vh.declare_queue("ok", FieldTable::default()).await;
    let p = publisher(
        vh.url(),
        PublisherConfig {
            max_body: 1024,
            ..Default::default()
        },
    );
    let long = "x".repeat(256);
    assert!(matches!(
        p.publish(Envelope::new(long.clone(), "ok", "a")).await,
        Err(Error::InvalidName { .. })
    ));
    assert!(matches!(
        p.publish(Envelope::new("", long.clone(), "a")).await,
        Err(Error::InvalidName { .. })
    ));
    assert!(matches!(
        p.publish(Envelope::new("", "ok", vec![0u8; 4096])).await,
        Err(Error::BodyTooLarge { .. })
    ));
    assert!(matches!(
        p.publish(Envelope::new("", "ok", "a").header(long, 1i32))
            .await,
        Err(Error::InvalidHeader { .. })
    ));
    assert!(matches!(
        p.publish(
            Envelope::new("", "ok", "a")
                .header("h", AMQPValue::LongString("y".repeat(200_000).into()))
        )
        .await,
        Err(Error::InvalidHeader { .. })
    ));
    assert_eq!(p.stats().sent, 0, "nothing was sent");
    assert_eq!(vh.depth("ok").await, 0);
    // A bad URL is a typed error too, without echoing the password.
    let e = Publisher::new(
        ConnectionConfig::new("nope://u:secret@h"),
        PublisherConfig::default(),
    )
    .unwrap_err();
    assert!(matches!(e, Error::InvalidUrl { .. }));
    assert!(!e.to_string().contains("secret"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_alarm_blocks_with_a_bounded_window_and_times_out_blocked() {
    let broker = Broker::private(1);
    broker.ctl(&["set_vm_memory_high_watermark", "0.4"]);
    let vh = broker.vhost("pub-alarm");
    vh.declare_queue("ok", FieldTable::default()).await;
    let window = 4;
    let p = publisher(
        vh.url(),
        PublisherConfig {
            max_in_flight: window,
            confirm_timeout: Duration::from_secs(3),
            ..Default::default()
        },
    );
    assert!(
        p.publish(Envelope::new("", "ok", "before"))
            .await
            .unwrap()
            .is_confirmed()
    );
    broker.ctl(&["set_vm_memory_high_watermark", "0"]);
    let mut joins = Vec::new();
    for _ in 0..12 {
        let p = p.clone();
        joins.push(tokio::spawn(async move {
            p.publish(Envelope::new("", "ok", "during")).await.unwrap()
        }));
    }
    // Blocked: lapin holds publish frames while the connection is blocked, so a lane has
    // one publish being written and those written before the block await their confirms;
    // never more than the window.
    let mut written = 0;
    for _ in 0..20 {
        written = written.max(p.stats().unconfirmed);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        (1..=window as u64).contains(&written),
        "publishes wait on the blocked connection, within the window: {written}"
    );
    let (mut blocked_timeouts, mut confirmed) = (0, 0);
    let mut results = Vec::new();
    // Clear the alarm once the first wave has timed out.
    tokio::time::sleep(Duration::from_secs(3)).await;
    broker.ctl(&["set_vm_memory_high_watermark", "0.4"]);
    for j in joins {
        let o = j.await.unwrap();
        match &o {
            PublishOutcome::TimedOut { blocked: true } => blocked_timeouts += 1,
            o if o.is_confirmed() => confirmed += 1,
            _ => {}
        }
        results.push(o.to_string());
    }
    assert!(
        blocked_timeouts >= 1,
        "expected TimedOut {{ blocked: true }}, got {results:?}"
    );
    assert_eq!(
        blocked_timeouts + confirmed,
        12,
        "only blocked timeouts or confirms: {results:?}"
    );
    wait_until(
        Duration::from_secs(10),
        "the confirmed ones are in the queue",
        || async { vh.depth("ok").await > confirmed },
    )
    .await;
    assert!(
        p.publish(Envelope::new("", "ok", "after"))
            .await
            .unwrap()
            .is_confirmed()
    );
}
