//! The channel lanes' step: what one receive of a channel queue holds, channel tasks
//! (`super::worker`) and send batches (`super::send_batch`), each to its path.

use std::time::Duration;

use super::model::ChannelMessage;
use super::worker;
use crate::deps::Deps;
use crate::outcome::Outcome;
use crate::tasks::Task;

/// The channel lanes' step: a batch of channel messages. Channel tasks go through
/// [`handle_channel_batch_until`]; each send batch through `super::send_batch`, one after
/// the other (after the first, one is handed back when its sends could not end before the
/// deadline).
pub struct ChannelSend;

impl crate::tasks::BatchStep for ChannelSend {
    type Body = ChannelMessage;
    const WHAT: &'static str = "channel task";
    async fn run_batch(
        deps: &Deps,
        messages: &[Task<ChannelMessage>],
        deadline: Option<std::time::Instant>,
    ) -> Vec<Outcome> {
        let mut outcomes: Vec<Option<Outcome>> = vec![None; messages.len()];
        let mut tasks = Vec::new();
        let mut at = Vec::new();
        let mut batches = 0usize;
        for (i, m) in messages.iter().enumerate() {
            match &m.body {
                ChannelMessage::Task(task) => {
                    tasks.push(Task { body: task.clone(), receive_count: m.receive_count });
                    at.push(i);
                }
                ChannelMessage::Batch(batch) => {
                    if batches > 0 && worker::too_late(deps, deadline) {
                        outcomes[i] = Some(Outcome::HandBack);
                        continue;
                    }
                    let task = Task { body: batch.clone(), receive_count: m.receive_count };
                    outcomes[i] = Some(super::send_batch::handle(deps, &task, deadline).await);
                    batches += 1;
                }
            }
        }
        if !tasks.is_empty() {
            let done = worker::handle_channel_batch_until(deps, &tasks, deadline).await;
            for (i, outcome) in at.into_iter().zip(done) {
                outcomes[i] = Some(outcome);
            }
        }
        outcomes.into_iter().map(|o| o.unwrap_or(Outcome::Retry(Duration::ZERO))).collect()
    }
}
