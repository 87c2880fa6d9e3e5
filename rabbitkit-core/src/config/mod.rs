//! A worker from a config file: strict TOML, handlers registered by name.
//!
//! ```no_run
//! # use rabbitkit_core::config::{Handlers, WorkerConfig};
//! # async fn run() -> rabbitkit_core::Result<()> {
//! async fn greet(body: rabbitkit_core::extract::Body) -> Result<(), std::io::Error> {
//!     println!("{} bytes", body.0.len());
//!     Ok(())
//! }
//! let config = WorkerConfig::load("worker.toml")?; // RABBITKIT_URL overrides the URL
//! let handlers = Handlers::new().handler("greet", greet);
//! rabbitkit_core::worker::from_config(&config, &handlers)?
//!     .run_until(tokio::time::sleep(std::time::Duration::from_secs(60)))
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! Every key, its default and the test that covers it: `docs/CONFIGURATION.md`, section
//! "The worker config file". The reference file is `examples/worker.toml`.

mod build;
mod locate;
mod registry;
mod retry;
mod section;

use std::path::Path;

pub use build::{check, from_config, topologies};
pub use registry::Handlers;
pub use retry::RetrySection;
pub use section::{
    ConnectionSection, LogFormat, LogLevel, Observability, SubscriberConfig, TopologySection,
    WorkerConfig,
};

use crate::connection::{split_url_list, urls_in};
use crate::error::{Error, Result};

/// The environment variable that overrides `connection.url` (keep passwords out of files).
pub const URL_ENV: &str = "RABBITKIT_URL";

impl WorkerConfig {
    /// Parses and checks a config document. Errors name the key, its line and column
    /// ([`Error::ConfigFile`]) and never contain a password from the document.
    /// Environment overrides are not applied (see [`WorkerConfig::load`]).
    pub fn from_toml(src: &str) -> Result<Self> {
        let cfg: WorkerConfig = toml::from_str(src).map_err(|e| toml_error(src, &e))?;
        cfg.validate()
            .map_err(|(key, message)| located(src, &key, message))?;
        Ok(cfg)
    }

    /// Reads `path`, parses it ([`WorkerConfig::from_toml`]), then applies the process
    /// environment ([`WorkerConfig::override_from_env`]).
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let src = std::fs::read_to_string(path)
            .map_err(|e| Error::Config(format!("cannot read {}: {e}", path.display())))?;
        let mut cfg = Self::from_toml(&src)?;
        cfg.override_from_env(|k| std::env::var(k).ok())?;
        Ok(cfg)
    }

    /// Applies overrides from an environment (`lookup` is `std::env::var` in
    /// [`WorkerConfig::load`]): [`URL_ENV`] replaces `connection.url`; it may list several
    /// nodes, comma-separated. [`TLS_ENV`] variables each replace one key of
    /// `[connection.tls]` (and so turn TLS on). The result is checked like the file; the
    /// error never contains a URL. Nothing changes when it is refused.
    pub fn override_from_env(&mut self, lookup: impl Fn(&str) -> Option<String>) -> Result<()> {
        let mut connection = self.connection.clone();
        let mut tls_vars = Vec::new();
        for (var, key) in TLS_ENV {
            let Some(value) = lookup(var) else { continue };
            let tls = connection.tls.get_or_insert_with(Default::default);
            match key {
                "ca-file" => tls.ca_file = Some(value.into()),
                "cert-file" => tls.cert_file = Some(value.into()),
                "key-file" => tls.key_file = Some(value.into()),
                _ => tls.server_name = Some(value),
            }
            tls_vars.push(var);
        }
        if let Some(list) = lookup(URL_ENV) {
            connection.urls = split_url_list(&list);
            connection
                .to_connection_config()
                .validate()
                .map(|_| ())
                .map_err(|e| match e {
                    Error::InvalidUrl { reason } => reason,
                    other => other.to_string(),
                })
                .and_then(|()| connection.check_tls())
                .map_err(|reason| Error::InvalidUrl {
                    reason: format!("{URL_ENV}: {}", scrub(&list, &reason)),
                })?;
        } else if !tls_vars.is_empty() {
            connection
                .check_tls()
                .map_err(|reason| Error::Config(format!("{}: {reason}", tls_vars.join(", "))))?;
        }
        self.connection = connection;
        Ok(())
    }
}

/// The environment variables that override `[connection.tls]` keys, and the key each sets:
/// `RABBITKIT_TLS_CA_FILE`, `RABBITKIT_TLS_CERT_FILE`, `RABBITKIT_TLS_KEY_FILE`,
/// `RABBITKIT_TLS_SERVER_NAME`. The operator CLI reads the same ones.
pub const TLS_ENV: [(&str, &str); 4] = [
    ("RABBITKIT_TLS_CA_FILE", "ca-file"),
    ("RABBITKIT_TLS_CERT_FILE", "cert-file"),
    ("RABBITKIT_TLS_KEY_FILE", "key-file"),
    ("RABBITKIT_TLS_SERVER_NAME", "server-name"),
];

/// A `toml` error as [`Error::ConfigFile`]: the key from the span, the message with any
/// password of the document removed (`toml`'s own `Display` quotes the source line).
fn toml_error(src: &str, e: &toml::de::Error) -> Error {
    let offset = e.span().map_or(0, |s| s.start);
    let (line, column) = locate::line_col(src, offset);
    let mut key = locate::path_at(src, offset);
    // A missing key is reported at its table; a missing top-level one at the whole document.
    if let Some(field) = e
        .message()
        .strip_prefix("missing field `")
        .and_then(|r| r.split('`').next())
    {
        key = if offset == 0 {
            field.to_owned()
        } else {
            format!("{key}.{field}")
        };
    }
    Error::ConfigFile {
        key,
        line,
        column,
        message: scrub(src, e.message()),
    }
}

fn located(src: &str, key: &str, message: String) -> Error {
    let (line, column) = locate::locate(src, key);
    Error::ConfigFile {
        key: key.to_owned(),
        line,
        column,
        message: scrub(src, &message),
    }
}

/// Removes every URL password that appears in `src` from `message`.
fn scrub(src: &str, message: &str) -> String {
    crate::connection::scrub(message, urls_in(src))
}

#[cfg(test)]
mod tests;
