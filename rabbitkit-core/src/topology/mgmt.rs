//! The management API read a start needs: one queue's type, arguments and effective policy
//! (AMQP reports none of them). Plain HTTP/1.0 over TCP: the core carries no HTTP client
//! for a single GET.

use std::time::Duration;

use std::io::{Read, Write};

use lapin::uri::AMQPUri;

use crate::connection::redact;
use crate::error::{Error, Result};

/// How long one request may take.
const WAIT: Duration = Duration::from_secs(15);

/// The management API's base URL, `http://[user:password@]host:port`. The user and the
/// password default to the broker URL's. Its `Debug` never shows the password.
#[derive(Clone, PartialEq, Eq)]
pub struct ManagementUrl(String);

impl ManagementUrl {
    /// The management API at `url` (checked when the topology is validated).
    pub fn new(url: impl Into<String>) -> Self {
        Self(url.into())
    }

    /// The URL as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Refuses what the client cannot reach: another scheme than `http`, no host.
    pub(crate) fn check(&self) -> Result<url::Url> {
        let bad = |why: &str| Error::Config(format!("management-url {}: {why}", redact(&self.0)));
        let parsed = url::Url::parse(&self.0).map_err(|e| bad(&e.to_string()))?;
        if parsed.scheme() != "http" {
            return Err(bad("must be http://host:port (https is not supported)"));
        }
        if parsed.host_str().is_none_or(str::is_empty) {
            return Err(bad("has no host"));
        }
        Ok(parsed)
    }
}

impl std::fmt::Debug for ManagementUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ManagementUrl")
            .field(&redact(&self.0))
            .finish()
    }
}

/// A management API bound to a vhost and a user.
pub(crate) struct Management {
    /// `host:port`.
    host: String,
    /// `user:password`.
    credentials: String,
    vhost: String,
    /// For messages: the URL without its password.
    shown: String,
}

impl Management {
    /// The API at `url`, for the vhost of `broker`, as the URL's user or the broker's.
    pub(crate) fn new(url: &ManagementUrl, broker: &AMQPUri) -> Result<Self> {
        let parsed = url.check()?;
        let host = format!(
            "{}:{}",
            parsed.host_str().unwrap_or_default(),
            parsed.port_or_known_default().unwrap_or(15672)
        );
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
            credentials,
            vhost: broker.vhost.clone(),
            shown: redact(url.as_str()),
        })
    }

    /// The queue `name` of the vhost as `GET /api/queues/{vhost}/{name}` describes it;
    /// `None` when the API does not know it (404).
    pub(crate) async fn queue(&self, name: &str) -> Result<Option<serde_json::Value>> {
        let path = format!("/api/queues/{}/{}", percent(&self.vhost), percent(name));
        let request = format!(
            "GET {path} HTTP/1.0\r\nHost: {}\r\nAuthorization: Basic {}\r\nAccept: application/json\r\n\r\n",
            self.host,
            base64(self.credentials.as_bytes())
        );
        let fail =
            |why: String| Error::Config(format!("the management API at {}: {why}", self.shown));
        // Blocking std I/O on the blocking pool: tokio's `net` and `io-util` features are
        // not among the core's, and a start reads one queue.
        let host = self.host.clone();
        let response = tokio::task::spawn_blocking(move || {
            use std::net::ToSocketAddrs;
            let mut last = None;
            for addr in host.to_socket_addrs()? {
                match std::net::TcpStream::connect_timeout(&addr, WAIT) {
                    Ok(mut stream) => {
                        stream.set_read_timeout(Some(WAIT))?;
                        stream.set_write_timeout(Some(WAIT))?;
                        stream.write_all(request.as_bytes())?;
                        let mut response = Vec::new();
                        stream.read_to_end(&mut response)?;
                        return Ok(response);
                    }
                    Err(e) => last = Some(e),
                }
            }
            Err(last.unwrap_or_else(|| std::io::Error::other("no address")))
        })
        .await
        .map_err(|e| fail(e.to_string()))?
        .map_err(|e: std::io::Error| fail(e.to_string()))?;
        let text = String::from_utf8_lossy(&response);
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        match head.split(' ').nth(1).unwrap_or("?") {
            "200" => serde_json::from_str(body)
                .map(Some)
                .map_err(|e| fail(format!("the queue's description does not parse: {e}"))),
            "404" => Ok(None),
            "401" => Err(fail("the user is refused (401)".into())),
            other => Err(fail(format!("answered {other}"))),
        }
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
        let broker: AMQPUri = "amqp://app:s3cret@h:5672/prod".parse().unwrap_or_default();
        let m = Management::new(&ManagementUrl::new("http://h:15672"), &broker);
        let m = m.map_err(|e| e.to_string());
        assert_eq!(
            m.as_ref()
                .map(|m| (m.host.as_str(), m.credentials.as_str(), m.vhost.as_str())),
            Ok(("h:15672", "app:s3cret", "prod"))
        );
        let own = Management::new(&ManagementUrl::new("http://ops:p%40ss@h:15672/"), &broker);
        assert_eq!(own.map(|m| m.credentials).ok().as_deref(), Some("ops:p@ss"));
        let shown = format!("{:?}", ManagementUrl::new("http://ops:pw@h:15672"));
        assert!(!shown.contains("pw"), "{shown}");
        assert!(ManagementUrl::new("https://h").check().is_err());
        assert!(ManagementUrl::new("h:15672").check().is_err());
    }
}
