//! One handler shape for every queue: the body is parsed into the feature's typed task (its
//! tenant checked as it deserializes: [`crate::TenantId`]), the feature runs its step, and the
//! step's error is classified into an [`Outcome`] here, once. A feature writes only its step
//! ([`Step`], or [`BatchStep`] when a batch is cheaper than its messages one by one).

use std::future::Future;

use serde::de::DeserializeOwned;
use tracing::warn;

use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::outcome::Outcome;
use crate::ports::Received;
use crate::retry::backoff;

/// A queue message parsed: its typed body and how many times it was received.
#[derive(Clone, Debug, PartialEq)]
pub struct Task<T> {
    pub body: T,
    /// The message's receive count (1 the first time): the retry backoff grows with it.
    pub receive_count: u32,
}

impl<T> Task<T> {
    /// A task received for the first time (tests, and work started in-process).
    pub fn new(body: T) -> Self {
        Self { body, receive_count: 1 }
    }
}

/// Parses a message's body as a `T`; a body that does not parse (or names an invalid tenant)
/// is rejected with the reason: it can never be processed.
pub fn parse<T: DeserializeOwned>(message: &Received, what: &str) -> Result<Task<T>, Outcome> {
    match serde_json::from_str(&message.body) {
        Ok(body) => Ok(Task { body, receive_count: message.receive_count }),
        Err(e) => Err(Outcome::Reject(format!("malformed {what}: {e}"))),
    }
}

/// The outcome of a step's result: invalid input is rejected (to the DLQ, with the field), a
/// step that could not finish is retried with a backoff that grows with its receives.
pub fn classify(deps: &Deps, what: &str, receive_count: u32, result: CoreResult<Outcome>) -> Outcome {
    match result {
        Ok(outcome) => outcome,
        Err(CoreError::Invalid { field, detail } | CoreError::MissingParam { field, detail }) => {
            Outcome::Reject(format!("{what}: {field}: {detail}"))
        }
        Err(e) => {
            warn!(error = %e, what, "step failed; will retry");
            retry(deps, receive_count)
        }
    }
}

/// A retry after the backoff of a message received `receive_count` times.
pub fn retry(deps: &Deps, receive_count: u32) -> Outcome {
    Outcome::Retry(backoff(receive_count, deps.config.retry_base, deps.config.retry_cap, None))
}

/// A feature's work for one message of its queue.
pub trait Step {
    /// The message's body.
    type Body: DeserializeOwned;
    /// What the body is called in a rejection ("channel task").
    const WHAT: &'static str;
    /// Runs one task. An error is classified by [`classify`].
    fn run(deps: &Deps, task: &Task<Self::Body>) -> impl Future<Output = CoreResult<Outcome>> + Send;
}

/// A feature's work for a batch of its queue's messages at once.
pub trait BatchStep {
    type Body: DeserializeOwned;
    const WHAT: &'static str;
    /// One outcome per task, in order, starting no provider call that could not end by
    /// `deadline`.
    fn run_batch(
        deps: &Deps,
        tasks: &[Task<Self::Body>],
        deadline: Option<std::time::Instant>,
    ) -> impl Future<Output = Vec<Outcome>> + Send;
}

/// Handles one message with `S`: parse, run, classify.
pub async fn handle<S: Step>(deps: &Deps, message: &Received) -> Outcome {
    let task = match parse::<S::Body>(message, S::WHAT) {
        Ok(task) => task,
        Err(rejected) => return rejected,
    };
    classify(deps, S::WHAT, task.receive_count, S::run(deps, &task).await)
}

/// Handles a batch with `S`: the messages that do not parse are rejected, the others go to
/// the step together. One outcome per message, in order.
pub async fn handle_batch<S: BatchStep>(
    deps: &Deps,
    messages: &[Received],
    deadline: Option<std::time::Instant>,
) -> Vec<Outcome> {
    let mut outcomes: Vec<Option<Outcome>> = vec![None; messages.len()];
    let mut parsed = Vec::with_capacity(messages.len());
    let mut at = Vec::with_capacity(messages.len());
    for (i, message) in messages.iter().enumerate() {
        match parse::<S::Body>(message, S::WHAT) {
            Ok(task) => {
                parsed.push(task);
                at.push(i);
            }
            Err(rejected) => outcomes[i] = Some(rejected),
        }
    }
    let done = S::run_batch(deps, &parsed, deadline).await;
    for (i, outcome) in at.into_iter().zip(done) {
        outcomes[i] = Some(outcome);
    }
    // A step answers every task; one it left out is tried again rather than lost.
    outcomes.into_iter().map(|o| o.unwrap_or(Outcome::Retry(std::time::Duration::ZERO))).collect()
}
