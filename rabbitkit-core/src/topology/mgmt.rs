//! The management API reads rabbitkit needs: one queue's type, arguments and effective
//! policy at start (AMQP reports none of them), and the queues of a vhost for
//! `rabbitkit topology prune` (AMQP cannot list queues).
//!
//! A hand-written HTTP/1.0 GET over blocking std I/O on tokio's blocking pool, and over TLS
//! for `https://` with the rustls connector lapin already brings for `amqps://`
//! (`lapin::tcp::RustlsConnector`, rabbitkit's `tls` feature). Why not an HTTP client
//! crate: rabbitkit sends one GET per queue at start, with basic authentication, reads a
//! JSON body to its end and closes; hyper's client (hyper-util's legacy client) or reqwest
//! would add a connection pool, HTTP/2, a second TLS stack or a hyper-rustls with its own
//! roots, and a dozen crates, for none of which this exchange has a use. HTTP/1.0 keeps the
//! reading honest: no chunked encoding, no keep-alive, the body ends when the server closes.
//!
//! Credentials never go in clear to another machine: a plain `http://` URL whose host is
//! not loopback (`127.0.0.0/8`, `::1`, `localhost`) is refused with
//! [`Error::PlainHttpRefused`] before anything connects, unless allowed explicitly
//! ([`ManagementUrl::allow_plain_http`], `allow-plain-http = true` in `[topology]`, the
//! CLI's `--allow-plain-http`).

use std::io::{Read, Write};
use std::time::Duration;

use serde::Deserialize;

#[cfg(doc)]
use crate::connection::TlsConfig;
use crate::connection::{ConnectionConfig, HttpsConnector, redact};
use crate::error::{Error, Result};

/// How long one request may take.
const WAIT: Duration = Duration::from_secs(15);

/// The management API's base URL, `https://[user:password@]host:port` or
/// `http://[user:password@]host:port`. The user and the password default to the broker
/// URL's. Its `Debug` never shows the password.
///
/// `https://` needs rabbitkit's `tls` feature; the certificate is verified against the
/// system's roots and the connection's CA file ([`TlsConfig::ca_file`]), for the URL's
/// host. Plain `http://` is accepted for a loopback host only, unless
/// [`ManagementUrl::allow_plain_http`] says otherwise: basic authentication sends the
/// password with every request.
///
/// ```
/// # use rabbitkit_core::topology::ManagementUrl;
/// let api = ManagementUrl::new("https://rabbit-1:15671");
/// let local = ManagementUrl::new("http://localhost:15672");
/// let lab = ManagementUrl::new("http://rabbit-lab:15672").allow_plain_http();
/// # let _ = (api, local, lab);
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct ManagementUrl {
    url: String,
    allow_plain_http: bool,
}

impl ManagementUrl {
    /// The management API at `url` (checked when the topology is validated).
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            allow_plain_http: false,
        }
    }

    /// Allows a plain `http://` URL whose host is not loopback, which sends the user's
    /// password in clear over the network: for a lab, or a network that is trusted. Without
    /// it such a URL is refused with [`Error::PlainHttpRefused`].
    #[must_use]
    pub fn allow_plain_http(mut self) -> Self {
        self.allow_plain_http = true;
        self
    }

    /// The URL as given.
    pub fn as_str(&self) -> &str {
        &self.url
    }

    /// Refuses what the client must not or cannot reach: another scheme than `http` or
    /// `https`, no host, `https` without the `tls` feature, plain `http` to a host that is
    /// not loopback unless allowed. Nothing connects.
    pub(crate) fn check(&self) -> Result<url::Url> {
        let shown = redact(&self.url);
        let bad = |why: &str| Error::Config(format!("management-url {shown}: {why}"));
        let parsed = url::Url::parse(&self.url).map_err(|e| bad(&e.to_string()))?;
        let Some(host) = parsed.host() else {
            return Err(bad("has no host"));
        };
        match parsed.scheme() {
            "https" if cfg!(feature = "tls") => {}
            "https" => return Err(Error::HttpsUnavailable { url: shown }),
            "http" if self.allow_plain_http || is_loopback(&host) => {}
            "http" => return Err(Error::PlainHttpRefused { url: shown }),
            _ => return Err(bad("must be https://host:port or http://host:port")),
        }
        Ok(parsed)
    }

    /// The queues of `connection`'s vhost, as `GET /api/queues/{vhost}` lists them: what
    /// `rabbitkit topology prune` compares with the tiers in use.
    pub async fn queues(&self, connection: &ConnectionConfig) -> Result<Vec<ListedQueue>> {
        let api = Management::new(self, connection)?;
        let path = format!("/api/queues/{}?columns=name,messages", percent(&api.vhost));
        match api.get(&path).await? {
            (200, body) => serde_json::from_str(&body)
                .map_err(|e| api.fail(format!("the queue list does not parse: {e}"))),
            (404, _) => Err(api.fail(format!("knows no vhost {:?} (404)", api.vhost))),
            (status, _) => Err(api.status(status)),
        }
    }
}

impl From<String> for ManagementUrl {
    fn from(url: String) -> Self {
        Self::new(url)
    }
}

impl From<&str> for ManagementUrl {
    fn from(url: &str) -> Self {
        Self::new(url)
    }
}

impl std::fmt::Debug for ManagementUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagementUrl")
            .field("url", &redact(&self.url))
            .field("allow_plain_http", &self.allow_plain_http)
            .finish()
    }
}

/// One queue as `GET /api/queues/{vhost}` lists it ([`ManagementUrl::queues`]).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[non_exhaustive]
pub struct ListedQueue {
    /// The queue's name.
    pub name: String,
    /// Its messages, ready and unacknowledged; `None` while the broker has not computed
    /// them yet.
    #[serde(default)]
    pub messages: Option<u64>,
}

/// Whether `host` is this machine: `localhost`, `127.0.0.0/8` or `::1`. Another name is
/// not resolved to find out: a name is what the request is sent to, and DNS can change.
fn is_loopback(host: &url::Host<&str>) -> bool {
    match host {
        url::Host::Domain(name) => {
            name.eq_ignore_ascii_case("localhost") || name.eq_ignore_ascii_case("localhost.")
        }
        url::Host::Ipv4(ip) => ip.is_loopback(),
        url::Host::Ipv6(ip) => ip.is_loopback(),
    }
}

/// A management API bound to a vhost and a user.
pub(crate) struct Management {
    /// The host, as the URL names it (without an IPv6 address's brackets).
    host: String,
    port: u16,
    /// Over TLS: the connector (`https://`).
    tls: Option<HttpsConnector>,
    /// `user:password`.
    credentials: String,
    vhost: String,
    /// For messages: the URL without its password.
    shown: String,
}

impl Management {
    /// The API at `url`, for the vhost of `connection`, as the URL's user or the broker's.
    /// Refused here, before anything connects: what [`ManagementUrl::check`] refuses, and a
    /// TLS file of the connection's that cannot be read.
    pub(crate) fn new(url: &ManagementUrl, connection: &ConnectionConfig) -> Result<Self> {
        let broker = connection.validate()?;
        let parsed = url.check()?;
        let host = match parsed.host() {
            Some(url::Host::Ipv6(ip)) => ip.to_string(),
            Some(h) => h.to_string(),
            None => String::new(),
        };
        let tls = if parsed.scheme() == "https" {
            Some(HttpsConnector::load(connection.tls.as_ref())?)
        } else {
            None
        };
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        };
        let credentials = if parsed.username().is_empty() {
            format!(
                "{}:{}",
                broker.authority.userinfo.username, broker.authority.userinfo.password
            )
        } else {
            format!(
                "{}:{}",
                decode(parsed.username()),
                decode(parsed.password().unwrap_or_default())
            )
        };
        Ok(Self {
            host,
            port: parsed.port_or_known_default().unwrap_or(15672),
            tls,
            credentials,
            vhost: broker.vhost.clone(),
            shown: redact(url.as_str()),
        })
    }

    /// An error of this API, naming it without its password.
    fn fail(&self, why: String) -> Error {
        Error::Config(format!("the management API at {}: {why}", self.shown))
    }

    /// An unexpected status.
    fn status(&self, status: u16) -> Error {
        match status {
            401 => self.fail("the user is refused (401)".into()),
            other => self.fail(format!("answered {other}")),
        }
    }

    /// The queue `name` of the vhost as `GET /api/queues/{vhost}/{name}` describes it;
    /// `None` when the API does not know it (404).
    pub(crate) async fn queue(&self, name: &str) -> Result<Option<serde_json::Value>> {
        let path = format!("/api/queues/{}/{}", percent(&self.vhost), percent(name));
        match self.get(&path).await? {
            (200, body) => serde_json::from_str(&body)
                .map(Some)
                .map_err(|e| self.fail(format!("the queue's description does not parse: {e}"))),
            (404, _) => Ok(None),
            (status, _) => Err(self.status(status)),
        }
    }

    /// `GET path`: the status and the body.
    async fn get(&self, path: &str) -> Result<(u16, String)> {
        let authority = if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        };
        let request = format!(
            "GET {path} HTTP/1.0\r\nHost: {authority}\r\nAuthorization: Basic {}\r\nAccept: application/json\r\n\r\n",
            base64(self.credentials.as_bytes())
        );
        let (host, port, tls) = (self.host.clone(), self.port, self.tls.clone());
        // Blocking std I/O on the blocking pool: tokio's `net` and `io-util` features are
        // not among the core's, and a start reads a few queues.
        let response = tokio::task::spawn_blocking(move || {
            use std::net::ToSocketAddrs;
            let mut last = None;
            for addr in (host.as_str(), port).to_socket_addrs()? {
                match std::net::TcpStream::connect_timeout(&addr, WAIT) {
                    Ok(stream) => {
                        stream.set_read_timeout(Some(WAIT))?;
                        stream.set_write_timeout(Some(WAIT))?;
                        return match &tls {
                            Some(tls) => exchange(tls.connect(&host, stream)?, &request),
                            None => exchange(stream, &request),
                        };
                    }
                    Err(e) => last = Some(e),
                }
            }
            Err(last.unwrap_or_else(|| std::io::Error::other("no address")))
        })
        .await
        .map_err(|e| self.fail(e.to_string()))?
        .map_err(|e: std::io::Error| self.fail(e.to_string()))?;
        let text = String::from_utf8_lossy(&response);
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| self.fail("answered something that is not HTTP".into()))?;
        Ok((status, body.to_owned()))
    }
}

/// Writes `request` and reads the response to its end (HTTP/1.0: the server closes).
fn exchange(mut stream: impl Read + Write, request: &str) -> std::io::Result<Vec<u8>> {
    stream.write_all(request.as_bytes())?;
    stream.flush()?;
    let mut response = Vec::new();
    match stream.read_to_end(&mut response) {
        Ok(_) => Ok(response),
        // A server that closes without TLS's close_notify (many do after an HTTP/1.0
        // response): what was read is whole, the status line and the body's JSON say so.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !response.is_empty() => {
            Ok(response)
        }
        Err(e) => Err(e),
    }
}

/// One path segment: every byte but an unreserved one percent-encoded.
fn percent(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Standard base64 with padding (basic authentication).
fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let at = |i: usize| u32::from(chunk.get(i).copied().unwrap_or(0));
        let n = (at(0) << 16) | (at(1) << 8) | at(2);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ABC[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_and_percent_encode_as_the_api_expects() {
        assert_eq!(base64(b"guest:guest"), "Z3Vlc3Q6Z3Vlc3Q=");
        assert_eq!(base64(b"a"), "YQ==");
        assert_eq!(base64(b"ab"), "YWI=");
        assert_eq!(percent("/"), "%2F");
        assert_eq!(percent("rk-a_b.c"), "rk-a_b.c");
    }

    #[test]
    fn credentials_default_to_the_broker_urls_and_debug_hides_the_password() {
        let broker = ConnectionConfig::new("amqp://app:s3cret@localhost:5672/prod");
        let m = Management::new(&ManagementUrl::new("http://localhost:15672"), &broker);
        let m = m.map_err(|e| e.to_string());
        assert_eq!(
            m.as_ref().map(|m| (
                m.host.as_str(),
                m.port,
                m.credentials.as_str(),
                m.vhost.as_str()
            )),
            Ok(("localhost", 15672, "app:s3cret", "prod"))
        );
        let own = Management::new(
            &ManagementUrl::new("http://ops:p%40ss@127.0.0.1:15672/"),
            &broker,
        );
        assert_eq!(own.map(|m| m.credentials).ok().as_deref(), Some("ops:p@ss"));
        let shown = format!("{:?}", ManagementUrl::new("http://ops:pw@h:15672"));
        assert!(!shown.contains("pw"), "{shown}");
        assert!(ManagementUrl::new("ftp://h").check().is_err());
        assert!(ManagementUrl::new("h:15672").check().is_err());
    }

    #[test]
    fn loopback_is_localhost_127_slash_8_and_ipv6_one() {
        let host = |u: &str| {
            let url = url::Url::parse(u).unwrap_or_else(|e| panic!("{u}: {e}"));
            is_loopback(&url.host().unwrap_or_else(|| panic!("{u}: no host")))
        };
        for local in [
            "http://localhost:15672",
            "http://LOCALHOST",
            "http://127.0.0.1:15672",
            "http://127.8.9.10",
            "http://[::1]:15672",
        ] {
            assert!(host(local), "{local} is loopback");
        }
        for remote in [
            "http://rabbit:15672",
            "http://192.0.2.1:15672",
            "http://10.0.0.1",
            "http://128.0.0.1",
            "http://[2001:db8::1]",
            "http://localhost.example.com",
            "http://[::ffff:192.0.2.1]",
        ] {
            assert!(!host(remote), "{remote} is not loopback");
        }
    }

    #[test]
    fn plain_http_to_another_machine_is_refused_unless_allowed() {
        let broker = ConnectionConfig::new("amqp://app:s3cret@rabbit:5672/prod");
        for url in ["http://rabbit:15672", "http://app:pw@192.0.2.1:15672"] {
            match ManagementUrl::new(url).check() {
                Err(Error::PlainHttpRefused { url: shown }) => {
                    assert!(!shown.contains("pw"), "{shown}");
                }
                other => panic!("{url}: expected PlainHttpRefused, got {other:?}"),
            }
            // Refused where a worker or the CLI builds its client: before any connect.
            let refused = Management::new(&ManagementUrl::new(url), &broker);
            assert!(
                matches!(refused, Err(Error::PlainHttpRefused { .. })),
                "{url}"
            );
            let allowed = ManagementUrl::new(url).allow_plain_http();
            assert!(allowed.check().is_ok(), "{url}");
            assert!(Management::new(&allowed, &broker).is_ok(), "{url}");
        }
        let message = ManagementUrl::new("http://rabbit:15672")
            .check()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(message.contains("plain http refused"), "{message}");
        assert!(message.contains("allow-plain-http"), "{message}");
        assert!(ManagementUrl::new("http://127.0.0.1:15672").check().is_ok());
    }

    #[test]
    fn https_needs_the_tls_feature() {
        let https = ManagementUrl::new("https://ops:pw@rabbit:15671");
        if cfg!(feature = "tls") {
            let broker = ConnectionConfig::new("amqp://app:s3cret@rabbit:5672/prod");
            let api = Management::new(&https, &broker).map_err(|e| e.to_string());
            assert_eq!(
                api.as_ref()
                    .map(|m| (m.host.as_str(), m.port, m.tls.is_some())),
                Ok(("rabbit", 15671, true))
            );
            let default_port = ManagementUrl::new("https://rabbit").check();
            assert_eq!(
                default_port.ok().and_then(|u| u.port_or_known_default()),
                Some(443)
            );
        } else {
            match https.check() {
                Err(Error::HttpsUnavailable { url }) => assert!(!url.contains("pw"), "{url}"),
                other => panic!("expected HttpsUnavailable, got {other:?}"),
            }
        }
    }
}
