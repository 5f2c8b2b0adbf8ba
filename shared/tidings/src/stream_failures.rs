//! `tidings ops stream-failures list|replay`: what the relay did not relay, as recorded on the
//! stream-failures queue (`template.yaml` StreamFailuresQueue; the embedded backend's queue of
//! the same name locally).
//!
//! Two kinds of entries are there: the relay's own record of a poison record (condition
//! `PoisonRecord`, with the record's keys), and the event source mapping's record of a batch it
//! gave up on after its retries (`RetryAttemptsExhausted`: the shard and the range of sequence
//! numbers, no keys). `replay` re-drives the item an entry names
//! ([`tidings_core::notify::relay::redrive`]: a notification still `accepted` is queued again, a
//! campaign page task not done is queued again, anything else has nothing waiting on it) and
//! deletes the entries it replayed. An entry without keys names no item: it stays, and the
//! tick's sweep re-drives its notifications once they are old enough
//! ([`tidings_core::notify::sweep`]). An entry whose item still does not parse stays too.
//!
//! Every command prints one JSON document on stdout.

use std::sync::Arc;
use std::time::Duration;

use clap::Subcommand;
use serde_json::{Value, json};
use tidings_core::Deps;
use tidings_core::notify::relay::{self, Redriven, STREAM_FAILURES_QUEUE, StreamFailure};
use tidings_core::ports::{Received, SystemClock};

use crate::BackendArgs;
use crate::backend::Backend;

#[derive(Subcommand)]
pub enum StreamFailuresCommand {
    /// Lists every entry: its condition, reason, positions and keys.
    List,
    /// Re-drives what each entry names and deletes the entries replayed.
    Replay,
}

/// How long the entries read stay hidden from other readers while a command runs.
const READ_VISIBILITY: Duration = Duration::from_secs(60);

/// Every entry of the queue, each received once (hidden for [`READ_VISIBILITY`]).
async fn read_all(deps: &Deps) -> anyhow::Result<Vec<Received>> {
    let mut all = Vec::new();
    loop {
        let got = deps.queues.receive(STREAM_FAILURES_QUEUE, 10, READ_VISIBILITY, Duration::ZERO).await?;
        if got.is_empty() {
            return Ok(all);
        }
        all.extend(got);
    }
}

/// Makes entries visible again at once (what a command did not delete).
async fn release(deps: &Deps, entries: &[Received]) {
    for e in entries {
        if let Err(err) = deps.queues.change_visibility(STREAM_FAILURES_QUEUE, &e.receipt, Duration::ZERO).await {
            tracing::warn!(error = %err, "an entry stays hidden until its visibility ends");
        }
    }
}

fn view(entry: &Received, failure: Option<&StreamFailure>) -> Value {
    match failure {
        Some(f) => json!({
            "message_id": entry.message_id,
            "condition": f.context.condition,
            "reason": f.context.reason,
            "shard_id": f.batch.shard_id,
            "batch_size": f.batch.batch_size,
            "start_sequence_number": f.batch.start_sequence_number,
            "end_sequence_number": f.batch.end_sequence_number,
            "key": f.key().map(|k| json!({"pk": k.pk, "sk": k.sk})),
        }),
        None => json!({"message_id": entry.message_id, "unreadable": true, "body": entry.body}),
    }
}

pub async fn run(command: StreamFailuresCommand, args: &BackendArgs) -> anyhow::Result<()> {
    let backend = Backend::open(args, Arc::new(SystemClock)).await?;
    let deps = &backend.deps;
    let entries = read_all(deps).await?;
    let out = match command {
        StreamFailuresCommand::List => {
            let listed: Vec<Value> =
                entries.iter().map(|e| view(e, serde_json::from_str::<StreamFailure>(&e.body).ok().as_ref())).collect();
            release(deps, &entries).await;
            json!({ "stream_failures": listed })
        }
        StreamFailuresCommand::Replay => {
            let mut replayed = Vec::new();
            let mut kept = Vec::new();
            let mut left = Vec::new();
            for e in entries {
                let failure = serde_json::from_str::<StreamFailure>(&e.body).ok();
                let Some(key) = failure.as_ref().and_then(StreamFailure::key) else {
                    let mut v = view(&e, failure.as_ref());
                    v["kept"] = json!("no keys: the tick's sweep re-drives its notifications still accepted");
                    kept.push(v);
                    left.push(e);
                    continue;
                };
                match relay::redrive(deps, &key).await {
                    Ok(outcome) => {
                        deps.queues.delete(STREAM_FAILURES_QUEUE, &e.receipt).await?;
                        let mut v = view(&e, failure.as_ref());
                        v["replayed"] = json!(outcome == Redriven::Queued);
                        replayed.push(v);
                    }
                    Err(err) => {
                        let mut v = view(&e, failure.as_ref());
                        v["kept"] = json!(err.to_string());
                        kept.push(v);
                        left.push(e);
                    }
                }
            }
            release(deps, &left).await;
            json!({ "replayed": replayed, "kept": kept })
        }
    };
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}
