//! Tenants and their API keys. Keys are stored only as SHA-256 hashes; a lookup by hash means
//! no secret is ever compared byte by byte, so there is no timing side channel to measure.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::deps::Deps;
use crate::error::CoreResult;
use crate::ids::TenantId;
use crate::keys;
use crate::ports::{Cond, Item, attrs_of};

#[derive(Clone, Debug, Serialize, Deserialize)]
struct ApiKeyRecord {
    tenant: String,
    created_at: String,
}

pub fn hash_key(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// A new random API key (256 bits, URL-safe).
pub fn generate_key() -> String {
    use base64::Engine;
    let bytes: [u8; 32] = rand::random();
    format!("tk_{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

/// Stores (or re-points) an API key for a tenant.
pub async fn register_key(deps: &Deps, tenant: &TenantId, key: &str) -> CoreResult<()> {
    let record = ApiKeyRecord {
        tenant: tenant.as_str().to_owned(),
        created_at: deps.clock.now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    };
    deps.table.put(Item::new(keys::api_key(&hash_key(key)), attrs_of(&record)?), Cond::Always).await?;
    Ok(())
}

/// The tenant owning this key, if any.
pub async fn authenticate(deps: &Deps, key: &str) -> CoreResult<Option<TenantId>> {
    if key.is_empty() || key.len() > 256 {
        return Ok(None);
    }
    let Some(item) = deps.table.get(&keys::api_key(&hash_key(key))).await? else {
        return Ok(None);
    };
    let record: ApiKeyRecord = item.parse()?;
    Ok(TenantId::parse(&record.tenant).ok())
}
