//! API keys: who is calling, in which role, for which tenant.
//!
//! A key is a random secret shown once, when it is made. The table keeps only its SHA-256 hash:
//! the lookup item `KEY#{hash}` is what a request is authenticated against (a lookup by hash, so
//! no secret is ever compared byte by byte and there is no timing side channel), and the index
//! item `KEYS/{id}` is what operators list, rotate and revoke by. Both are written in one
//! transaction. The id is random, for the environment's keys too: it is shown (listings, logs,
//! the console), and an id derived from the secret would let whoever sees it test guesses of
//! the secret offline; the hash that finds the lookup item is never shown. Ids that earlier
//! versions derived from an environment key's secret are replaced at the next start
//! (docs/operators.md, "Keys").
//!
//! Roles: a *tenant* key acts on its own tenant's data (the `/v1` data routes); an *operator* key
//! acts on the system (`/v1/ops/*`, `/v1/admin/*`) and on no tenant's data. Revoking deletes the
//! lookup item. Each instance keeps what it read of a key for [`KEY_CACHE_FOR`] at most
//! ([`KeyCache`], by the key's hash, never the secret), and forgets every key it holds when a key
//! is made, registered, rotated or revoked through it: a revocation is refused from the next
//! request on the instance that made it (the whole embedded backend is one), and within
//! [`KEY_CACHE_FOR`] on every other. An expiry is checked on every request, cached or not;
//! rotation gives the old key an expiry (the grace period) and makes a new one with the same
//! role and tenant.
//!
//! Items written before roles existed hold only `tenant` and `created_at`: they are tenant keys
//! without an id, valid until an operator replaces them.

use chrono::{DateTime, Duration, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::ids::TenantId;
use crate::keys;
use crate::ports::{Cond, Item, QueryOpts, Update, Write, attrs_of};

/// What a key may do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Its own tenant's data.
    #[default]
    Tenant,
    /// The system: queues, dead letters, figures, keys. No tenant's data.
    Operator,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Tenant => "tenant",
            Role::Operator => "operator",
        }
    }
}

use super::key_cache::CachedKey;
pub use super::key_cache::{KEY_CACHE_FOR, KeyCache, Principal};

impl Principal {
    pub fn role(&self) -> Role {
        match self {
            Principal::Tenant { .. } => Role::Tenant,
            Principal::Operator { .. } => Role::Operator,
        }
    }
}

/// Where a key came from: the operator API and CLI, or a local run's environment
/// (`TIDINGS_API_KEYS`, `TIDINGS_OPERATOR_KEYS`), whose keys are revoked when they leave it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum KeySource {
    #[default]
    Api,
    Env,
}

/// The lookup item: what authenticating a request reads.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct LookupRecord {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    id: Option<String>,
    #[serde(default)]
    role: Role,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tenant: Option<String>,
    created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    expires_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    last_used_at: Option<String>,
}

/// A key as operators see it (never its secret nor its hash).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct KeyInfo {
    pub id: String,
    pub role: Role,
    /// The tenant of a tenant key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<String>,
    /// When a request last came with it (updated at most once a minute).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_used_at: Option<String>,
    #[serde(default)]
    pub source: KeySource,
    /// `active`, `expired` or `revoked`, as of the listing.
    #[serde(default)]
    pub status: String,
}

/// The index item: [`KeyInfo`] with the hash that finds the lookup item.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct IndexRecord {
    #[serde(flatten)]
    info: KeyInfo,
    hash: String,
}

/// A key just made: its secret is here and nowhere else.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct NewKey {
    /// The secret, for `Authorization: Bearer`. Shown once.
    pub key: String,
    #[serde(flatten)]
    pub info: KeyInfo,
}

/// What a new key is for.
#[derive(Clone, Debug, Default)]
pub struct KeySpec {
    pub role: Role,
    pub tenant: Option<TenantId>,
    pub name: Option<String>,
    pub expires_at: Option<DateTime<Utc>>,
}

/// The longest a rotated key stays valid beside its successor.
pub const MAX_GRACE: Duration = Duration::days(30);

/// How stale `last_used_at` may get before a request refreshes it: one write per key per
/// minute at most, whatever the request rate.
const LAST_USED_EVERY: Duration = Duration::seconds(60);

pub fn hash_key(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// A new random API key (256 bits, URL-safe).
pub fn generate_key() -> String {
    use base64::Engine;
    let bytes: [u8; 32] = rand::random();
    format!("tk_{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

fn new_key_id() -> String {
    format!("key_{}", hex::encode(rand::random::<[u8; 8]>()))
}

fn stamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

fn parse_stamp(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(s).ok().map(|t| t.with_timezone(&Utc))
}

fn status_of(info: &KeyInfo, now: DateTime<Utc>) -> &'static str {
    if info.revoked_at.is_some() {
        "revoked"
    } else if info.expires_at.as_deref().and_then(parse_stamp).is_some_and(|e| e <= now) {
        "expired"
    } else {
        "active"
    }
}

/// The TTL attribute of a lookup item with an expiry: the table removes it a day after, the
/// check on every request refuses it from the expiry itself.
fn ttl_of(expires_at: Option<DateTime<Utc>>) -> Option<i64> {
    expires_at.map(|e| (e + Duration::days(1)).timestamp())
}

fn check_spec(spec: &KeySpec, now: DateTime<Utc>) -> CoreResult<()> {
    match (spec.role, &spec.tenant) {
        (Role::Tenant, None) => return Err(CoreError::invalid("tenant", "a tenant key names its tenant")),
        (Role::Operator, Some(_)) => {
            return Err(CoreError::invalid("tenant", "an operator key belongs to no tenant"));
        }
        _ => {}
    }
    if let Some(name) = &spec.name
        && (name.is_empty() || name.chars().count() > 100 || name.chars().any(char::is_control))
    {
        return Err(CoreError::invalid("name", "1 to 100 printable characters"));
    }
    if spec.expires_at.is_some_and(|e| e <= now) {
        return Err(CoreError::invalid("expires_at", "must be in the future"));
    }
    Ok(())
}

/// The writes that store a key under `secret`.
fn writes_for(
    secret: &str,
    id: String,
    spec: &KeySpec,
    source: KeySource,
    now: DateTime<Utc>,
) -> (KeyInfo, Vec<Write>) {
    let hash = hash_key(secret);
    let info = KeyInfo {
        id: id.clone(),
        role: spec.role,
        tenant: spec.tenant.as_ref().map(|t| t.as_str().to_owned()),
        name: spec.name.clone(),
        created_at: stamp(now),
        expires_at: spec.expires_at.map(stamp),
        revoked_at: None,
        last_used_at: None,
        source,
        status: "active".into(),
    };
    let lookup = LookupRecord {
        id: Some(id.clone()),
        role: spec.role,
        tenant: info.tenant.clone(),
        created_at: info.created_at.clone(),
        expires_at: info.expires_at.clone(),
        last_used_at: None,
    };
    (
        info.clone(),
        vec![
            Write::Put { item: lookup_item(&hash, &lookup, spec.expires_at), cond: Cond::Always },
            Write::Put { item: index_item(&id, &IndexRecord { info, hash: hash.clone() }), cond: Cond::Always },
        ],
    )
}

fn lookup_item(hash: &str, record: &LookupRecord, expires_at: Option<DateTime<Utc>>) -> Item {
    let mut attrs = attrs_of(record).unwrap_or_default();
    if let Some(ttl) = ttl_of(expires_at) {
        attrs.insert("ttl".into(), ttl.into());
    }
    Item::new(keys::api_key(hash), attrs)
}

fn index_item(id: &str, record: &IndexRecord) -> Item {
    let mut attrs = attrs_of(record).unwrap_or_default();
    attrs.remove("status");
    Item::new(keys::api_key_index(id), attrs)
}

/// Makes a key. The secret is in the answer only.
pub async fn create(deps: &Deps, spec: KeySpec) -> CoreResult<NewKey> {
    let now = deps.clock.now();
    check_spec(&spec, now)?;
    let key = generate_key();
    let (info, mut writes) = writes_for(&key, new_key_id(), &spec, KeySource::Api, now);
    // A fresh secret and a fresh id: neither may replace anything.
    for w in &mut writes {
        if let Write::Put { cond, .. } = w {
            *cond = Cond::NotExists;
        }
    }
    deps.table.transact(writes).await?;
    deps.keys.forget_all();
    Ok(NewKey { key, info })
}

/// Stores a key whose secret the caller chose (a local run's environment). Registering the same
/// key again at every start changes nothing but its role or tenant: it keeps the id it was
/// given, found through its lookup item.
pub async fn register_key(deps: &Deps, tenant: &TenantId, key: &str) -> CoreResult<()> {
    register(deps, key, KeySpec { role: Role::Tenant, tenant: Some(tenant.clone()), ..Default::default() }).await
}

/// A new id for a key from the environment: random like every key id, never a function of the
/// secret (docs/operators.md, "Keys"): an id is shown in listings, logs and the console, and one
/// derived from the secret would let whoever sees it test guesses of the secret offline.
fn new_env_key_id() -> String {
    format!("env_{}", hex::encode(rand::random::<[u8; 8]>()))
}

/// Whether `id` is what earlier versions made of a key from the environment: the first 64 bits
/// of its unsalted SHA-256 (`hash`). Such ids are replaced by random ones at the next start.
fn is_derived_id(id: &str, hash: &str) -> bool {
    hash.get(..16).is_some_and(|h| id.strip_prefix("env_") == Some(h))
}

/// [`register_key`] for any role.
pub async fn register(deps: &Deps, key: &str, spec: KeySpec) -> CoreResult<()> {
    let now = deps.clock.now();
    check_spec(&spec, now)?;
    if key.trim().is_empty() || key.len() > 256 {
        return Err(CoreError::invalid("key", "1 to 256 characters"));
    }
    let hash = hash_key(key);
    let stored = match deps.table.get(&keys::api_key(&hash)).await? {
        Some(item) => item.parse::<LookupRecord>().ok().and_then(|r| r.id),
        None => None,
    };
    let (id, derived) = match stored {
        Some(id) if !is_derived_id(&id, &hash) => (id, None),
        // Stored by an earlier version under an id derived from the secret: a new id, and the
        // old index item goes (the key itself, its lookup item, keeps working throughout).
        Some(derived) => (new_env_key_id(), Some(derived)),
        None => (new_env_key_id(), None),
    };
    let (_, mut writes) = writes_for(key, id, &spec, KeySource::Env, now);
    if let Some(old) = derived {
        writes.push(Write::Delete { key: keys::api_key_index(&old), cond: Cond::Always });
    }
    let written = deps.table.transact(writes).await;
    deps.keys.forget_all();
    written?;
    Ok(())
}

/// Revokes every key a local run's environment registered earlier and no longer lists, so a key
/// taken out of `TIDINGS_API_KEYS` stops working at the next start. Returns how many. A revoked
/// key still listed under an id derived from its secret (earlier versions) gets a random one.
pub async fn revoke_env_keys_except(deps: &Deps, keep: &[&str]) -> CoreResult<usize> {
    let keep: Vec<String> = keep.iter().map(|k| hash_key(k)).collect();
    let mut revoked = 0;
    for record in list_all_records(deps).await? {
        if record.info.source != KeySource::Env {
            continue;
        }
        if record.info.revoked_at.is_none() && !keep.contains(&record.hash) {
            revoke(deps, &record.info.id).await?;
            revoked += 1;
        } else if record.info.revoked_at.is_some() && is_derived_id(&record.info.id, &record.hash) {
            let old = record.info.id.clone();
            let mut info = record.info;
            info.id = new_env_key_id();
            let renamed = IndexRecord { info, hash: record.hash };
            deps.table
                .transact(vec![
                    Write::Put { item: index_item(&renamed.info.id, &renamed), cond: Cond::NotExists },
                    Write::Delete { key: keys::api_key_index(&old), cond: Cond::Exists },
                ])
                .await?;
        }
    }
    Ok(revoked)
}

/// Who holds this key, if anyone: `None` for an unknown, revoked or expired key.
pub async fn authenticate(deps: &Deps, key: &str) -> CoreResult<Option<Principal>> {
    if key.is_empty() || key.len() > 256 {
        return Ok(None);
    }
    let hash: [u8; 32] = Sha256::digest(key.as_bytes()).into();
    let now = deps.clock.now();
    if let Some(cached) = deps.keys.lookup(&hash, now) {
        return Ok(cached.expires_at.is_none_or(|e| e > now).then_some(cached.principal));
    }
    let lookup_key = keys::api_key(&hex::encode(hash));
    let Some(item) = deps.table.get(&lookup_key).await? else {
        return Ok(None);
    };
    let record: LookupRecord = item.parse()?;
    let expires_at = match record.expires_at.as_deref() {
        Some(e) => match parse_stamp(e) {
            Some(e) => Some(e),
            None => return Ok(None),
        },
        None => None,
    };
    if expires_at.is_some_and(|e| e <= now) {
        return Ok(None);
    }
    if record.id.is_some()
        && record.last_used_at.as_deref().and_then(parse_stamp).is_none_or(|t| now - t >= LAST_USED_EVERY)
    {
        // Best effort: a failed refresh must not refuse a valid request.
        let _ = deps.table.update(&lookup_key, vec![Update::set("last_used_at", stamp(now))], Cond::Exists).await;
    }
    let principal = match record.role {
        Role::Operator => record.id.map(|key_id| Principal::Operator { key_id }),
        Role::Tenant => record
            .tenant
            .as_deref()
            .and_then(|t| TenantId::parse(t).ok())
            .map(|tenant| Principal::Tenant { tenant, key_id: record.id }),
    };
    if let Some(p) = &principal {
        deps.keys.keep(hash, CachedKey { principal: p.clone(), expires_at, read_at: now });
    }
    Ok(principal)
}

async fn index_record(deps: &Deps, id: &str) -> CoreResult<IndexRecord> {
    if id.is_empty() || id.len() > 64 {
        return Err(CoreError::NotFound { what: "key" });
    }
    let item = deps.table.get(&keys::api_key_index(id)).await?.ok_or(CoreError::NotFound { what: "key" })?;
    Ok(item.parse()?)
}

/// One key as operators see it.
pub async fn get(deps: &Deps, id: &str) -> CoreResult<KeyInfo> {
    let record = index_record(deps, id).await?;
    let mut info = with_last_used(deps, vec![record]).await?;
    info.pop().ok_or(CoreError::NotFound { what: "key" })
}

async fn with_last_used(deps: &Deps, records: Vec<IndexRecord>) -> CoreResult<Vec<KeyInfo>> {
    let lookups: Vec<_> = records.iter().map(|r| keys::api_key(&r.hash)).collect();
    let found = deps.table.get_many(&lookups).await?;
    let now = deps.clock.now();
    Ok(records
        .into_iter()
        .zip(found)
        .map(|(r, lookup)| {
            let mut info = r.info;
            if let Some(l) = lookup.and_then(|l| l.parse::<LookupRecord>().ok()) {
                info.last_used_at = l.last_used_at;
            }
            info.status = status_of(&info, now).into();
            info
        })
        .collect())
}

/// A page of keys, oldest id first; with `tenant`, that tenant's only.
pub async fn list(
    deps: &Deps,
    tenant: Option<&TenantId>,
    limit: usize,
    cursor: Option<String>,
) -> CoreResult<(Vec<KeyInfo>, Option<String>)> {
    let page = deps
        .table
        .query(keys::API_KEY_INDEX_PK, "", QueryOpts { limit, cursor, descending: false })
        .await
        .map_err(CoreError::of_page_query)?;
    let records: Vec<IndexRecord> = page
        .items
        .iter()
        .filter_map(|i| i.parse::<IndexRecord>().ok())
        .filter(|r| tenant.is_none_or(|t| r.info.tenant.as_deref() == Some(t.as_str())))
        .collect();
    Ok((with_last_used(deps, records).await?, page.next_cursor))
}

/// Every index record, with the hash that finds its lookup item (never shown).
async fn list_all_records(deps: &Deps) -> CoreResult<Vec<IndexRecord>> {
    let mut all = Vec::new();
    let mut cursor = None;
    loop {
        let page = deps
            .table
            .query(keys::API_KEY_INDEX_PK, "", QueryOpts { limit: 100, cursor, descending: false })
            .await
            .map_err(CoreError::of_page_query)?;
        all.extend(page.items.iter().filter_map(|i| i.parse::<IndexRecord>().ok()));
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => return Ok(all),
        }
    }
}

/// Revokes a key: refused from the next request on, on every instance. Revoking a revoked key
/// changes nothing.
pub async fn revoke(deps: &Deps, id: &str) -> CoreResult<KeyInfo> {
    let record = index_record(deps, id).await?;
    if record.info.revoked_at.is_some() {
        return get(deps, id).await;
    }
    let now = stamp(deps.clock.now());
    let revoked = deps
        .table
        .transact(vec![
            Write::Delete { key: keys::api_key(&record.hash), cond: Cond::Always },
            Write::Update {
                key: keys::api_key_index(id),
                updates: vec![Update::set("revoked_at", now)],
                cond: Cond::AttrNotExists("revoked_at".into()),
            },
        ])
        .await;
    // Forgotten whatever the outcome: a transaction that failed may still have been applied.
    deps.keys.forget_all();
    revoked.map_err(|e| {
        if e.is_condition_failed() {
            CoreError::conflict("key_changed", "the key changed meanwhile: try again")
        } else {
            e.into()
        }
    })?;
    get(deps, id).await
}

/// What a rotation made: the new key, and the old key with its new expiry.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct Rotated {
    pub new: NewKey,
    pub previous: KeyInfo,
}

/// Makes a new key with the old one's role, tenant and name, and lets the old one expire after
/// `grace` (at once with zero; never later than it would have anyway).
pub async fn rotate(deps: &Deps, id: &str, grace: Duration) -> CoreResult<Rotated> {
    if grace < Duration::zero() || grace > MAX_GRACE {
        return Err(CoreError::invalid("grace_seconds", "0 to 30 days"));
    }
    let old = index_record(deps, id).await?;
    let now = deps.clock.now();
    if status_of(&old.info, now) != "active" {
        return Err(CoreError::conflict("key_not_active", format!("key {id} is {}", status_of(&old.info, now))));
    }
    let tenant = old
        .info
        .tenant
        .as_deref()
        .map(TenantId::parse)
        .transpose()
        .map_err(|_| CoreError::invalid("tenant", "stored tenant is invalid"))?;
    let spec = KeySpec { role: old.info.role, tenant, name: old.info.name.clone(), expires_at: None };
    let key = generate_key();
    let (info, mut writes) = writes_for(&key, new_key_id(), &spec, KeySource::Api, now);
    for w in &mut writes {
        if let Write::Put { cond, .. } = w {
            *cond = Cond::NotExists;
        }
    }
    let mut ends = now + grace;
    if let Some(e) = old.info.expires_at.as_deref().and_then(parse_stamp) {
        ends = ends.min(e);
    }
    let mut lookup_updates = vec![Update::set("expires_at", stamp(ends))];
    if let Some(ttl) = ttl_of(Some(ends)) {
        lookup_updates.push(Update::set("ttl", ttl));
    }
    writes.push(Write::Update { key: keys::api_key(&old.hash), updates: lookup_updates, cond: Cond::Exists });
    writes.push(Write::Update {
        key: keys::api_key_index(id),
        updates: vec![Update::set("expires_at", stamp(ends))],
        cond: Cond::AttrNotExists("revoked_at".into()),
    });
    let rotated = deps.table.transact(writes).await;
    deps.keys.forget_all();
    rotated.map_err(|e| {
        if e.is_condition_failed() {
            CoreError::conflict("key_changed", "the key changed meanwhile: try again")
        } else {
            e.into()
        }
    })?;
    Ok(Rotated { new: NewKey { key, info }, previous: get(deps, id).await? })
}
