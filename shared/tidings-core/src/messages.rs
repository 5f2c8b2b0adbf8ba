//! Queue message handling shared by every worker: what became of one message.

use std::time::Duration;

/// What a handler decided for one message.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Done (or nothing to do): delete the message.
    Done,
    /// Try again after this delay: the message's visibility is set to it and it is reported as
    /// a batch item failure; after `max_receives` the queue moves it to the DLQ.
    Retry(Duration),
    /// The message can never be processed (malformed): it goes straight to the DLQ with the
    /// reason, and the batch goes on.
    Reject(String),
}

/// The body put on a DLQ for a rejected message: what an operator needs to judge it.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Rejected {
    pub rejected: String,
    pub queue: String,
    pub at: String,
    pub receive_count: u32,
    pub original_body: String,
}
