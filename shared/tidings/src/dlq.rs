//! `tidings ops dlq list|redrive`: the dead-letter queues, as `GET /v1/ops/queues`,
//! `GET /v1/ops/dlq/{queue}` and `POST /v1/ops/dlq/{queue}/redrive` show them.
//!
//! Every command prints one JSON document on stdout and its one-line summary on stderr.

use std::sync::Arc;

use clap::Subcommand;
use serde_json::json;
use tidings_core::ops::dead_letters;
use tidings_core::ports::SystemClock;

use crate::BackendArgs;
use crate::backend::Backend;

#[derive(Subcommand)]
pub enum DlqCommand {
    /// Depth of every queue and its DLQ, and the first dead letters of each with why each died
    /// (never a message's text).
    #[command(after_help = crate::examples::OPS_DLQ_LIST)]
    List {
        /// Dead letters shown per queue (1 to 500).
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u16).range(1..=500))]
        limit: u16,
    },
    /// Moves a queue's dead letters back to it; each is then handled once.
    #[command(after_help = crate::examples::OPS_DLQ_REDRIVE)]
    Redrive {
        /// The queue (as `list` names it), not its DLQ.
        queue: String,
    },
}

pub async fn run(command: DlqCommand, args: &BackendArgs) -> anyhow::Result<()> {
    let b = Backend::open(args, Arc::new(SystemClock)).await?;
    let out = match command {
        DlqCommand::List { limit } => {
            let mut queues = Vec::new();
            let (mut dead, mut holding) = (0u64, 0usize);
            for name in &b.queue_names {
                let stats = b.deps.queues.stats(name).await?;
                let mut letters = Vec::new();
                if stats.dlq_depth > 0 {
                    dead += stats.dlq_depth;
                    holding += 1;
                    for m in b.deps.queues.peek_dlq(name, usize::from(limit)).await? {
                        letters.push(dead_letters::explain(&b.deps, &m).await);
                    }
                }
                let mut queue = serde_json::to_value(&stats)?;
                queue["dead_letters"] = serde_json::to_value(letters)?;
                queues.push(queue);
            }
            eprintln!(
                "dlq: {} queues, {dead} dead letter(s) in {holding} DLQ(s){}",
                queues.len(),
                if dead > 0 { format!("; up to {limit} of each shown") } else { String::new() }
            );
            json!({ "queues": queues })
        }
        DlqCommand::Redrive { queue } => {
            if !b.queue_names.contains(&queue) {
                anyhow::bail!("unknown queue {queue}; known: {}", b.queue_names.join(", "));
            }
            let moved = b.deps.queues.redrive(&queue).await?;
            eprintln!("dlq: moved {moved} message(s) from {queue}-dlq back to {queue}");
            json!({ "queue": queue, "moved": moved })
        }
    };
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}
