//! What the broker answered when it refused an AMQP method: its reply code and text
//! (404 NOT_FOUND, 406 PRECONDITION_FAILED, ...), for the topology's checks and moves.

use lapin::ErrorKind;

/// The reply code of a channel or connection the broker closed, if that is what `e` is.
pub(super) fn reply_code(e: &lapin::Error) -> Option<u16> {
    match e.kind() {
        ErrorKind::ProtocolError(a) => Some(a.get_id()),
        _ => None,
    }
}

/// The broker's reply text (it names the queue and the argument), or the error itself.
pub(super) fn reply_text(e: &lapin::Error) -> String {
    match e.kind() {
        ErrorKind::ProtocolError(a) => a.get_message().to_string(),
        _ => e.to_string(),
    }
}
