//! What an instance read of the API keys that came with its requests ([`super::tenants`]
//! authenticates; docs/operators.md, "Keys"). Apart from `tenants` so that [`crate::deps::Deps`]
//! can hold one without importing the use-cases.

use chrono::{DateTime, Duration, Utc};

use crate::ids::TenantId;

/// Who a request comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Principal {
    Tenant { tenant: TenantId, key_id: Option<String> },
    Operator { key_id: String },
}

/// How long an instance trusts what it read of a key: a revocation made elsewhere is refused
/// here this long after it at most (docs/operators.md, "Keys").
pub const KEY_CACHE_FOR: Duration = Duration::seconds(1);
/// The most keys one instance holds; when full, it forgets them all (they are read again).
const KEY_CACHE_SIZE: usize = 1024;

/// What an instance read of the keys that came with its requests, by SHA-256 of the key: the
/// principal and the expiry (checked at every use), for [`KEY_CACHE_FOR`] by the deps' clock.
/// Authenticating read the lookup item and parsed it on every request before.
#[derive(Default)]
pub struct KeyCache {
    held: std::sync::Mutex<std::collections::HashMap<[u8; 32], CachedKey>>,
}

#[derive(Clone)]
pub(crate) struct CachedKey {
    pub(crate) principal: Principal,
    pub(crate) expires_at: Option<DateTime<Utc>>,
    pub(crate) read_at: DateTime<Utc>,
}

impl KeyCache {
    pub(crate) fn lookup(&self, hash: &[u8; 32], now: DateTime<Utc>) -> Option<CachedKey> {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.get(hash).filter(|c| c.read_at <= now && now - c.read_at < KEY_CACHE_FOR).cloned()
    }

    pub(crate) fn keep(&self, hash: [u8; 32], key: CachedKey) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if held.len() >= KEY_CACHE_SIZE && !held.contains_key(&hash) {
            held.clear();
        }
        held.insert(hash, key);
    }

    /// Forgets every key (a key changed through this instance).
    pub fn forget_all(&self) {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}
