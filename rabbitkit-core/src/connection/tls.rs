//! TLS settings of a connection: the CA that signs the broker's certificate, a client
//! certificate and key, the name the broker's certificate is checked against.
//!
//! The files are read, parsed and matched (key against certificate) once, when a connection
//! slot is built at start ([`TlsConfig::load`]): a missing or malformed file is an
//! [`Error::TlsFile`] naming it before anything connects, never a reconnect loop. A broker
//! whose certificate does not verify, or that refuses the client's, ends the connect at once
//! ([`Error::Tls`]): retrying cannot fix either.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{Error, Result};

/// How a connection speaks TLS to `amqps://` nodes (rabbitkit's `tls` feature).
///
/// Every setting is optional: without any, the broker's certificate is verified against the
/// system's trusted roots and the URL's host. Files are PEM.
///
/// ```
/// # use rabbitkit_core::connection::{ConnectionConfig, TlsConfig};
/// let cfg = ConnectionConfig::new("amqps://app:secret@rabbit-1:5671/orders").tls(
///     TlsConfig::new()
///         .ca_file("/etc/rabbitkit/ca.pem")
///         .client_cert("/etc/rabbitkit/client.pem", "/etc/rabbitkit/client.key"),
/// );
/// # let _ = cfg;
/// ```
///
/// In a worker config file: `[connection.tls]` with `ca-file`, `cert-file`, `key-file`,
/// `server-name` (`tls = true` alone turns TLS on with none of them).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct TlsConfig {
    /// CA certificates (PEM, one or more) trusted to sign the broker's certificate, in
    /// addition to the system's roots.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// The client certificate (PEM; its chain may follow it), for brokers that verify
    /// peers (`ssl_options.verify = verify_peer`). Needs `key_file`.
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM: PKCS#8, PKCS#1 or SEC1, unencrypted).
    /// Needs `cert_file`.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// The name the broker's certificate must be valid for (default: the host of each
    /// node's URL), for nodes reached by an address their certificate does not name.
    #[serde(default)]
    pub server_name: Option<String>,
}

impl TlsConfig {
    /// No setting: system roots, no client certificate, the URL's host.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts the CA certificates of this PEM file too.
    #[must_use]
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_file = Some(path.into());
        self
    }

    /// Presents this client certificate, with its private key (both PEM files).
    #[must_use]
    pub fn client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.cert_file = Some(cert.into());
        self.key_file = Some(key.into());
        self
    }

    /// Checks the broker's certificate against `name` instead of the URL's host.
    #[must_use]
    pub fn server_name(mut self, name: impl Into<String>) -> Self {
        self.server_name = Some(name.into());
        self
    }

    /// Checks the settings without reading a file: the `tls` feature is on, a certificate
    /// comes with its key, a server name is a valid DNS name or IP address.
    pub(crate) fn check(&self) -> std::result::Result<(), String> {
        if !cfg!(feature = "tls") {
            return Err("TLS settings need rabbitkit built with its `tls` cargo feature".into());
        }
        match (&self.cert_file, &self.key_file) {
            (Some(_), None) => return Err("tls cert-file needs key-file".into()),
            (None, Some(_)) => return Err("tls key-file needs cert-file".into()),
            _ => {}
        }
        if let Some(name) = &self.server_name {
            check_server_name(name)?;
        }
        Ok(())
    }

    /// Reads and checks every file: each exists and parses, the key matches the
    /// certificate. The result connects without touching the files again.
    pub(crate) fn load(&self) -> Result<Loaded> {
        self.check().map_err(Error::Config)?;
        imp::load(self)
    }
}

/// Reads `path` whole, as an [`Error::TlsFile`] naming it when it cannot be read.
#[cfg_attr(not(feature = "tls"), allow(dead_code))]
fn read(path: &Path, what: &str) -> Result<Vec<u8>> {
    let bytes = std::fs::read(path).map_err(|e| Error::TlsFile {
        file: path.to_owned(),
        reason: format!("cannot read the {what}: {e}"),
    })?;
    if bytes.is_empty() {
        return Err(Error::TlsFile {
            file: path.to_owned(),
            reason: format!("the {what} file is empty"),
        });
    }
    Ok(bytes)
}

#[cfg(feature = "tls")]
fn check_server_name(name: &str) -> std::result::Result<(), String> {
    rustls::pki_types::ServerName::try_from(name)
        .map(|_| ())
        .map_err(|e| format!("tls server-name {name:?}: {e}"))
}

#[cfg(not(feature = "tls"))]
fn check_server_name(_: &str) -> std::result::Result<(), String> {
    Ok(())
}

pub(crate) use imp::{HttpsConnector, Loaded, connect, refused};

#[cfg(feature = "tls")]
mod imp {
    use std::net::SocketAddr;
    use std::sync::Arc;

    use lapin::tcp::{AsyncTcpStream, RustlsConnector, RustlsConnectorConfig};
    use lapin::uri::AMQPUri;
    use lapin::{Connection, ConnectionProperties};
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    use super::{TlsConfig, read};
    use crate::error::{Error, Result};

    /// TLS settings read and checked: the connector every handshake uses.
    #[derive(Clone)]
    pub(crate) struct Loaded {
        connector: Arc<RustlsConnector>,
        server_name: Option<String>,
    }

    impl std::fmt::Debug for Loaded {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Loaded")
                .field("server_name", &self.server_name)
                .finish_non_exhaustive()
        }
    }

    fn certificates(path: &std::path::Path, what: &str) -> Result<Vec<CertificateDer<'static>>> {
        let bytes = read(path, what)?;
        let bad = |reason: String| Error::TlsFile {
            file: path.to_owned(),
            reason,
        };
        let certs = CertificateDer::pem_slice_iter(&bytes)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| bad(format!("not a PEM {what}: {e}")))?;
        if certs.is_empty() {
            return Err(bad(format!("no PEM certificate in the {what} file")));
        }
        Ok(certs)
    }

    pub(crate) fn load(cfg: &TlsConfig) -> Result<Loaded> {
        // The same verifier lapin's own amqps:// connect uses (the platform's roots), plus
        // the configured CA.
        let mut c = RustlsConnectorConfig::new_with_platform_verifier();
        if let Some(ca) = &cfg.ca_file {
            let certs = certificates(ca, "CA certificate")?;
            let n = certs.len();
            c.add_parsable_certificates(certs);
            tracing::debug!(file = %ca.display(), certificates = n, "TLS CA file loaded");
        }
        let connector = match (&cfg.cert_file, &cfg.key_file) {
            (Some(cert), Some(key)) => {
                let chain = certificates(cert, "client certificate")?;
                let key_bytes = read(key, "client key")?;
                let key_der =
                    PrivateKeyDer::from_pem_slice(&key_bytes).map_err(|e| Error::TlsFile {
                        file: key.to_owned(),
                        reason: format!("not a PEM private key (PKCS#8, PKCS#1 or SEC1): {e}"),
                    })?;
                // rustls checks here that the key is the certificate's.
                c.connector_with_single_cert(chain, key_der)
                    .map_err(|e| Error::TlsFile {
                        file: key.to_owned(),
                        reason: format!("unusable with {}: {e}", cert.display()),
                    })?
            }
            _ => c.connector_with_no_client_auth().map_err(|e| {
                Error::Config(format!("TLS: the certificate verifier cannot start: {e}"))
            })?,
        };
        Ok(Loaded {
            connector: Arc::new(connector),
            server_name: cfg.server_name.clone(),
        })
    }

    /// Opens a connection over TLS with `tls`: TCP to the URL's host and port, the
    /// handshake checked against `server_name` (default: the host), then AMQP.
    pub(crate) async fn connect(
        url: &str,
        props: ConnectionProperties,
        tls: &Loaded,
    ) -> lapin::Result<Connection> {
        let uri: AMQPUri = url.parse().map_err(std::io::Error::other)?;
        let runtime = lapin::runtime::default_runtime()?;
        let tls = tls.clone();
        Connection::connector(
            uri,
            runtime,
            async move |uri: AMQPUri, runtime| {
                let host = uri.authority.host.as_str();
                let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, uri.authority.port))
                    .await?
                    .collect();
                let domain = tls.server_name.as_deref().unwrap_or(host);
                let stream = AsyncTcpStream::connect(&runtime, addrs).await?;
                Ok(stream.into_rustls(&tls.connector, domain).await?)
            },
            props,
        )
        .await
    }

    /// The reason, when `e` is a certificate refused by either side: ours of the broker's
    /// (unknown CA, wrong name, expired) or the broker's of ours (a TLS alert). Neither is
    /// fixed by trying again.
    pub(crate) fn refused(e: &lapin::Error) -> Option<String> {
        use rustls::AlertDescription as A;
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
        while let Some(cur) = source {
            if let Some(io) = cur.downcast_ref::<std::io::Error>()
                && let Some(tls) = io.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>())
            {
                return match tls {
                    rustls::Error::InvalidCertificate(_) => {
                        Some(format!("the broker's certificate is refused: {tls}"))
                    }
                    rustls::Error::AlertReceived(
                        A::BadCertificate
                        | A::UnsupportedCertificate
                        | A::CertificateRevoked
                        | A::CertificateExpired
                        | A::CertificateUnknown
                        | A::UnknownCA
                        | A::CertificateRequired
                        | A::AccessDenied,
                    ) => Some(format!("the broker refused the client certificate: {tls}")),
                    _ => None,
                };
            }
            source = cur.source();
        }
        None
    }

    /// A blocking TLS client for the management API's `https://` (`topology/mgmt.rs`):
    /// lapin's rustls connector, with the connection's CA file and client certificate when
    /// it has TLS settings, the system's roots always.
    #[derive(Clone)]
    pub(crate) struct HttpsConnector(Arc<RustlsConnector>);

    impl HttpsConnector {
        /// Reads `cfg`'s files now (none: the system's roots only).
        pub(crate) fn load(cfg: Option<&TlsConfig>) -> Result<Self> {
            let none = TlsConfig::new();
            Ok(Self(load(cfg.unwrap_or(&none))?.connector))
        }

        /// The handshake over `stream` (blocking), the certificate checked for `host`.
        pub(crate) fn connect(
            &self,
            host: &str,
            stream: std::net::TcpStream,
        ) -> std::io::Result<impl std::io::Read + std::io::Write + use<>> {
            use std::error::Error as _;
            self.0.connect(host, stream).map_err(|e| match e.source() {
                Some(cause) => std::io::Error::other(format!("TLS handshake failed: {cause}")),
                // A read timed out mid-handshake (blocking sockets only get there so).
                None => std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "TLS handshake: no answer in time",
                ),
            })
        }
    }
}

#[cfg(not(feature = "tls"))]
mod imp {
    use lapin::{Connection, ConnectionProperties};

    use super::TlsConfig;
    use crate::error::{Error, Result};

    /// Never built without the `tls` feature.
    #[derive(Debug, Clone)]
    pub(crate) enum Loaded {}

    pub(crate) fn load(_: &TlsConfig) -> Result<Loaded> {
        Err(Error::Config(
            "TLS needs rabbitkit built with its `tls` cargo feature".into(),
        ))
    }

    pub(crate) async fn connect(
        _: &str,
        _: ConnectionProperties,
        tls: &Loaded,
    ) -> lapin::Result<Connection> {
        match *tls {}
    }

    pub(crate) fn refused(_: &lapin::Error) -> Option<String> {
        None
    }

    /// Never built without the `tls` feature (an `https://` management URL is refused
    /// before).
    #[derive(Clone)]
    pub(crate) enum HttpsConnector {}

    impl HttpsConnector {
        pub(crate) fn load(_: Option<&TlsConfig>) -> Result<Self> {
            Err(Error::Config(
                "https needs rabbitkit built with its `tls` cargo feature".into(),
            ))
        }

        pub(crate) fn connect(
            &self,
            _: &str,
            _: std::net::TcpStream,
        ) -> std::io::Result<std::net::TcpStream> {
            match *self {}
        }
    }
}

#[cfg(all(test, feature = "tls"))]
mod tests {
    use super::*;

    #[test]
    fn a_missing_file_is_named() {
        let err = TlsConfig::new()
            .ca_file("/nonexistent/ca.pem")
            .load()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("/nonexistent/ca.pem"), "{err}");
    }

    #[test]
    fn a_file_that_is_not_pem_is_named() {
        let dir = std::env::temp_dir().join(format!("rk-tls-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let junk = dir.join("junk.pem");
        std::fs::write(&junk, "not a certificate\n").unwrap_or_else(|e| panic!("{e}"));
        let err = TlsConfig::new().ca_file(&junk).load();
        let _ = std::fs::remove_dir_all(&dir);
        match err {
            Err(Error::TlsFile { file, reason }) => {
                assert_eq!(file, junk);
                assert!(reason.contains("no PEM certificate"), "{reason}");
            }
            other => panic!("expected TlsFile, got {other:?}"),
        }
    }

    #[test]
    fn settings_are_checked_before_any_file_is_read() {
        let half = TlsConfig {
            cert_file: Some("c.pem".into()),
            ..TlsConfig::new()
        };
        assert!(half.check().is_err());
        assert!(TlsConfig::new().server_name("bad name!").check().is_err());
        assert!(TlsConfig::new().server_name("rabbit.test").check().is_ok());
        assert!(TlsConfig::new().check().is_ok());
    }
}
