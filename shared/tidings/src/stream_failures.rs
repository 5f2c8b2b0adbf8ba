//! `tidings ops stream-failures list|replay`: what the relay did not relay, as recorded on the
//! stream-failures queue (`template.yaml` StreamFailuresQueue; the embedded backend's queue of
//! the same name locally).
//!
//! Two kinds of entries are there: the relay's own record of a poison record (condition
//! `PoisonRecord`, with the record's keys), and the event source mapping's record of a batch it
//! gave up on after its retries (`RetryAttemptsExhausted`: the shard and the range of sequence
//! numbers, no keys). `replay` re-drives the items an entry names
//! ([`tidings_core::notify::relay::redrive`]: a notification still `accepted` is queued again, a
//! campaign page task not done is queued again, anything else has nothing waiting on it) and
//! deletes the entries it replayed. A mapping's entry names its items by their positions: on
//! `--backend aws` they are read back from the stream (which keeps them 24 hours). An entry
//! whose records the stream no longer has stays, and the tick's sweep re-drives its
//! notifications still `accepted` ([`tidings_core::notify::sweep`]); so does an entry whose item
//! still does not parse.
//!
//! Every command prints one JSON document on stdout.

use std::sync::Arc;
use std::time::Duration;

use clap::Subcommand;
use serde_json::{Value, json};
use tidings_core::Deps;
use tidings_core::notify::relay::{self, Redriven, STREAM_FAILURES_QUEUE, StreamFailure};
use tidings_core::ports::{Key, Received, SystemClock};

use crate::BackendArgs;
use crate::backend::Backend;
use crate::progress::Progress;

#[derive(Subcommand)]
pub enum StreamFailuresCommand {
    /// Lists every entry: its condition, reason, positions and keys.
    #[command(after_help = crate::examples::OPS_STREAM_FAILURES_LIST)]
    List,
    /// Re-drives what each entry names and deletes the entries replayed.
    #[command(after_help = crate::examples::OPS_STREAM_FAILURES_REPLAY)]
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

/// The keys of the records a mapping's entry names by position, read back from the stream.
#[cfg(feature = "aws")]
async fn keys_at_positions(args: &BackendArgs, failure: &StreamFailure) -> anyhow::Result<Vec<Key>> {
    let b = &failure.batch;
    let (Some(arn), Some(shard), Some(start), Some(end)) =
        (&b.stream_arn, &b.shard_id, &b.start_sequence_number, &b.end_sequence_number)
    else {
        anyhow::bail!("no keys and no complete position");
    };
    if args.backend != crate::BackendKind::Aws {
        anyhow::bail!("positions are read from the DynamoDB stream: use --backend aws");
    }
    let aws = tidings_aws::AwsBackend::from_config(tidings_aws::AwsConfig::from_settings(crate::settings())?).await;
    let records = aws
        .stream_records_between(arn, shard, start, end)
        .await
        .map_err(|e| anyhow::anyhow!("the stream no longer has these records ({e}): the tick's sweep re-drives their notifications still accepted"))?;
    Ok(records.into_iter().filter(|r| relay::streamed(&r.key)).map(|r| r.key).collect())
}

#[cfg(not(feature = "aws"))]
async fn keys_at_positions(_args: &BackendArgs, _failure: &StreamFailure) -> anyhow::Result<Vec<Key>> {
    anyhow::bail!("positions are read from the DynamoDB stream: a build with `--features aws` and --backend aws")
}

/// Re-drives every item an entry names; `Ok((named, queued))` when all of them were handled.
async fn replay_one(deps: &Deps, args: &BackendArgs, failure: &StreamFailure) -> anyhow::Result<(usize, u64)> {
    let keys = match failure.key() {
        Some(key) => vec![key],
        None => keys_at_positions(args, failure).await?,
    };
    let mut queued = 0;
    for key in &keys {
        if relay::redrive(deps, key).await? == Redriven::Queued {
            queued += 1;
        }
    }
    Ok((keys.len(), queued))
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
            eprintln!("stream failures: listed {} entr{}", listed.len(), if listed.len() == 1 { "y" } else { "ies" });
            json!({ "stream_failures": listed })
        }
        StreamFailuresCommand::Replay => {
            let mut replayed = Vec::new();
            let mut kept = Vec::new();
            let mut left = Vec::new();
            let total = entries.len();
            let progress = Progress::bar("replay", u64::try_from(total).unwrap_or(u64::MAX), "entries");
            let (mut records, mut requeued) = (0usize, 0u64);
            for (i, e) in entries.into_iter().enumerate() {
                progress.set(i as u64, format!("{} replayed, {} kept", replayed.len(), kept.len()));
                let Ok(failure) = serde_json::from_str::<StreamFailure>(&e.body) else {
                    let mut v = view(&e, None);
                    v["kept"] = json!("not a stream failure record");
                    kept.push(v);
                    left.push(e);
                    continue;
                };
                match replay_one(deps, args, &failure).await {
                    Ok((named, queued)) => {
                        deps.queues.delete(STREAM_FAILURES_QUEUE, &e.receipt).await?;
                        let mut v = view(&e, Some(&failure));
                        v["replayed"] = json!(queued > 0);
                        v["records"] = json!(named);
                        v["queued"] = json!(queued);
                        replayed.push(v);
                        records += named;
                        requeued += queued;
                    }
                    Err(err) => {
                        let mut v = view(&e, Some(&failure));
                        v["kept"] = json!(err.to_string());
                        kept.push(v);
                        left.push(e);
                    }
                }
            }
            release(deps, &left).await;
            progress.set(total as u64, format!("{} replayed, {} kept", replayed.len(), kept.len()));
            progress.finish(format!(
                "replayed {} of {total} entries in {:.1} s ({records} records, {requeued} queued again), {} kept",
                replayed.len(),
                progress.elapsed_s(),
                kept.len()
            ));
            json!({ "replayed": replayed, "kept": kept })
        }
    };
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}
