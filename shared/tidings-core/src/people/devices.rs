//! Push devices (docs/people.md, "Devices"): a user has any number of tokens; push goes to every
//! one; a token the platform answers as gone (APNs 410, FCM `UNREGISTERED`, SNS `EndpointDisabled`)
//! is deleted at once, so it is not sent to again.
//!
//! Each device is two items written together: the device under its user (listed when sending)
//! and an index by token (`DELETE /v1/devices/{token}` names only the token, and a token that
//! moves to another user must leave the first).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tracing::{info, warn};

use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::ids::{TenantId, check_id};
use crate::keys;
use crate::ports::{
    Channel, Cond, Item, OutboundMessage, PermanentCode, Platform, Provider, ProviderError, ProviderReceipt, QueryOpts,
    StoreError, Write, attrs_of,
};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Device {
    pub user_id: String,
    pub platform: Platform,
    pub token: String,
    /// Where the push provider sends: the SNS endpoint ARN on AWS, the token elsewhere.
    #[serde(default)]
    pub address: String,
    pub created_at: String,
}

/// The body of `POST /v1/devices`.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DeviceInput {
    pub user_id: String,
    pub platform: Platform,
    pub token: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct TokenIndex {
    user_id: String,
}

/// The device a push address belongs to (see [`keys::push_endpoint`]).
#[derive(Clone, Debug, Serialize, Deserialize)]
struct EndpointIndex {
    tenant: String,
    user_id: String,
    token_hash: String,
}

/// The SHA-256 of a token, in hex: a device's key under its user (`keys::device`).
pub fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// The endpoint index of a push address.
fn endpoint_key(address: &str) -> crate::ports::Key {
    keys::push_endpoint(&token_hash(address))
}

/// This (tenant, user)'s registration of a push address.
fn holder_key(address: &str, t: &TenantId, user_id: &str) -> crate::ports::Key {
    keys::push_endpoint_holder(&token_hash(address), t, user_id)
}

/// Every registration of a push address, in every tenant (a phone with two shops' apps on one
/// push project is one token, one endpoint, two registrations).
async fn holders(deps: &Deps, address: &str) -> CoreResult<Vec<EndpointIndex>> {
    let pk = keys::push_endpoint_pk(&token_hash(address));
    let mut out = Vec::new();
    let mut cursor = None;
    loop {
        let page = deps
            .table
            .query(&pk, keys::PUSH_HOLDER_SK_PREFIX, QueryOpts { limit: 100, cursor, descending: false })
            .await?;
        for item in &page.items {
            out.push(item.parse()?);
        }
        cursor = page.next_cursor;
        if cursor.is_none() {
            return Ok(out);
        }
    }
}

/// The longest collapse id a push carries: APNs refuses an `apns-collapse-id` over 64 bytes, and
/// FCM's collapse key and tag are given the same bound.
pub const MAX_COLLAPSE_ID: usize = 64;

/// The APNs collapse id and the FCM collapse key / tag of a push: its delivery key when that fits
/// [`MAX_COLLAPSE_ID`], else the key's SHA-256 in hex (64 characters). Either way it is the same
/// on every retry of one delivery, so a duplicate replaces the first on the device, and differs
/// between deliveries. A delivery key holds the user id, so the digest is what most shops get
/// (a UUID alone is 36 characters).
pub fn collapse_id(delivery_key: &str) -> String {
    if delivery_key.len() <= MAX_COLLAPSE_ID {
        delivery_key.to_owned()
    } else {
        hex::encode(Sha256::digest(delivery_key.as_bytes()))
    }
}

pub fn check_token(token: &str) -> CoreResult<()> {
    if token.is_empty() || token.len() > 4096 || token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(CoreError::invalid("token", "must be 1 to 4096 characters without spaces"));
    }
    Ok(())
}

/// Registers a token; `true` when it is new for this user (201), `false` when it was
/// registered already (200). A token registered to another user moves to this one.
pub async fn register(deps: &Deps, t: &TenantId, input: DeviceInput) -> CoreResult<(Device, bool)> {
    check_id("user_id", &input.user_id)?;
    check_token(&input.token)?;
    let hash = token_hash(&input.token);
    let index_key = keys::device_token(t, &hash);
    let previous: Option<TokenIndex> = deps.table.get(&index_key).await?.map(|i| i.parse()).transpose()?;
    if let Some(prev) = &previous
        && prev.user_id == input.user_id
        && let Some(item) = deps.table.get(&keys::device(t, &input.user_id, &hash)).await?
    {
        return Ok((item.parse()?, false));
    }
    let address = match deps.providers.push.register_device(input.platform, &input.token).await {
        Ok(a) => a,
        Err(ProviderError::Permanent { reason, .. }) => {
            return Err(CoreError::invalid("token", format!("the push service refused it: {reason}")));
        }
        Err(e @ ProviderError::Transient { .. }) => {
            return Err(CoreError::Store(StoreError::Unavailable(e.to_string())));
        }
    };
    let device = Device {
        user_id: input.user_id.clone(),
        platform: input.platform,
        token: input.token.clone(),
        address,
        created_at: deps.clock.now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
    };
    let endpoint = attrs_of(&EndpointIndex {
        tenant: t.as_str().to_owned(),
        user_id: input.user_id.clone(),
        token_hash: hash.clone(),
    })?;
    let mut writes = vec![
        Write::Put {
            item: Item::new(index_key, attrs_of(&TokenIndex { user_id: input.user_id.clone() })?),
            cond: Cond::Always,
        },
        Write::Put { item: Item::new(keys::device(t, &input.user_id, &hash), attrs_of(&device)?), cond: Cond::Always },
        Write::Put { item: Item::new(endpoint_key(&device.address), endpoint.clone()), cond: Cond::Always },
        Write::Put { item: Item::new(holder_key(&device.address, t, &input.user_id), endpoint), cond: Cond::Always },
    ];
    if let Some(prev) = previous
        && prev.user_id != input.user_id
    {
        writes.push(Write::Delete { key: keys::device(t, &prev.user_id, &hash), cond: Cond::Always });
        writes.push(Write::Delete { key: holder_key(&device.address, t, &prev.user_id), cond: Cond::Always });
    }
    deps.table.transact(writes).await?;
    info!(tenant = %t, platform = input.platform.as_str(), "device registered");
    Ok((device, true))
}

/// Unregisters a token (idempotent).
pub async fn unregister(deps: &Deps, t: &TenantId, token: &str) -> CoreResult<()> {
    check_token(token)?;
    let hash = token_hash(token);
    let index_key = keys::device_token(t, &hash);
    let Some(index) = deps.table.get(&index_key).await? else { return Ok(()) };
    let index: TokenIndex = index.parse()?;
    let device_key = keys::device(t, &index.user_id, &hash);
    let device = deps.table.get(&device_key).await?.and_then(|item| item.parse::<Device>().ok());
    if let Some(d) = &device
        && endpoint_is_ours(deps, t, d).await?
        && let Err(e) = deps.providers.push.unregister_device(&d.address).await
    {
        warn!(error = %e, "push endpoint not deleted; it is forgotten here anyway");
    }
    let mut writes = vec![
        Write::Delete { key: index_key, cond: Cond::Always },
        Write::Delete { key: device_key, cond: Cond::Always },
    ];
    if let Some(d) = &device {
        writes.push(Write::Delete { key: holder_key(&d.address, t, &index.user_id), cond: Cond::Always });
    }
    deps.table.transact(writes).await?;
    if let Some(d) = &device {
        forget_endpoint(deps, t, d).await?;
    }
    Ok(())
}

/// Whether the push service's endpoint for `device` is this device's to delete: the push
/// service gives one token one endpoint, and while another tenant (or user) holds a
/// registration of it, it keeps using it, whichever registered first. Registrations from before
/// holders were recorded are known only by the endpoint index, which names the latest.
async fn endpoint_is_ours(deps: &Deps, t: &TenantId, device: &Device) -> CoreResult<bool> {
    let is_this = |h: &EndpointIndex| h.tenant == t.as_str() && h.user_id == device.user_id;
    if holders(deps, &device.address).await?.iter().any(|h| !is_this(h)) {
        return Ok(false);
    }
    let Some(item) = deps.table.get(&endpoint_key(&device.address)).await? else {
        return Ok(true);
    };
    let index: EndpointIndex = item.parse()?;
    Ok(is_this(&index))
}

/// Deletes a device's endpoint index, unless the address now belongs to someone else; when
/// another registration of the address remains, the index names it, so the push service's
/// events about the endpoint still find a device.
async fn forget_endpoint(deps: &Deps, t: &TenantId, device: &Device) -> CoreResult<()> {
    let cond = Cond::And(vec![Cond::eq("tenant", t.as_str()), Cond::eq("user_id", device.user_id.clone())]);
    match deps.table.transact(vec![Write::Delete { key: endpoint_key(&device.address), cond }]).await {
        Ok(()) | Err(StoreError::ConditionFailed { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    let Some(other) = holders(deps, &device.address).await?.into_iter().next() else { return Ok(()) };
    let item = Item::new(endpoint_key(&device.address), attrs_of(&other)?);
    // Never over a registration written meanwhile: that one names itself.
    match deps.table.transact(vec![Write::Put { item, cond: Cond::AttrNotExists("tenant".into()) }]).await {
        Ok(()) | Err(StoreError::ConditionFailed { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The device a push address (an SNS endpoint ARN) belongs to, with its tenant; `None` for an
/// address no device of any tenant has (a device deleted since, or registered before the
/// index existed).
pub async fn by_address(deps: &Deps, address: &str) -> CoreResult<Option<(TenantId, Device)>> {
    let Some(item) = deps.table.get(&endpoint_key(address)).await? else {
        return Ok(None);
    };
    let index: EndpointIndex = item.parse()?;
    let t = TenantId::parse(&index.tenant)?;
    let Some(item) = deps.table.get(&keys::device(&t, &index.user_id, &index.token_hash)).await? else {
        return Ok(None);
    };
    let device: Device = item.parse()?;
    Ok((device.address == address).then_some((t, device)))
}

/// Devices read per query of [`list`].
pub const QUERY_LIMIT: usize = 100;

/// The first query [`list`] makes for a user (its partition and prefix), to ask ahead with
/// [`crate::ports::Table::query_many`].
pub fn query_of(t: &TenantId, user_id: &str) -> (String, String) {
    (keys::user_pk(t, user_id), keys::DEVICE_SK_PREFIX.to_owned())
}

/// The devices of several users, in the order asked: one read of every user's first page
/// (a user with more devices than that has the rest read with [`list`]).
pub async fn list_many(deps: &Deps, t: &TenantId, user_ids: &[&str]) -> CoreResult<Vec<Vec<Device>>> {
    let queries: Vec<(String, String)> = user_ids.iter().map(|u| query_of(t, u)).collect();
    let pages = deps.table.query_many(&queries, QUERY_LIMIT).await?;
    let mut out = Vec::with_capacity(pages.len());
    for (user_id, page) in user_ids.iter().zip(pages) {
        if page.next_cursor.is_some() {
            out.push(list(deps, t, user_id).await?);
            continue;
        }
        out.push(page.items.iter().map(|i| i.parse()).collect::<Result<_, _>>()?);
    }
    Ok(out)
}

/// The user's devices.
pub async fn list(deps: &Deps, t: &TenantId, user_id: &str) -> CoreResult<Vec<Device>> {
    let mut out = Vec::new();
    let mut cursor = None;
    let (pk, prefix) = query_of(t, user_id);
    loop {
        let page = deps.table.query(&pk, &prefix, QueryOpts { limit: QUERY_LIMIT, cursor, descending: false }).await?;
        for item in &page.items {
            out.push(item.parse()?);
        }
        cursor = page.next_cursor;
        if cursor.is_none() || out.len() >= 1000 {
            return Ok(out);
        }
    }
}

/// Deletes a device the push service answered as gone. Conditioned on the item still holding
/// that address, so a token registered again since is kept.
pub async fn remove_invalid(deps: &Deps, t: &TenantId, device: &Device) -> CoreResult<()> {
    let hash = token_hash(&device.token);
    let r = deps
        .table
        .transact(vec![
            Write::Delete {
                key: keys::device(t, &device.user_id, &hash),
                cond: Cond::eq("address", device.address.clone()),
            },
            Write::Delete { key: keys::device_token(t, &hash), cond: Cond::eq("user_id", device.user_id.clone()) },
            Write::Delete { key: holder_key(&device.address, t, &device.user_id), cond: Cond::Always },
        ])
        .await;
    match r {
        Ok(()) => forget_endpoint(deps, t, device).await?,
        Err(StoreError::ConditionFailed { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    if let Err(e) = deps.providers.push.unregister_device(&device.address).await {
        warn!(error = %e, "dead push endpoint not deleted at the provider");
    }
    info!(tenant = %t, platform = device.platform.as_str(), "invalid push token deleted");
    Ok(())
}

/// Sends a message through its provider; a push goes to every device of the user (`known`:
/// its devices as read just before, by the caller; else they are read here).
///
/// A device answered as gone (`InvalidToken`) is deleted at once and the others still get it.
/// The send counts as accepted when any device accepted it (the user has it; the collapse id,
/// the delivery key, folds a repeat on a device into one). With no device accepting: transient
/// if any device failed transiently (retried), else permanent.
pub async fn send(
    deps: &Deps,
    t: &TenantId,
    provider: &dyn Provider,
    message: &OutboundMessage,
    known: Option<&[Device]>,
) -> Result<ProviderReceipt, ProviderError> {
    if message.channel != Channel::Push {
        return provider.send(message).await;
    }
    let read;
    let devices = match known {
        Some(devices) => devices,
        None => {
            read = list(deps, t, &message.user_id)
                .await
                .map_err(|e| ProviderError::transient(format!("devices could not be read: {e}")))?;
            &read[..]
        }
    };
    let mut accepted = Vec::new();
    let mut transient = None;
    let mut permanent = None;
    for device in devices {
        let mut m = message.clone();
        m.to = device.address.clone();
        match provider.send(&m).await {
            Ok(r) => accepted.push(r.provider_message_id),
            Err(ProviderError::Permanent { code: PermanentCode::InvalidToken, reason }) => {
                warn!(platform = device.platform.as_str(), %reason, "push token gone; deleting it");
                if let Err(e) = remove_invalid(deps, t, device).await {
                    warn!(error = %e, "invalid push token not deleted; it will be tried again");
                }
                permanent.get_or_insert(ProviderError::Permanent { reason, code: PermanentCode::InvalidToken });
            }
            Err(e @ ProviderError::Permanent { .. }) => permanent = Some(e),
            Err(e @ ProviderError::Transient { .. }) => transient = Some(e),
        }
    }
    if !accepted.is_empty() {
        return Ok(ProviderReceipt { provider_message_id: accepted.join(",") });
    }
    if let Some(e) = transient {
        return Err(e);
    }
    Err(permanent.unwrap_or(ProviderError::Permanent {
        reason: "the user has no registered device".into(),
        code: PermanentCode::InvalidToken,
    }))
}

#[cfg(test)]
mod collapse_tests {
    use super::*;

    #[test]
    fn collapse_ids_fit_apns_and_stay_the_same_per_delivery() {
        let short = "n_01:u1:push";
        assert_eq!(collapse_id(short), short);
        let long = "n_01JEXAMPLE0000000000000000:7f0c2a8e-3b1d-4c55-9a77-2f6e8d1b9c40:push";
        let id = collapse_id(long);
        assert!(long.len() > MAX_COLLAPSE_ID);
        assert_eq!(id.len(), MAX_COLLAPSE_ID);
        assert_eq!(id, collapse_id(long), "the same on every retry");
        assert_ne!(id, collapse_id(&long.replace("7f0c", "7f0d")), "another delivery, another id");
        let exactly = "k".repeat(MAX_COLLAPSE_ID);
        assert_eq!(collapse_id(&exactly), exactly);
    }
}
