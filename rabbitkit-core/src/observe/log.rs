//! The worker's log lines about failures and shutdown.
//!
//! One WARN per failed attempt (what failed, and what happens next), one INFO when a
//! message is parked. Nothing is logged per message on the success path.

use crate::decide::{CopyKind, Decision, SettleSpec};
use crate::delivery::Delivery;
use crate::settle::SettleReport;

/// Error texts longer than this are cut in log lines (the parking headers keep more).
const MAX_ERROR_TEXT: usize = 256;

/// `text`, cut at a char boundary to at most [`MAX_ERROR_TEXT`] bytes, marked when cut.
pub(crate) fn truncate(text: &str) -> std::borrow::Cow<'_, str> {
    if text.len() <= MAX_ERROR_TEXT {
        return text.into();
    }
    let mut end = MAX_ERROR_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end]).into()
}

/// Logs a failed attempt whose copy is about to be published: one WARN, with what failed
/// and where the message goes next.
pub(crate) fn attempt_failed(spec: &SettleSpec, delivery: &Delivery, decision: &Decision) {
    let Decision::Republish { kind, failure, .. } = decision else {
        return;
    };
    let message_id = delivery.message_id().unwrap_or("");
    let attempt = delivery.attempt().number;
    let error = truncate(&failure.message);
    match kind {
        CopyKind::Retry { tier, next_attempt } => tracing::warn!(
            handler = %spec.handler,
            queue = %spec.queue,
            message_id,
            attempt,
            error.kind = %failure.kind,
            error.message = %error,
            next = "retry",
            retry.tier = %humantime::format_duration(*tier),
            retry.attempt = next_attempt,
            "handler failed; retrying after the tier's delay"
        ),
        CopyKind::Park { reason } => tracing::warn!(
            handler = %spec.handler,
            queue = %spec.queue,
            message_id,
            attempt,
            error.kind = %failure.kind,
            error.message = %error,
            next = "park",
            park.reason = reason.as_str(),
            "handler failed; parking the message"
        ),
    }
}

/// What to remember about a decision until its settlement is known.
pub(crate) fn parking_reason(decision: &Decision) -> Option<&'static str> {
    match decision {
        Decision::Republish {
            kind: CopyKind::Park { reason },
            ..
        } => Some(reason.as_str()),
        _ => None,
    }
}

/// Logs the settlement when it parked a message (INFO: the message left the work queue
/// for good until an operator replays it).
pub(crate) fn settled(
    spec: &SettleSpec,
    delivery: &Delivery,
    parked: Option<&'static str>,
    report: &SettleReport,
) {
    if let (Some(reason), SettleReport::Parked) = (parked, report) {
        tracing::info!(
            handler = %spec.handler,
            queue = %spec.queue,
            message_id = delivery.message_id().unwrap_or(""),
            attempt = delivery.attempt().number,
            park.reason = reason,
            parking_queue = %crate::retry::parking_queue(&spec.queue),
            "message parked"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_error_texts_are_cut_at_a_char_boundary() {
        assert_eq!(truncate("short"), "short");
        let long = "é".repeat(300);
        let cut = truncate(&long);
        assert!(cut.len() <= MAX_ERROR_TEXT + '…'.len_utf8());
        assert!(cut.ends_with('…'));
    }
}
