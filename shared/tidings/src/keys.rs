//! `tidings keys`: make, list, rotate and revoke API keys straight against the store, as
//! `/v1/admin/keys` does through the API. Against a deployed stack (`--backend aws`, with
//! `TIDINGS_TABLE` set to the stack's `TableName` output) it uses the caller's AWS credentials:
//! the first operator key needs no running server and no key.
//!
//! Every command prints one JSON document on stdout; a new key's secret is printed once.

use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use clap::Subcommand;
use tidings_core::TenantId;
use tidings_core::ops::tenants::{self, KeySpec, Role};
use tidings_core::ports::SystemClock;

use crate::BackendArgs;
use crate::backend::Backend;

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum RoleArg {
    /// Its own tenant's data (`/v1`).
    Tenant,
    /// The system (`/v1/ops`, `/v1/admin`), no tenant's data.
    Operator,
}

#[derive(Subcommand)]
pub enum KeysCommand {
    /// Makes a key and prints it with its secret (shown this once).
    #[command(after_help = crate::examples::KEYS_CREATE)]
    Create {
        #[arg(long, value_enum)]
        role: RoleArg,
        /// The tenant of a tenant key.
        #[arg(long)]
        tenant: Option<String>,
        /// What the key is for.
        #[arg(long)]
        name: Option<String>,
        /// When it stops working (RFC 3339).
        #[arg(long)]
        expires_at: Option<DateTime<Utc>>,
    },
    /// Lists keys (never their secrets), revoked and expired ones with their status.
    #[command(after_help = crate::examples::KEYS_LIST)]
    List {
        /// Only this tenant's.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Makes a new key like the old one; the old one expires after the grace period.
    #[command(after_help = crate::examples::KEYS_ROTATE)]
    Rotate {
        key_id: String,
        /// Seconds the old key keeps working (0 to 30 days).
        #[arg(long, default_value_t = 86_400)]
        grace_seconds: i64,
    },
    /// Revokes a key: refused from the next request on.
    #[command(after_help = crate::examples::KEYS_REVOKE)]
    Revoke { key_id: String },
}

fn tenant(t: Option<&str>) -> anyhow::Result<Option<TenantId>> {
    t.map(|t| TenantId::parse(t).map_err(|e| anyhow::anyhow!("--tenant: {e}"))).transpose()
}

pub async fn run(command: KeysCommand, args: &BackendArgs) -> anyhow::Result<()> {
    let backend = Backend::open(args, Arc::new(SystemClock)).await?;
    let deps = &backend.deps;
    let started = std::time::Instant::now();
    let out = match command {
        KeysCommand::Create { role, tenant: t, name, expires_at } => {
            let role = match role {
                RoleArg::Tenant => Role::Tenant,
                RoleArg::Operator => Role::Operator,
            };
            let spec = KeySpec { role, tenant: tenant(t.as_deref())?, name, expires_at };
            serde_json::to_value(tenants::create(deps, spec).await?)?
        }
        KeysCommand::List { tenant: t } => {
            let t = tenant(t.as_deref())?;
            let mut all = Vec::new();
            let mut cursor = None;
            loop {
                let (mut page, next) = tenants::list(deps, t.as_ref(), 100, cursor).await?;
                all.append(&mut page);
                match next {
                    Some(c) => cursor = Some(c),
                    None => break,
                }
            }
            eprintln!("keys: listed {} key(s) in {:.1} s", all.len(), started.elapsed().as_secs_f64());
            serde_json::json!({ "keys": all })
        }
        KeysCommand::Rotate { key_id, grace_seconds } => {
            serde_json::to_value(tenants::rotate(deps, &key_id, Duration::seconds(grace_seconds)).await?)?
        }
        KeysCommand::Revoke { key_id } => serde_json::to_value(tenants::revoke(deps, &key_id).await?)?,
    };
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}
