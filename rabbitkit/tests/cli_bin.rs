//! The real `rabbitkit` binary: help, exit codes before any broker is involved, a failed
//! connection that exits non-zero without printing the password, and one verdict of the
//! broker under test (`RABBITKIT_URL`). Every command against a broker is tested
//! in-process by `tests/tests/cli.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::process::{Command, Output};

fn rabbitkit(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rabbitkit"))
        .args(args)
        .env_remove("RABBITKIT_URL")
        .output()
        .expect("run the rabbitkit binary")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn help_lists_the_commands_and_exits_zero() {
    let o = rabbitkit(&["--help"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let help = text(&o.stdout);
    for cmd in ["parking", "topology", "publish"] {
        assert!(help.contains(cmd), "{help}");
    }
}

#[test]
fn purge_without_yes_is_refused_before_connecting() {
    // The URL points nowhere: the refusal must come before any connection attempt.
    let o = rabbitkit(&[
        "parking",
        "purge",
        "orders",
        "--url",
        "amqp://u:p@127.0.0.1:1/%2f",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("without --yes"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn missing_url_and_bad_flags_are_usage_errors() {
    let o = rabbitkit(&["parking", "list", "orders"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("RABBITKIT_URL"),
        "{}",
        text(&o.stderr)
    );
    let o = rabbitkit(&["parking", "replay", "orders", "--rate", "fast"]);
    assert_eq!(o.status.code(), Some(2));
    let o = rabbitkit(&["parking", "list", "orders", "--url", "http://u:s3cret@host"]);
    assert_eq!(o.status.code(), Some(2));
    let err = text(&o.stderr);
    assert!(
        err.contains("invalid broker URL") && !err.contains("s3cret"),
        "{err}"
    );
}

#[test]
fn a_broker_that_cannot_be_reached_fails_without_printing_the_password() {
    let o = rabbitkit(&[
        "parking",
        "list",
        "orders",
        "--url",
        "amqp://operator:s3cret-pw@127.0.0.1:1/%2f",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let all = format!("{}{}", text(&o.stdout), text(&o.stderr));
    assert!(!all.contains("s3cret-pw"), "{all}");
    assert!(all.contains("operator:***@127.0.0.1:1"), "{all}");
}

#[test]
fn the_binary_reads_rabbitkit_url_and_an_unroutable_publish_exits_one() {
    // `scripts/test` sets RABBITKIT_URL to the broker under test; without it this fails.
    let url = std::env::var("RABBITKIT_URL")
        .expect("RABBITKIT_URL is not set: run scripts/test, or export it for a test broker");
    let o = Command::new(env!("CARGO_BIN_EXE_rabbitkit"))
        .args([
            "publish",
            "--exchange",
            "",
            "--routing-key",
            "rabbitkit-cli-bin-nowhere",
        ])
        .env("RABBITKIT_URL", &url)
        .output()
        .expect("run the rabbitkit binary");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert!(err.contains("not confirmed: returned"), "{err}");
}

/// Runs the binary against the broker under test (`RABBITKIT_URL`).
fn against_broker(args: &[&str]) -> Output {
    let url = std::env::var("RABBITKIT_URL")
        .expect("RABBITKIT_URL is not set: run scripts/test, or export it for a test broker");
    Command::new(env!("CARGO_BIN_EXE_rabbitkit"))
        .args(args)
        .env("RABBITKIT_URL", &url)
        .output()
        .expect("run the rabbitkit binary")
}

#[test]
fn the_binary_migrates_classic_tiers_into_quorum_tiers() {
    let q = format!("rabbitkit-cli-bin-migrate-{}", std::process::id());
    let (retry_x, old, new) = (
        format!("{q}.retry"),
        format!("{q}.retry.30s"),
        format!("{q}.delay.30s"),
    );
    let ok = |o: &Output| {
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}{}",
            text(&o.stdout),
            text(&o.stderr)
        );
        text(&o.stdout)
    };
    // The topology of an earlier release, and two copies waiting in its classic tier.
    ok(&against_broker(&[
        "topology",
        "apply",
        &q,
        "--tiers",
        "30s",
        "--classic-tiers",
    ]));
    for _ in 0..2 {
        ok(&against_broker(&[
            "publish",
            "--exchange",
            &retry_x,
            "--routing-key",
            &old,
            "--body",
            "copy",
            "--header",
            "tenant=acme",
        ]));
    }
    let out = ok(&against_broker(&[
        "topology", "migrate", &q, "--tiers", "30s",
    ]));
    assert!(
        out.contains(&format!(
            "migrated   30s: 2 moved from {old:?} into {new:?}; {old:?} deleted"
        )),
        "{out}"
    );
    let out = ok(&against_broker(&[
        "topology", "migrate", &q, "--tiers", "30s",
    ]));
    assert!(
        out.contains(&format!("absent     30s: no {old:?}")),
        "{out}"
    );
    // The quorum topology checks out; what the test declared is removed.
    ok(&against_broker(&[
        "topology", "check", &q, "--tiers", "30s",
    ]));
    cleanup(&q, &[&q, &format!("{q}.parking"), &new], &retry_x);
}

fn cleanup(what: &str, queues: &[&str], exchange: &str) {
    let url = std::env::var("RABBITKIT_URL").unwrap_or_default();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let c = lapin::Connection::connect(&url, lapin::ConnectionProperties::default())
            .await
            .unwrap_or_else(|e| panic!("cleanup of {what}: {e}"));
        let ch = c.create_channel().await.expect("channel");
        for q in queues {
            ch.queue_delete((*q).into(), Default::default())
                .await
                .unwrap_or_else(|e| panic!("delete {q}: {e}"));
        }
        ch.exchange_delete(exchange.into(), Default::default())
            .await
            .unwrap_or_else(|e| panic!("delete {exchange}: {e}"));
        let _ = c.close(200, "".into()).await;
    });
}
