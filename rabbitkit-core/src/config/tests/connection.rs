//! The connection section of a worker file: URLs and node lists, TLS, and what the
//! environment overrides.

use super::*;

#[test]
fn bad_url_is_typed_and_never_shows_the_password() {
    let src = MINIMAL.replace(
        "amqp://app:s3cret@rabbit:5672/%2f",
        "http://app:s3cret@rabbit/x",
    );
    let err = WorkerConfig::from_toml(&src).err().map(|e| e.to_string());
    let err = err.unwrap_or_default();
    assert!(
        err.contains("connection.url") && err.contains("line 3"),
        "{err}"
    );
    assert!(!err.contains("s3cret"), "{err}");
    // A password shown by a type error elsewhere is scrubbed too.
    let src = format!("{MINIMAL}prefetch = \"amqp://app:s3cret@h\"\n");
    let (_, _, _, message) = file_error(&src);
    assert!(!message.contains("s3cret"), "{message}");
    let debug = format!("{:?}", parse(MINIMAL).connection);
    assert!(
        !debug.contains("s3cret") && debug.contains("app:***@"),
        "{debug}"
    );
}

#[test]
fn tls_must_agree_with_the_url_and_the_feature() {
    let (key, ..) = file_error(&MINIMAL.replace("%2f\"", "%2f\"\ntls = true"));
    assert_eq!(key, "connection.tls");
    let src = MINIMAL.replace("amqp://", "amqps://");
    let (key, _, _, message) = file_error(&src);
    assert_eq!(key, "connection.tls");
    assert!(message.contains("tls = true"), "{message}");
    let src = MINIMAL
        .replace("amqp://", "amqps://")
        .replace("%2f\"", "%2f\"\ntls = true");
    let r = WorkerConfig::from_toml(&src);
    if cfg!(feature = "tls") {
        assert!(r.is_ok(), "{r:?}");
    } else {
        let msg = r.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains("`tls` cargo feature"), "{msg}");
    }
}

#[test]
fn tls_settings_parse_as_a_table_and_agree_with_the_url() {
    let src = MINIMAL.replace("amqp://", "amqps://").replace(
        "%2f\"",
        "%2f\"\n[connection.tls]\nca-file = \"/etc/rk/ca.pem\"\ncert-file = \"c.pem\"\nkey-file = \"k.pem\"\nserver-name = \"rabbit.test\"",
    );
    let r = WorkerConfig::from_toml(&src);
    if !cfg!(feature = "tls") {
        // Refused, not parsed and ignored.
        let msg = r.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            msg.contains("connection.tls") && msg.contains("`tls` cargo feature"),
            "{msg}"
        );
        return;
    }
    let cfg = r.unwrap_or_else(|e| panic!("{e}"));
    let want = crate::connection::TlsConfig::new()
        .ca_file("/etc/rk/ca.pem")
        .client_cert("c.pem", "k.pem")
        .server_name("rabbit.test");
    assert_eq!(cfg.connection.tls.as_ref(), Some(&want));
    assert_eq!(cfg.connection.to_connection_config().tls, Some(want));
    // A certificate without its key, an unknown key, settings on amqp:// URLs.
    let (key, _, _, message) = file_error(&src.replace("key-file = \"k.pem\"\n", ""));
    assert_eq!(key, "connection.tls");
    assert!(message.contains("key-file"), "{message}");
    let (key, ..) = file_error(&src.replace("ca-file", "ca-path"));
    assert!(key.starts_with("connection.tls"), "{key}");
    let (key, ..) = file_error(&src.replace("amqps://", "amqp://"));
    assert_eq!(key, "connection.tls");
}

#[test]
fn tls_environment_variables_override_the_file() {
    let src = MINIMAL
        .replace("amqp://", "amqps://")
        .replace("%2f\"", "%2f\"\ntls = true");
    if !cfg!(feature = "tls") {
        // Refused at parse (tls_settings_parse_as_a_table_and_agree_with_the_url).
        return;
    }
    let mut cfg = parse(&src);
    cfg.override_from_env(|k| match k {
        "RABBITKIT_TLS_CA_FILE" => Some("/run/ca.pem".into()),
        "RABBITKIT_TLS_SERVER_NAME" => Some("rabbit.test".into()),
        _ => None,
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let tls = cfg.connection.tls.clone().unwrap_or_default();
    assert_eq!(
        tls.ca_file.as_deref(),
        Some(std::path::Path::new("/run/ca.pem"))
    );
    assert_eq!(tls.server_name.as_deref(), Some("rabbit.test"));
    // A half client certificate is refused, naming the variable; nothing changes.
    let err = cfg
        .override_from_env(|k| (k == "RABBITKIT_TLS_CERT_FILE").then(|| "c.pem".into()))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("RABBITKIT_TLS_CERT_FILE") && err.contains("key-file"),
        "{err}"
    );
    assert_eq!(cfg.connection.tls, Some(tls));
}

#[test]
fn rabbitkit_url_overrides_the_file_and_is_checked() {
    let mut cfg = parse(MINIMAL);
    let env = |url: &'static str| move |k: &str| (k == URL_ENV).then(|| url.to_owned());
    cfg.override_from_env(env("amqp://u:pw@other:5673/v"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(cfg.connection.urls, ["amqp://u:pw@other:5673/v"]);
    let w = from_config(&cfg, &handlers()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(w.connection.urls, ["amqp://u:pw@other:5673/v"]);
    cfg.override_from_env(|_| None)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        cfg.connection.urls,
        ["amqp://u:pw@other:5673/v"],
        "no variable, no change"
    );

    let err = cfg.override_from_env(env("ftp://u:hunter2@h")).err();
    let Some(Error::InvalidUrl { reason }) = err else {
        panic!("expected InvalidUrl, got {err:?}");
    };
    assert!(
        reason.contains(URL_ENV) && !reason.contains("hunter2"),
        "{reason}"
    );
    let err = cfg.override_from_env(env("amqps://u:hunter2@h/v")).err();
    let reason = err.map(|e| e.to_string()).unwrap_or_default();
    assert!(
        reason.contains("tls") && !reason.contains("hunter2"),
        "{reason}"
    );
    assert_eq!(
        cfg.connection.urls,
        ["amqp://u:pw@other:5673/v"],
        "a refused URL changes nothing"
    );
}

#[test]
fn load_reads_the_file_then_the_environment() {
    let path = std::env::temp_dir().join(format!("rabbitkit-load-{}.toml", std::process::id()));
    std::fs::write(&path, MINIMAL).unwrap_or_else(|e| panic!("{e}"));
    let cfg = WorkerConfig::load(&path).unwrap_or_else(|e| panic!("{e}"));
    let _ = std::fs::remove_file(&path);
    // The test environment may set RABBITKIT_URL; either way it wins over the file.
    let want =
        std::env::var(URL_ENV).unwrap_or_else(|_| "amqp://app:s3cret@rabbit:5672/%2f".into());
    assert_eq!(cfg.connection.urls.join(","), want);
    assert_eq!(cfg.subscribers[0].queue, "greetings");
    let err = WorkerConfig::load(&path).err().map(|e| e.to_string());
    assert!(
        err.unwrap_or_default().contains("cannot read"),
        "a missing file is named"
    );
}

#[test]
fn a_node_list_and_its_order_reach_the_worker() {
    let src = MINIMAL.replace(
        "url = \"amqp://app:s3cret@rabbit:5672/%2f\"",
        "url = [\"amqp://app:s3cret@rabbit-1:5672/%2f\", \"amqp://app:s3cret@rabbit-2:5672/%2f\"]\norder = \"shuffled\"",
    );
    let w = build(&src);
    assert_eq!(
        w.connection.urls,
        [
            "amqp://app:s3cret@rabbit-1:5672/%2f",
            "amqp://app:s3cret@rabbit-2:5672/%2f"
        ]
    );
    assert_eq!(w.connection.order, crate::NodeOrder::Shuffled);
    // `urls` is the same key under its plural name.
    let plural = build(&src.replace("url = [", "urls = ["));
    assert_eq!(plural.connection.urls, w.connection.urls);
    // Both at once, an empty list, an unknown order, mixed vhosts: refused, located,
    // no password in the message.
    let both = src.replace("order =", "urls = [\"amqp://h/%2f\"]\norder =");
    let (key, ..) = file_error(&both);
    assert!(key.starts_with("connection"), "{key}");
    let (key, _, _, message) =
        file_error(&MINIMAL.replace("url = \"amqp://app:s3cret@rabbit:5672/%2f\"", "url = []"));
    assert_eq!(key, "connection.url");
    assert!(message.contains("no broker URL"), "{message}");
    let (key, ..) = file_error(&src.replace("\"shuffled\"", "\"random\""));
    assert_eq!(key, "connection.order");
    let (key, _, _, message) = file_error(&src.replace("rabbit-2:5672/%2f", "rabbit-2:5672/other"));
    assert_eq!(key, "connection.url");
    assert!(
        message.contains("same vhost") && !message.contains("s3cret"),
        "{message}"
    );
}

#[test]
fn rabbitkit_url_may_list_several_nodes() {
    let mut cfg = parse(MINIMAL);
    cfg.override_from_env(|k| {
        (k == URL_ENV).then(|| "amqp://u:p@ss@one:5672/v, amqp://u:p@ss@two:5673/v".to_owned())
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        cfg.connection.urls,
        ["amqp://u:p@ss@one:5672/v", "amqp://u:p@ss@two:5673/v"]
    );
    let err = cfg
        .override_from_env(|k| {
            (k == URL_ENV).then(|| "amqp://u:hunt@r2@one/v,amqp://u:hunt@r2@two/w".to_owned())
        })
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains(URL_ENV) && err.contains("same vhost") && !err.contains("hunt"),
        "{err}"
    );
}
