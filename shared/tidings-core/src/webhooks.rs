//! Webhooks out to the shop, signed as the Standard Webhooks specification says.
//!
//! A tenant registers endpoints (a URL, the event types it wants, a rate); each gets a signing
//! secret `whsec_<base64>`. A fact (a delivery sent, an order expired, ...) writes, in the same
//! transaction as the fact itself, an outbox item per event ([`event_write`]) when some endpoint
//! of the tenant subscribes to its type. The change stream relays each new outbox item to the
//! [`WEBHOOKS_QUEUE`] (like a notification: `notify::relay`), where [`WebhookStep`]
//! fans it out into one attempt per subscribed endpoint and each attempt POSTs the event. So an
//! event is never lost once its fact is recorded: the stream, the queue's retries, its DLQ and
//! the ops redrive carry it, at least once; the `webhook-id` header is the event's id, stable
//! across retries, and a delivered attempt is remembered so it is not posted again.
//!
//! | item | pk | sk |
//! |---|---|---|
//! | endpoint | `T#t#WEBHOOKS` | `WH#{endpoint_id}` |
//! | event (the outbox, with `ttl`) | `T#t#WHEVT#{event_id}` | `WHEVT` |
//! | an attempt's end (delivered or failed for good, with `ttl`) | `T#t#WHEVT#{event_id}` | `END#{endpoint_id}` |

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tracing::{info, warn};

use crate::config::UrlPolicy;
use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::gates::{RateGate, SharedGate};
use crate::ids::TenantId;
use crate::messages::Outcome;
use crate::ports::{Cond, Item, Key, OutMessage, QueryOpts, StoreError, Update, Write, attrs_of};
use crate::retry::backoff;
use crate::tasks::{Step, Task};
use crate::webhook_targets::{TargetRefused, special_purpose};

/// The queue of webhook events and attempts (its DLQ is `webhooks-dlq`).
pub const WEBHOOKS_QUEUE: &str = "webhooks";

/// The sort key of an event's outbox item (the change stream filter matches on it).
pub const EVENT_SK: &str = "WHEVT";

/// The most endpoints a tenant may have.
pub const MAX_ENDPOINTS: usize = 20;

/// How long outbox items and attempts' ends are kept (the table's TTL).
const KEEP_S: i64 = 14 * 86_400;

/// The event types an endpoint may subscribe to (and `webhook.test`, which the test route sends
/// to one endpoint whatever it subscribes to).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema)]
pub enum EventType {
    #[serde(rename = "delivery.sent")]
    DeliverySent,
    #[serde(rename = "delivery.delivered")]
    DeliveryDelivered,
    #[serde(rename = "delivery.failed")]
    DeliveryFailed,
    #[serde(rename = "delivery.opened")]
    DeliveryOpened,
    #[serde(rename = "delivery.clicked")]
    DeliveryClicked,
    #[serde(rename = "delivery.bounced")]
    DeliveryBounced,
    #[serde(rename = "order.expired")]
    OrderExpired,
    #[serde(rename = "restock.notified")]
    RestockNotified,
    #[serde(rename = "campaign.completed")]
    CampaignCompleted,
    /// A workflow run ended (`completed`, `failed`, `throttled`, `cancelled`).
    #[serde(rename = "workflow.run_ended")]
    WorkflowRunEnded,
    #[serde(rename = "webhook.test")]
    WebhookTest,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::DeliverySent => "delivery.sent",
            EventType::DeliveryDelivered => "delivery.delivered",
            EventType::DeliveryFailed => "delivery.failed",
            EventType::DeliveryOpened => "delivery.opened",
            EventType::DeliveryClicked => "delivery.clicked",
            EventType::DeliveryBounced => "delivery.bounced",
            EventType::OrderExpired => "order.expired",
            EventType::RestockNotified => "restock.notified",
            EventType::CampaignCompleted => "campaign.completed",
            EventType::WorkflowRunEnded => "workflow.run_ended",
            EventType::WebhookTest => "webhook.test",
        }
    }
}

/// One event, as its body is posted: `{"type", "timestamp", "data"}` (the Standard Webhooks
/// payload shape), its id in the `webhook-id` header.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: EventType,
    pub timestamp: String,
    pub data: Value,
}

impl Event {
    /// An event whose id is derived from what it is about (`parts`): the same fact recorded
    /// twice makes the same id, so receivers dedupe on `webhook-id`.
    pub fn of(deps: &Deps, t: &TenantId, kind: EventType, parts: &[&str], data: Value) -> Self {
        let mut h = Sha256::new();
        h.update(t.as_str().as_bytes());
        h.update([0]);
        h.update(kind.as_str().as_bytes());
        for p in parts {
            h.update([0]);
            h.update(p.as_bytes());
        }
        let id = format!("evt_{}", &hex::encode(h.finalize())[..32]);
        let timestamp = deps.clock.now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        Self { id, kind, timestamp, data }
    }

    /// The body posted (and signed).
    pub fn body(&self) -> String {
        json!({"type": self.kind, "timestamp": self.timestamp, "data": self.data}).to_string()
    }
}

fn endpoints_pk(t: &TenantId) -> String {
    format!("T#{t}#WEBHOOKS")
}

fn endpoint_key(t: &TenantId, id: &str) -> Key {
    Key::new(endpoints_pk(t), format!("WH#{id}"))
}

fn event_key(t: &TenantId, event_id: &str) -> Key {
    Key::new(format!("T#{t}#WHEVT#{event_id}"), EVENT_SK)
}

fn end_key(t: &TenantId, event_id: &str, endpoint_id: &str) -> Key {
    Key::new(format!("T#{t}#WHEVT#{event_id}"), format!("END#{endpoint_id}"))
}

/// A signing secret, with when it stops signing (a rotated-out one, during its grace period).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Secret {
    secret: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    until_ms: Option<i64>,
}

/// An endpoint as stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Stored {
    endpoint_id: String,
    url: String,
    events: Vec<EventType>,
    rate_limit: u32,
    created_at: String,
    updated_at: String,
    secrets: Vec<Secret>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    last_attempt: Option<LastAttempt>,
}

impl Stored {
    fn live_secrets(&self, now_ms: i64) -> Vec<&str> {
        self.secrets.iter().filter(|s| s.until_ms.is_none_or(|u| u > now_ms)).map(|s| s.secret.as_str()).collect()
    }
    fn view(&self) -> Endpoint {
        Endpoint {
            endpoint_id: self.endpoint_id.clone(),
            url: self.url.clone(),
            events: self.events.clone(),
            rate_limit: self.rate_limit,
            created_at: self.created_at.clone(),
            updated_at: self.updated_at.clone(),
            last_attempt: self.last_attempt.clone(),
        }
    }
}

/// The last attempt to post to an endpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LastAttempt {
    pub event_id: String,
    /// `delivered`, `retrying` or `failed` (a 4xx other than 408 and 429: not tried again).
    pub outcome: String,
    /// The receiver's HTTP status (absent when it did not answer, or was not asked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_code: Option<u16>,
    /// Why nothing was posted, when the target was refused before any connection:
    /// `target_refused: resolves to a special-purpose address`, `target_refused: the name did
    /// not resolve` (retried) or `target_refused: the URL is not an allowed target`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<String>,
    pub at: String,
}

/// An endpoint as the API shows it (never its secrets).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Endpoint {
    #[schema(example = "0193a6d0c0f67c3e8a1b2c3d4e5f6a7b")]
    pub endpoint_id: String,
    #[schema(example = "https://shop.example.com/hooks/tidings")]
    pub url: String,
    pub events: Vec<EventType>,
    /// Requests per second this endpoint is sent at most.
    #[schema(example = 10)]
    pub rate_limit: u32,
    pub created_at: String,
    pub updated_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_attempt: Option<LastAttempt>,
}

/// An endpoint just made, or whose secret was just rotated: the only answers that carry the
/// secret.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EndpointWithSecret {
    #[serde(flatten)]
    pub endpoint: Endpoint,
    /// `whsec_` and the base64 of the key: what the receiver verifies `webhook-signature` with.
    #[schema(example = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")]
    pub secret: String,
}

/// What `POST /v1/webhooks` takes.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"url": "https://shop.example.com/hooks/tidings", "events": ["delivery.delivered", "order.expired"], "rate_limit": 10}))]
pub struct EndpointInput {
    /// `https://` (plain `http://` and private addresses only when the server allows private
    /// targets: `TIDINGS_WEBHOOK_ALLOW_PRIVATE`, dev and tests).
    #[schema(min_length = 8, max_length = 2048, format = "uri")]
    pub url: String,
    /// At least one; `webhook.test` is not subscribed to (the test route sends it).
    #[schema(min_items = 1, max_items = 9)]
    pub events: Vec<EventType>,
    /// Requests per second, 1 to 1,000 (default 10).
    #[schema(minimum = 1, maximum = 1000)]
    pub rate_limit: Option<u32>,
}

/// Checks an endpoint URL (422 naming `url`).
pub fn check_url(url: &str, policy: UrlPolicy) -> CoreResult<url::Url> {
    let bad = |detail: &str| CoreError::invalid("url", detail);
    if url.len() > 2048 {
        return Err(bad("at most 2048 characters"));
    }
    let parsed = url::Url::parse(url).map_err(|e| bad(&format!("not a URL: {e}")))?;
    match parsed.scheme() {
        "https" => {}
        "http" if policy.allow_private => {}
        "http" => return Err(bad("must be https")),
        _ => return Err(bad("must be an https URL")),
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(bad("must not carry credentials"));
    }
    if parsed.fragment().is_some() {
        return Err(bad("must not have a fragment"));
    }
    if policy.allow_private {
        return Ok(parsed);
    }
    // A literal address is never looked up, so this is its only check; a name's addresses are
    // checked at each post, by the lookup the post connects with (`webhook_targets`).
    let special = match parsed.host() {
        None => return Err(bad("must name a host")),
        Some(url::Host::Ipv4(ip)) => special_purpose(IpAddr::V4(ip)),
        Some(url::Host::Ipv6(ip)) => special_purpose(IpAddr::V6(ip)),
        Some(url::Host::Domain(d)) => {
            let d = d.trim_end_matches('.').to_ascii_lowercase();
            let local = d == "localhost"
                || [".localhost", ".local", ".internal", ".localdomain"].iter().any(|s| d.ends_with(s))
                || !d.contains('.');
            local.then_some("a local name")
        }
    };
    if let Some(what) = special {
        return Err(bad(&format!(
            "must not point to a special-purpose address or a local name ({what}): loopback, \
             private, link-local, documentation and reserved addresses, and IPv6 forms carrying \
             one (IPv4-mapped, NAT64, 6to4, Teredo), are refused; give an https URL whose host is \
             a public name or address"
        )));
    }
    Ok(parsed)
}

/// A new signing secret: `whsec_` and 24 random bytes in base64.
fn new_secret() -> String {
    let bytes: [u8; 24] = rand::random();
    format!("whsec_{}", B64.encode(bytes))
}

/// The Standard Webhooks signature of `body` with `secret` (`whsec_<base64 key>`): `v1,` and the
/// base64 of HMAC-SHA256 over `{id}.{timestamp}.{body}`. `None`: a secret that is not base64.
pub fn sign(secret: &str, id: &str, timestamp: i64, body: &str) -> Option<String> {
    let key = B64.decode(secret.strip_prefix("whsec_").unwrap_or(secret)).ok()?;
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).ok()?;
    mac.update(format!("{id}.{timestamp}.{body}").as_bytes());
    Some(format!("v1,{}", B64.encode(mac.finalize().into_bytes())))
}

/// The `webhook-signature` header: one `v1,<sig>` per live secret, space separated.
pub fn signature_header(secrets: &[&str], id: &str, timestamp: i64, body: &str) -> String {
    secrets.iter().filter_map(|s| sign(s, id, timestamp, body)).collect::<Vec<_>>().join(" ")
}

fn now_text(deps: &Deps) -> String {
    deps.clock.now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn check_input(deps: &Deps, input: &EndpointInput) -> CoreResult<()> {
    check_url(&input.url, deps.config.webhooks.policy)?;
    if input.events.is_empty() {
        return Err(CoreError::invalid("events", "at least one event type"));
    }
    if input.events.contains(&EventType::WebhookTest) {
        return Err(CoreError::invalid(
            "events",
            "webhook.test is sent by POST /v1/webhooks/{id}/test, not subscribed to",
        ));
    }
    if let Some(r) = input.rate_limit
        && !(1..=1000).contains(&r)
    {
        return Err(CoreError::invalid("rate_limit", "1 to 1000 requests per second"));
    }
    Ok(())
}

fn check_endpoint_id(id: &str) -> CoreResult<()> {
    if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(CoreError::NotFound { what: "webhook endpoint" });
    }
    Ok(())
}

async fn stored_endpoints(deps: &Deps, t: &TenantId) -> Result<Vec<Stored>, StoreError> {
    let page = deps.table.query(&endpoints_pk(t), "WH#", QueryOpts { limit: 100, ..Default::default() }).await?;
    page.items.iter().map(Item::parse).collect()
}

async fn stored_endpoint(deps: &Deps, t: &TenantId, id: &str) -> CoreResult<Stored> {
    check_endpoint_id(id)?;
    match deps.table.get(&endpoint_key(t, id)).await? {
        Some(item) => Ok(item.parse()?),
        None => Err(CoreError::NotFound { what: "webhook endpoint" }),
    }
}

/// Registers an endpoint; the answer carries its secret, the only time it is shown.
pub async fn create(deps: &Deps, t: &TenantId, input: EndpointInput) -> CoreResult<EndpointWithSecret> {
    check_input(deps, &input)?;
    if stored_endpoints(deps, t).await?.len() >= MAX_ENDPOINTS {
        return Err(CoreError::conflict("too_many_endpoints", format!("at most {MAX_ENDPOINTS} webhook endpoints")));
    }
    let mut events = input.events;
    events.sort();
    events.dedup();
    let at = now_text(deps);
    let secret = new_secret();
    let stored = Stored {
        endpoint_id: crate::ids::new_id(),
        url: input.url,
        events,
        rate_limit: input.rate_limit.unwrap_or(10),
        created_at: at.clone(),
        updated_at: at,
        secrets: vec![Secret { secret: secret.clone(), until_ms: None }],
        last_attempt: None,
    };
    let key = endpoint_key(t, &stored.endpoint_id);
    deps.table.put(Item::new(key, attrs_of(&stored)?), Cond::NotExists).await?;
    info!(tenant = %t, endpoint_id = %stored.endpoint_id, "webhook endpoint created");
    Ok(EndpointWithSecret { endpoint: stored.view(), secret })
}

pub async fn list(deps: &Deps, t: &TenantId) -> CoreResult<Vec<Endpoint>> {
    Ok(stored_endpoints(deps, t).await?.iter().map(Stored::view).collect())
}

pub async fn get(deps: &Deps, t: &TenantId, id: &str) -> CoreResult<Endpoint> {
    Ok(stored_endpoint(deps, t, id).await?.view())
}

/// Deletes an endpoint (its pending attempts find it gone and end).
pub async fn delete(deps: &Deps, t: &TenantId, id: &str) -> CoreResult<()> {
    check_endpoint_id(id)?;
    match deps.table.delete(&endpoint_key(t, id), Cond::Exists).await {
        Ok(()) => Ok(()),
        Err(StoreError::ConditionFailed { .. }) => Err(CoreError::NotFound { what: "webhook endpoint" }),
        Err(e) => Err(e.into()),
    }
}

/// A new secret; the old ones keep signing beside it for the grace period.
pub async fn rotate(deps: &Deps, t: &TenantId, id: &str) -> CoreResult<EndpointWithSecret> {
    let mut stored = stored_endpoint(deps, t, id).await?;
    let now_ms = deps.clock.now_ms();
    let until = now_ms + deps.config.webhooks.rotation_grace.as_millis() as i64;
    let previous = stored.updated_at.clone();
    let mut secrets: Vec<Secret> = stored
        .secrets
        .iter()
        .filter(|s| s.until_ms.is_none_or(|u| u > now_ms))
        .map(|s| Secret { secret: s.secret.clone(), until_ms: Some(s.until_ms.unwrap_or(until).min(until)) })
        .take(4)
        .collect();
    let secret = new_secret();
    secrets.insert(0, Secret { secret: secret.clone(), until_ms: None });
    stored.secrets = secrets;
    stored.updated_at = now_text(deps);
    let cond = Cond::eq("updated_at", previous.as_str());
    match deps.table.put(Item::new(endpoint_key(t, id), attrs_of(&stored)?), cond).await {
        Ok(()) => Ok(EndpointWithSecret { endpoint: stored.view(), secret }),
        Err(StoreError::ConditionFailed { .. }) => {
            Err(CoreError::conflict("write_conflict", "the endpoint changed meanwhile; try again"))
        }
        Err(e) => Err(e.into()),
    }
}

/// Queues a `webhook.test` event for one endpoint. Returns the event's id.
pub async fn send_test(deps: &Deps, t: &TenantId, id: &str) -> CoreResult<String> {
    let stored = stored_endpoint(deps, t, id).await?;
    let nonce = crate::ids::new_id();
    let event = Event::of(deps, t, EventType::WebhookTest, &[&nonce], json!({"endpoint_id": stored.endpoint_id}));
    let message = Message::Attempt { tenant: t.clone(), endpoint_id: stored.endpoint_id, event: event.clone() };
    deps.queues.send_batch(WEBHOOKS_QUEUE, vec![OutMessage::new(serde_json::to_string(&message)?)]).await?;
    Ok(event.id)
}

/// The event types some endpoint of the tenant subscribes to.
pub async fn subscribed(deps: &Deps, t: &TenantId) -> Result<Vec<EventType>, StoreError> {
    let mut all: Vec<EventType> = stored_endpoints(deps, t).await?.into_iter().flat_map(|e| e.events).collect();
    all.sort();
    all.dedup();
    Ok(all)
}

/// The outbox write of an event: put beside its fact, in the same transaction. An event
/// recorded twice is the same item (a modification, which the relay does not relay again).
pub fn event_write(t: &TenantId, event: &Event, now_ms: i64) -> Result<Write, StoreError> {
    let mut attrs = attrs_of(&json!({"event": event}))?;
    attrs.insert("ttl".into(), (now_ms / 1000 + KEEP_S).into());
    Ok(Write::Put { item: Item::new(event_key(t, &event.id), attrs), cond: Cond::Always })
}

/// The outbox writes of those `events` some endpoint of the tenant subscribes to (none, and no
/// read, when there are no events).
pub async fn event_writes(deps: &Deps, t: &TenantId, events: Vec<Event>) -> Result<Vec<Write>, StoreError> {
    if events.is_empty() {
        return Ok(Vec::new());
    }
    let wanted = subscribed(deps, t).await?;
    let now_ms = deps.clock.now_ms();
    events.iter().filter(|e| wanted.contains(&e.kind)).map(|e| event_write(t, e, now_ms)).collect()
}

/// The delivery event type of a status change, if it is one: `sent`, `delivered`, `opened`,
/// `clicked`, `bounced` (failed after it was sent: a receipt), `failed` (failed or dead before).
pub fn delivery_event_type(
    from: crate::notify::model::DeliveryStatus,
    to: crate::notify::model::DeliveryStatus,
) -> Option<EventType> {
    use crate::notify::model::DeliveryStatus as S;
    Some(match to {
        S::Sent => EventType::DeliverySent,
        S::Delivered => EventType::DeliveryDelivered,
        S::Opened => EventType::DeliveryOpened,
        S::Clicked => EventType::DeliveryClicked,
        S::Failed if matches!(from, S::Sent | S::Delivered | S::Opened | S::Clicked) => EventType::DeliveryBounced,
        S::Failed | S::Dead => EventType::DeliveryFailed,
        _ => return None,
    })
}

/// A delivery's status change, for [`delivery_event_writes`].
pub struct DeliveryChange<'a> {
    pub notification_id: &'a str,
    pub user_id: &'a str,
    /// The delivery's sort key: `D#{user}#{channel}`, or a workflow step's `D#{user}#{channel}#{step}`.
    pub delivery_sk: String,
    pub from: crate::notify::model::DeliveryStatus,
    pub to: crate::notify::model::DeliveryStatus,
}

/// The outbox writes of the delivery events among `changes` that some endpoint of the tenant
/// subscribes to. The endpoints are read only when a change is an event, and an event (its id a
/// SHA-256, its timestamp and data formatted) is made only when it is wanted: a campaign's
/// sends to a tenant with no endpoint make none.
pub async fn delivery_event_writes(
    deps: &Deps,
    t: &TenantId,
    changes: Vec<DeliveryChange<'_>>,
) -> Result<Vec<Write>, StoreError> {
    let typed: Vec<(EventType, DeliveryChange<'_>)> =
        changes.into_iter().filter_map(|c| Some((delivery_event_type(c.from, c.to)?, c))).collect();
    if typed.is_empty() {
        return Ok(Vec::new());
    }
    let wanted = subscribed(deps, t).await?;
    let now_ms = deps.clock.now_ms();
    typed
        .into_iter()
        .filter(|(kind, _)| wanted.contains(kind))
        .filter_map(|(_, c)| delivery_event(deps, t, c.notification_id, c.user_id, &c.delivery_sk, c.from, c.to))
        .map(|e| event_write(t, &e, now_ms))
        .collect()
}

/// The delivery event of a status change, if it is one ([`delivery_event_type`]).
pub fn delivery_event(
    deps: &Deps,
    t: &TenantId,
    notification_id: &str,
    user_id: &str,
    delivery_sk: &str,
    from: crate::notify::model::DeliveryStatus,
    to: crate::notify::model::DeliveryStatus,
) -> Option<Event> {
    let kind = delivery_event_type(from, to)?;
    // `D#{user}#{channel}`, or a workflow step's `D#{user}#{channel}#{step}`.
    let rest = delivery_sk.strip_prefix("D#").and_then(|r| r.strip_prefix(user_id)).unwrap_or_default();
    let mut parts = rest.trim_start_matches('#').split('#');
    let channel = parts.next().unwrap_or_default();
    let mut data = json!({
        "notification_id": notification_id,
        "user_id": user_id,
        "channel": channel,
        "status": to.as_str(),
    });
    if let Some(step) = parts.next().and_then(|s| s.parse::<u32>().ok()) {
        data["step"] = json!(step);
    }
    Some(Event::of(deps, t, kind, &[notification_id, delivery_sk], data))
}

/// The relay's message for a new outbox item (`None`: not one, or unreadable).
pub fn relayed(key: &Key, attrs: &crate::ports::Attrs) -> Option<String> {
    if key.sk != EVENT_SK {
        return None;
    }
    let (tenant, _) = crate::keys::tenant_of(&key.pk)?;
    let event: Event = serde_json::from_value(attrs.get("event")?.clone()).ok()?;
    serde_json::to_string(&Message::Event { tenant, event }).ok()
}

/// Queues again an outbox item's event (a stream record the relay gave up on). `false`: no
/// such item.
pub async fn redrive(deps: &Deps, key: &Key) -> CoreResult<bool> {
    let Some(item) = deps.table.get(key).await? else { return Ok(false) };
    let Some(body) = relayed(key, &item.attrs) else {
        return Err(StoreError::Corrupt(format!("{} {}: unreadable webhook event", key.pk, key.sk)).into());
    };
    deps.queues.send_batch(WEBHOOKS_QUEUE, vec![OutMessage::new(body)]).await?;
    Ok(true)
}

/// A message on the [`WEBHOOKS_QUEUE`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Message {
    /// An event to fan out to the tenant's subscribed endpoints.
    Event { tenant: TenantId, event: Event },
    /// An event to post to one endpoint.
    Attempt { tenant: TenantId, endpoint_id: String, event: Event },
}

/// Each endpoint's rate gate, shared by every instance through the table (one bucket item per
/// endpoint), kept per process so its local allowance lasts.
fn gate_of(deps: &Deps, t: &TenantId, endpoint: &Stored) -> Arc<SharedGate> {
    static GATES: OnceLock<Mutex<HashMap<String, Arc<SharedGate>>>> = OnceLock::new();
    let table = Arc::as_ptr(&deps.table) as *const () as usize;
    let name = format!("webhook#{t}#{}#{}", endpoint.endpoint_id, endpoint.rate_limit);
    let mut gates = GATES.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    if gates.len() > 10_000 {
        gates.clear();
    }
    gates
        .entry(format!("{table:x}#{name}"))
        .or_insert_with(|| Arc::new(SharedGate::shaped(deps.table.clone(), &name, f64::from(endpoint.rate_limit), 0.2)))
        .clone()
}

/// The webhooks lane's step: an event fanned out to the tenant's subscribed endpoints, or one
/// endpoint's post.
pub struct WebhookStep;

impl Step for WebhookStep {
    type Body = Message;
    const WHAT: &'static str = "webhook message";
    async fn run(deps: &Deps, task: &Task<Message>) -> CoreResult<Outcome> {
        let next = match &task.body {
            Message::Event { tenant, event } => fan_out(deps, tenant, event).await?,
            Message::Attempt { tenant, endpoint_id, event } => attempt(deps, tenant, endpoint_id, event, task).await?,
        };
        Ok(match next {
            Next::Done => Outcome::Done,
            Next::Retry(after) => {
                Outcome::Retry(backoff(task.receive_count, deps.config.retry_base, deps.config.retry_cap, after))
            }
        })
    }
}

/// What a webhook message's work leaves to do: nothing, or a retry (after the endpoint's
/// `Retry-After`, if it gave one).
enum Next {
    Done,
    Retry(Option<Duration>),
}

async fn fan_out(deps: &Deps, t: &TenantId, event: &Event) -> CoreResult<Next> {
    let endpoints = stored_endpoints(deps, t).await?;
    let mut attempts = Vec::new();
    for e in endpoints.into_iter().filter(|e| e.events.contains(&event.kind)) {
        let m = Message::Attempt { tenant: t.clone(), endpoint_id: e.endpoint_id, event: event.clone() };
        attempts.push(OutMessage::new(serde_json::to_string(&m)?));
    }
    if !attempts.is_empty() {
        deps.queues.send_batch(WEBHOOKS_QUEUE, attempts).await?;
    }
    Ok(Next::Done)
}

async fn record_end(deps: &Deps, t: &TenantId, event: &Event, endpoint: &Stored, last: LastAttempt) -> CoreResult<()> {
    if last.outcome != "retrying" {
        let mut attrs = attrs_of(&last)?;
        attrs.insert("ttl".into(), (deps.clock.now_ms() / 1000 + KEEP_S).into());
        deps.table.put(Item::new(end_key(t, &event.id, &endpoint.endpoint_id), attrs), Cond::Always).await?;
    }
    let updates = vec![Update::set("last_attempt", serde_json::to_value(&last)?)];
    match deps.table.update(&endpoint_key(t, &endpoint.endpoint_id), updates, Cond::Exists).await {
        Ok(_) | Err(StoreError::ConditionFailed { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

async fn attempt(
    deps: &Deps,
    t: &TenantId,
    endpoint_id: &str,
    event: &Event,
    task: &Task<Message>,
) -> CoreResult<Next> {
    let endpoint = match stored_endpoint(deps, t, endpoint_id).await {
        Ok(e) => e,
        Err(CoreError::NotFound { .. }) => return Ok(Next::Done),
        Err(e) => return Err(e),
    };
    if deps.table.get(&end_key(t, &event.id, endpoint_id)).await?.is_some() {
        return Ok(Next::Done); // posted already (a repeated event or attempt)
    }
    let now_ms = deps.clock.now_ms();
    if let Err(wait) = gate_of(deps, t, &endpoint).try_take(now_ms).await {
        // Over the endpoint's rate: the message comes back when a token does, without counting
        // a receive towards the DLQ.
        let copy = OutMessage::delayed(serde_json::to_string(&task.body)?, wait.max(Duration::from_millis(200)));
        return match deps.queues.send_batch(WEBHOOKS_QUEUE, vec![copy]).await {
            Ok(()) => Ok(Next::Done),
            Err(_) => Ok(Next::Retry(Some(wait))),
        };
    }
    let at = now_text(deps);
    let last = |outcome: &str, status_code: Option<u16>| LastAttempt {
        event_id: event.id.clone(),
        outcome: outcome.into(),
        status_code,
        refusal: None,
        at: at.clone(),
    };
    let refused = |why: &TargetRefused| {
        let outcome = if why.retryable() { "retrying" } else { "failed" };
        LastAttempt { refusal: Some(why.to_string()), ..last(outcome, None) }
    };
    let policy = deps.config.webhooks.policy;
    let url = match check_url(&endpoint.url, policy) {
        Ok(u) => u,
        Err(e) => {
            warn!(tenant = %t, endpoint_id, error = %e, "webhook endpoint refused");
            record_end(deps, t, event, &endpoint, refused(&TargetRefused::Url)).await?;
            return Ok(Next::Done);
        }
    };
    // The client looks the name up once and connects only to the addresses it checked: no
    // lookup here (a second answer is what DNS rebinding gives), docs/webhooks.md.
    let Some(client) = deps.webhook_client.client(policy) else { return Ok(Next::Retry(None)) };
    let timestamp = now_ms / 1000;
    let body = event.body();
    let signature = signature_header(&endpoint.live_secrets(now_ms), &event.id, timestamp, &body);
    let sent = client
        .post(url)
        .header("content-type", "application/json")
        .header("webhook-id", &event.id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature)
        .body(body)
        .send()
        .await;
    let status = match sent {
        Ok(r) => r.status(),
        Err(e) => {
            if let Some(why) = TargetRefused::in_error(&e) {
                warn!(tenant = %t, endpoint_id, error = %why, "webhook target refused; nothing posted");
                record_end(deps, t, event, &endpoint, refused(why)).await?;
                return Ok(if why.retryable() { Next::Retry(None) } else { Next::Done });
            }
            info!(tenant = %t, endpoint_id, error = %e, attempt = task.receive_count, "webhook post failed; retried");
            record_end(deps, t, event, &endpoint, last("retrying", None)).await?;
            return Ok(Next::Retry(None));
        }
    };
    let code = status.as_u16();
    if status.is_success() {
        record_end(deps, t, event, &endpoint, last("delivered", Some(code))).await?;
        return Ok(Next::Done);
    }
    if code == 408 || code == 429 || status.is_server_error() {
        info!(tenant = %t, endpoint_id, code, attempt = task.receive_count, "webhook refused for now; retried");
        record_end(deps, t, event, &endpoint, last("retrying", Some(code))).await?;
        return Ok(Next::Retry(None));
    }
    warn!(tenant = %t, endpoint_id, code, "webhook refused for good; not retried");
    record_end(deps, t, event, &endpoint, last("failed", Some(code))).await?;
    Ok(Next::Done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_standard_webhooks_test_vector_signs_as_the_specification_says() {
        // The specification's example (standard-webhooks, "Signature scheme").
        let sig = sign(
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1_614_265_330,
            r#"{"test": 2432232314}"#,
        );
        assert_eq!(sig.as_deref(), Some("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="));
    }

    #[test]
    fn two_live_secrets_give_two_signatures() {
        let h = signature_header(&["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_AAAA"], "id", 1, "{}");
        let parts: Vec<&str> = h.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert!(parts.iter().all(|p| p.starts_with("v1,")));
        assert_ne!(parts[0], parts[1]);
    }

    #[test]
    fn private_targets_are_refused_unless_allowed() {
        let prod = UrlPolicy { allow_private: false };
        let dev = UrlPolicy { allow_private: true };
        for url in [
            "http://shop.example.com/h",
            "https://127.0.0.1/h",
            "https://10.1.2.3/h",
            "https://169.254.169.254/latest",
            "https://[::1]/h",
            "https://[fd00::1]/h",
            "https://[::ffff:192.168.0.1]/h",
            "https://localhost/h",
            "https://metadata.google.internal/h",
            "https://intranet/h",
            "https://user:pw@shop.example.com/h",
            "ftp://shop.example.com/h",
        ] {
            assert!(check_url(url, prod).is_err(), "{url}");
        }
        assert!(check_url("https://shop.example.com/hooks", prod).is_ok());
        assert!(check_url("https://93.184.216.34/hooks", prod).is_ok());
        assert!(check_url("http://127.0.0.1:9999/hooks", dev).is_ok());
        assert!(check_url("ftp://127.0.0.1/hooks", dev).is_err());
    }

    #[test]
    fn event_types_have_their_wire_names() {
        for kind in [EventType::DeliverySent, EventType::OrderExpired, EventType::WebhookTest] {
            assert_eq!(serde_json::to_value(kind).unwrap(), kind.as_str());
        }
    }
}
