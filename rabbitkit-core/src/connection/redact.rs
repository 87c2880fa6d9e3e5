//! The one password scrubber: URLs redacted through the same parser lapin uses (`url`),
//! and messages cleaned of every password a set of URLs holds.
//!
//! Used by the connection (logs, `Debug`), the config file errors and the operator CLI.

use url::Url;

const MASK: &str = "***";

/// Replaces the password of an AMQP URL with `***`.
///
/// The URL is read by the `url` crate, the parser lapin's `AMQPUri` is built on, so the
/// password is exactly what lapin would send: the userinfo ends at the *last* `@` before
/// the host, and a password with `@`, `:` or percent-escapes is masked whole. A URL that
/// does not parse keeps only what follows its last `@`, so nothing before it can leak.
pub fn redact(url: &str) -> String {
    match Url::parse(url) {
        Ok(mut parsed) => {
            if parsed.password().is_none_or(str::is_empty) {
                return url.to_owned();
            }
            if parsed.set_password(Some(MASK)).is_err() {
                return fallback(url);
            }
            parsed.into()
        }
        Err(_) => fallback(url),
    }
}

/// For a URL that does not parse: the scheme, `***`, and what follows the last `@`.
fn fallback(url: &str) -> String {
    let Some(at) = url.rfind('@') else {
        return url.to_owned();
    };
    let scheme = url.find("://").map_or("", |i| &url[..i + 3]);
    format!("{scheme}{MASK}{}", &url[at..])
}

/// The forms a URL's password can take in a message: as written in the URL
/// (percent-encoded) and decoded. Empty passwords give nothing.
fn passwords(url: &str) -> Vec<String> {
    let raw = match Url::parse(url) {
        Ok(parsed) => parsed.password().map(str::to_owned),
        // Not parseable: everything between the scheme and the last `@` is treated as
        // secret (user name included), the safe side.
        Err(_) => url.rfind('@').map(|at| {
            let start = url.find("://").map_or(0, |i| i + 3).min(at);
            url[start..at].to_owned()
        }),
    };
    let mut out = Vec::new();
    if let Some(raw) = raw.filter(|p| !p.is_empty()) {
        if let Ok(decoded) = percent_encoding::percent_decode_str(&raw).decode_utf8()
            && decoded != raw
            && !decoded.is_empty()
        {
            out.push(decoded.into_owned());
        }
        out.push(raw);
    }
    // Longest first, so a password that contains another one is masked whole.
    out.sort_by_key(|p| std::cmp::Reverse(p.len()));
    out
}

/// `text` with every URL of `urls` replaced by its [`redact`]ed form and every password
/// they hold (as written or percent-decoded) replaced by `***` wherever else it appears.
///
/// Redacted URLs are left as they are, so a user name equal to the password stays
/// readable inside them (`amqp://guest:***@host`).
pub fn scrub<'a>(text: &str, urls: impl IntoIterator<Item = &'a str>) -> String {
    let urls: Vec<&str> = urls.into_iter().collect();
    let mut secrets: Vec<String> = urls.iter().flat_map(|u| passwords(u)).collect();
    secrets.sort_by_key(|p| std::cmp::Reverse(p.len()));
    secrets.dedup();
    let redacted: Vec<String> = urls.iter().map(|u| redact(u)).collect();
    // Split the text into URL occurrences (kept, redacted) and the rest (scrubbed).
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    loop {
        let next = urls
            .iter()
            .enumerate()
            .filter(|(_, u)| !u.is_empty())
            .filter_map(|(i, u)| rest.find(u).map(|at| (at, i)))
            .min_by_key(|&(at, i)| (at, std::cmp::Reverse(urls[i].len())));
        let Some((at, i)) = next else {
            out.push_str(&mask_all(rest, &secrets));
            return out;
        };
        out.push_str(&mask_all(&rest[..at], &secrets));
        out.push_str(&redacted[i]);
        rest = &rest[at + urls[i].len()..];
    }
}

fn mask_all(text: &str, secrets: &[String]) -> String {
    let mut out = text.to_owned();
    for s in secrets {
        out = out.replace(s.as_str(), MASK);
    }
    out
}

/// Every `scheme://…` token of a document (a config file): what [`scrub`] needs to clean
/// a message quoting that document. A token ends at a quote, a comma, a bracket or
/// whitespace.
pub(crate) fn urls_in(src: &str) -> Vec<&str> {
    let is_end = |c: char| matches!(c, '"' | '\'' | ',' | ']' | '[') || c.is_whitespace();
    let mut out = Vec::new();
    for (i, _) in src.match_indices("://") {
        let start = src[..i]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
            .map_or(0, |p| p + 1);
        let end = src[i + 3..].find(is_end).map_or(src.len(), |e| i + 3 + e);
        out.push(&src[start..end]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_is_masked_and_the_rest_kept() {
        assert_eq!(
            redact("amqp://app:s3cret@host:5672/%2f"),
            "amqp://app:***@host:5672/%2f"
        );
        assert_eq!(redact("amqp://host/vh"), "amqp://host/vh");
        assert_eq!(redact("amqp://app@host/vh"), "amqp://app@host/vh");
        assert_eq!(
            redact("amqp://app:pw@host/vh?heartbeat=5"),
            "amqp://app:***@host/vh?heartbeat=5"
        );
    }

    #[test]
    fn a_password_with_at_colon_or_escapes_is_masked_whole() {
        for url in [
            "amqp://app:p@ss@host:5672/v",
            "amqp://app:p:a:ss@host:5672/v",
            "amqp://app:p%40ss%3Aw0rd@host:5672/v",
            "amqp://app:@@@host/v",
        ] {
            let r = redact(url);
            assert!(r.starts_with("amqp://app:***@host"), "{url} -> {r}");
            for leak in ["ss", "w0rd", "p%40", "@@"] {
                assert!(!r.contains(leak), "{url} leaks {leak}: {r}");
            }
        }
    }

    #[test]
    fn an_unparseable_url_keeps_nothing_before_its_last_at() {
        let r = redact("amqp://app:pa/ss@host/v");
        assert!(!r.contains("pa/ss") && !r.contains("app"), "{r}");
        assert!(r.ends_with("@host/v"), "{r}");
    }

    #[test]
    fn scrub_masks_every_password_of_several_urls_in_any_form() {
        let a = "amqp://app:s3cr@t@one:5672/v";
        let b = "amqp://ops:p%40ss%3Aw0rd@two:5672/v";
        let text =
            format!("cannot reach {a} nor {b}; refused s3cr@t, then p@ss:w0rd and p%40ss%3Aw0rd");
        let s = scrub(&text, [a, b]);
        for leak in ["s3cr@t", "p@ss:w0rd", "p%40ss%3Aw0rd", "w0rd"] {
            assert!(!s.contains(leak), "leaks {leak}: {s}");
        }
        assert!(
            s.contains("amqp://app:***@one:5672/v") && s.contains("amqp://ops:***@two:5672/v"),
            "{s}"
        );
    }

    #[test]
    fn a_user_named_like_the_password_stays_readable_in_the_url() {
        let url = "amqp://guest:guest@host:5672/v";
        let s = scrub(&format!("at {url}: user guest refused"), [url]);
        assert_eq!(s, "at amqp://guest:***@host:5672/v: user *** refused");
    }

    #[test]
    fn urls_are_found_in_a_document() {
        let src = "url = [\"amqp://a:x@h1/v\", 'amqps://b:y@h2/v']\nother = \"http://z\"";
        assert_eq!(
            urls_in(src),
            ["amqp://a:x@h1/v", "amqps://b:y@h2/v", "http://z"]
        );
    }
}
