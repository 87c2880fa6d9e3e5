//! Validation of AMQP short strings (names, routing keys, header names).
//!
//! lapin's `ShortString::from` panics above 255 bytes; every name that reaches lapin goes
//! through [`short`] first so bad input becomes a typed [`Error`] instead.

use crate::error::{Error, Result};
use lapin::types::ShortString;

/// The AMQP 0-9-1 limit for a short string, in bytes.
pub(crate) const MAX_SHORT: usize = 255;

/// Checks that `value` fits an AMQP short string and converts it.
pub(crate) fn short(what: &'static str, value: &str) -> Result<ShortString> {
    check(what, value)?;
    Ok(ShortString::from(value))
}

/// Checks that `value` fits an AMQP short string.
pub(crate) fn check(what: &'static str, value: &str) -> Result<()> {
    if value.len() > MAX_SHORT {
        return Err(Error::InvalidName {
            what,
            value: truncate(value, 64).to_owned(),
            reason: "longer than 255 bytes",
        });
    }
    Ok(())
}

/// Checks a queue name: non-empty (server-named queues break recovery) and not `amq.`-prefixed.
pub(crate) fn check_queue(value: &str) -> Result<()> {
    check("queue name", value)?;
    if value.is_empty() {
        return Err(Error::InvalidName {
            what: "queue name",
            value: String::new(),
            reason: "empty: server-named queues cannot be recovered, name every queue",
        });
    }
    if value.starts_with("amq.") {
        return Err(Error::InvalidName {
            what: "queue name",
            value: value.to_owned(),
            reason: "the amq. prefix is reserved by the broker",
        });
    }
    Ok(())
}

/// Cuts `s` to at most `max` bytes on a char boundary.
pub(crate) fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_names_are_a_typed_error_not_a_panic() {
        let long = "q".repeat(256);
        assert!(matches!(
            short("queue name", &long),
            Err(Error::InvalidName { .. })
        ));
        assert!(short("queue name", &"q".repeat(255)).is_ok());
    }

    #[test]
    fn queue_names_must_be_named_and_unreserved() {
        assert!(check_queue("").is_err());
        assert!(check_queue("amq.gen-1").is_err());
        assert!(check_queue("orders").is_ok());
    }

    #[test]
    fn truncate_respects_char_boundaries() {
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("abc", 10), "abc");
    }
}
