//! The one management API read the CLI needs: the queues of the broker URL's vhost (AMQP
//! cannot list queues). Plain HTTP/1.0 over a TCP connection: the CLI carries no HTTP
//! client for a single GET.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{BoxError, ConnectionConfig};

const WAIT: Duration = Duration::from_secs(15);

/// One queue as the management API lists it.
#[derive(Debug)]
pub(crate) struct Queue {
    pub(crate) name: String,
    /// Absent while the broker has not computed it yet.
    pub(crate) messages: Option<u64>,
}

/// The queues of `connection`'s vhost, from the management API at `base`
/// (`http://[user:pass@]host:port`; user and password default to the broker URL's).
pub(crate) async fn queues(
    base: &str,
    connection: &ConnectionConfig,
) -> Result<Vec<Queue>, BoxError> {
    let uri = connection.validate()?;
    let rest = base
        .strip_prefix("http://")
        .ok_or("the management URL must be http://host:port (https is not supported)")?;
    let rest = rest.trim_end_matches('/');
    let (userinfo, host) = match rest.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, rest),
    };
    let credentials = match userinfo {
        Some(u) => u.to_owned(),
        None => format!(
            "{}:{}",
            uri.authority.userinfo.username, uri.authority.userinfo.password
        ),
    };
    let path = format!("/api/queues/{}?columns=name,messages", percent(&uri.vhost));
    let request = format!(
        "GET {path} HTTP/1.0\r\nHost: {host}\r\nAuthorization: Basic {}\r\nAccept: application/json\r\n\r\n",
        base64(credentials.as_bytes())
    );
    let response = tokio::time::timeout(WAIT, async {
        let mut stream = tokio::net::TcpStream::connect(host).await?;
        stream.write_all(request.as_bytes()).await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        Ok::<_, std::io::Error>(response)
    })
    .await
    .map_err(|_| format!("the management API at {host} did not answer within {WAIT:?}"))?
    .map_err(|e| format!("the management API at {host}: {e}"))?;
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split(' ').nth(1).unwrap_or("?");
    match status {
        "200" => {
            let list: Vec<serde_json::Value> = serde_json::from_str(body)
                .map_err(|e| format!("the management API's queue list does not parse: {e}"))?;
            Ok(list
                .iter()
                .filter_map(|q| {
                    Some(Queue {
                        name: q["name"].as_str()?.to_owned(),
                        messages: q["messages"].as_u64(),
                    })
                })
                .collect())
        }
        "401" => Err(format!("the management API at {host} refused the user (401)").into()),
        "404" => Err(format!(
            "the management API at {host} knows no vhost {:?} (404)",
            uri.vhost
        )
        .into()),
        other => Err(format!("the management API at {host} answered {other}").into()),
    }
}

/// A vhost as one path segment: every byte but an unreserved one percent-encoded.
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
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
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
        assert_eq!(base64(b"abc"), "YWJj");
        assert_eq!(percent("/"), "%2F");
        assert_eq!(percent("rk-a_b.c"), "rk-a_b.c");
    }
}
