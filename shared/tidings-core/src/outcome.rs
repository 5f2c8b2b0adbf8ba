//! What became of one queue message: the value every handler returns and the queue side
//! ([`crate::messages::settle`]) applies.

use std::time::Duration;

/// What a handler decided for one message.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Done (or nothing to do): delete the message.
    Done,
    /// Try again after this delay: the message's visibility is set to it and it is reported as
    /// a batch item failure; after `max_receives` the queue moves it to the DLQ.
    Retry(Duration),
    /// Not started (a batch's deadline came first): the message goes back untouched as a new
    /// copy, so the receive it was given does not count towards the DLQ (a retry would: a
    /// message handed back a few times under load would be dead-lettered without ever having
    /// been tried). Falls back to a retry at once if the copy cannot be sent.
    HandBack,
    /// Not sent: a rate gate said to wait this long (the provider never saw it). The message
    /// goes back as a new copy delayed by it, so that neither the receive nor the delivery's
    /// attempts count: waiting one's turn is no failure. Falls back to a retry after it if the
    /// copy cannot be sent.
    HandBackAfter(Duration),
    /// The message can never be processed (malformed): it goes straight to the DLQ with the
    /// reason, and the batch goes on.
    Reject(String),
}
