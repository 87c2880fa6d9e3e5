//! Keeping the database password out of logs, errors and `Debug`.
//!
//! sqlx's `PgConnectOptions` derives `Debug` with the password in it, and a driver error can
//! quote what it was given: everything the inbox reports goes through [`scrub`].

/// The URL's password (percent-decoded), if any.
pub(super) fn password(raw: &str) -> Option<String> {
    let url = url::Url::parse(raw).ok()?;
    let p = url.password()?;
    let decoded = percent_encoding::percent_decode_str(p)
        .decode_utf8_lossy()
        .into_owned();
    Some(decoded)
}

/// The URL with its password replaced by `***`.
pub(super) fn url(raw: &str) -> String {
    match url::Url::parse(raw) {
        Ok(mut u) => {
            if u.password().is_some() {
                // Only fails for URLs that cannot have a password: nothing to hide then.
                let _ = u.set_password(Some("***"));
            }
            u.to_string()
        }
        Err(_) => "(unparsable URL)".into(),
    }
}

/// `text` with every occurrence of `password` (as given and percent-encoded) replaced.
pub(super) fn scrub(text: &str, password: Option<&str>) -> String {
    let Some(p) = password.filter(|p| !p.is_empty()) else {
        return text.to_owned();
    };
    let encoded =
        percent_encoding::utf8_percent_encode(p, percent_encoding::NON_ALPHANUMERIC).to_string();
    text.replace(p, "***").replace(&encoded, "***")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_and_text_lose_the_password() {
        let raw = "postgres://u:s%40cret@h:5433/db";
        assert_eq!(password(raw).as_deref(), Some("s@cret"));
        assert_eq!(url(raw), "postgres://u:***@h:5433/db");
        let p = password(raw);
        assert_eq!(
            scrub("bad s@cret and s%40cret", p.as_deref()),
            "bad *** and ***"
        );
        assert_eq!(scrub("x", None), "x");
    }
}
