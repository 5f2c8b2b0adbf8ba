//! `tidings ops findings list|settle`: the reconciliation findings, as
//! `GET /v1/ops/inventory-findings` and `POST /v1/ops/inventory-findings/{id}/settle` show and
//! settle them (docs/inventory.md, "Findings").
//!
//! Every command prints one JSON document on stdout and its one-line summary on stderr.

use std::sync::Arc;

use clap::Subcommand;
use serde_json::json;
use tidings_core::inventory::findings::{self, FindingStatus, SettleRequest};
use tidings_core::ports::SystemClock;

use crate::BackendArgs;
use crate::backend::Backend;

#[derive(Subcommand)]
pub enum FindingsCommand {
    /// Every tenant's findings in one status, oldest first.
    #[command(after_help = crate::examples::OPS_FINDINGS_LIST)]
    List {
        /// `open` (what waits for a person) or `settled`.
        #[arg(long, default_value = "open", value_parser = ["open", "settled"])]
        status: String,
        /// Findings shown (1 to 500).
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u16).range(1..=500))]
        limit: u16,
    },
    /// Settles an open finding: a corrective ledger entry (the counters do not move), or the
    /// difference accepted.
    #[command(after_help = crate::examples::OPS_FINDINGS_SETTLE)]
    Settle {
        /// The finding's id, as `list` shows it.
        id: String,
        /// `corrective_entry` or `accepted`.
        #[arg(long, value_parser = ["corrective_entry", "accepted"])]
        kind: String,
        /// Why (required).
        #[arg(long)]
        reason: String,
        /// Who settles it, recorded with the settlement.
        #[arg(long, env = "USER", default_value = "cli")]
        by: String,
    },
}

pub async fn run(command: FindingsCommand, args: &BackendArgs) -> anyhow::Result<()> {
    let b = Backend::open(args, Arc::new(SystemClock)).await?;
    let out = match command {
        FindingsCommand::List { status, limit } => {
            let status = FindingStatus::parse(&status)?;
            let page = findings::list(&b.deps, status, usize::from(limit), None).await?;
            eprintln!(
                "findings: {} shown{}",
                page.items.len(),
                if page.next_cursor.is_some() { format!("; more than {limit}") } else { String::new() }
            );
            serde_json::to_value(page)?
        }
        FindingsCommand::Settle { id, kind, reason, by } => {
            let settled = findings::settle(&b.deps, &id, &SettleRequest { kind, reason }, &format!("cli:{by}")).await?;
            eprintln!(
                "findings: {id} settled ({} {})",
                settled.sku_id,
                json!(settled.settlement.as_ref().map(|s| s.kind))
            );
            serde_json::to_value(settled)?
        }
    };
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}
