//! The orchestrator: one request message → per user and channel, a delivery record and a
//! rendered channel task (in-app goes straight to the inbox). Idempotent: a delivery is created
//! by a conditional put, so a repeated request message creates nothing twice; deliveries still
//! `pending` are queued again (the channel worker deduplicates).

use std::collections::BTreeMap;

use serde_json::{Value, json};
use tracing::{info, instrument, warn};

use super::api::load;
use super::model::{
    ChannelTask, Delivery, DeliveryStatus, Notification, NotificationStatus, RequestMessage, channel_queue,
};
use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::ids::TenantId;
use crate::inbox;
use crate::keys;
use crate::messages::Outcome;
use crate::ports::{Channel, Cond, Item, OutMessage, Received, StoreError, Update, Write, attrs_of};
use crate::retry::backoff;
use crate::templates::{self, Template};
use crate::users::{self, User};

/// Handles one request message.
pub async fn handle_request_message(deps: &Deps, message: &Received) -> Outcome {
    let request: RequestMessage = match serde_json::from_str(&message.body) {
        Ok(r) => r,
        Err(e) => return Outcome::Reject(format!("malformed request message: {e}")),
    };
    let Ok(tenant) = TenantId::parse(&request.tenant) else {
        return Outcome::Reject("request message with an invalid tenant".into());
    };
    match orchestrate(deps, &tenant, &request.notification_id).await {
        Ok(()) => Outcome::Done,
        Err(e) => {
            warn!(error = %e, notification_id = %request.notification_id, "orchestration failed; will retry");
            Outcome::Retry(backoff(message.receive_count, deps.config.retry_base, deps.config.retry_cap, None))
        }
    }
}

#[instrument(skip(deps, t), fields(tenant = %t))]
pub async fn orchestrate(deps: &Deps, t: &TenantId, notification_id: &str) -> CoreResult<()> {
    let Some(n) = load(deps, t, notification_id).await? else {
        warn!("notification not found; nothing to do");
        return Ok(());
    };
    if n.status == NotificationStatus::Cancelled || n.orchestrated {
        return Ok(());
    }
    if n.status == NotificationStatus::Accepted {
        let r = deps
            .table
            .update(
                &keys::notification(t, notification_id),
                vec![Update::set("status", "processing")],
                Cond::eq("status", "accepted"),
            )
            .await;
        match r {
            Ok(_) | Err(StoreError::ConditionFailed { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let template = templates::get_template(deps, t, &n.request.template_id).await?;
    let mut tasks: BTreeMap<String, Vec<OutMessage>> = BTreeMap::new();
    for user_id in n.request.user_ids() {
        let user = users::get_user(deps, t, &user_id).await?;
        for channel in channels_for(&n, user.as_ref(), template.as_ref()) {
            if let Some((queue, task)) =
                plan_delivery(deps, t, &n, &user_id, user.as_ref(), template.as_ref(), channel).await?
            {
                let body = serde_json::to_string(&task).map_err(|e| StoreError::Corrupt(e.to_string()))?;
                tasks.entry(queue).or_default().push(OutMessage::new(body));
            }
        }
    }
    let queued: usize = tasks.values().map(Vec::len).sum();
    for (queue, messages) in tasks {
        deps.queues.send_batch(&queue, messages).await?;
    }
    deps.table
        .update(&keys::notification(t, notification_id), vec![Update::set("orchestrated", true)], Cond::Exists)
        .await?;
    info!(notification_id, queued, "orchestrated");
    Ok(())
}

/// The channels to try for a user: the request's, else every channel the user can receive
/// that the template has content for.
fn channels_for(n: &Notification, user: Option<&User>, template: Option<&Template>) -> Vec<Channel> {
    if let Some(channels) = &n.request.channels {
        let mut seen = Vec::new();
        for c in channels {
            if !seen.contains(c) {
                seen.push(*c);
            }
        }
        return seen;
    }
    let Some(template) = template else { return vec![Channel::Inapp] };
    let locale = user.and_then(|u| u.locale.as_deref());
    let mut out = Vec::new();
    if user.is_some_and(|u| u.email.is_some()) && template.has_channel(Channel::Email, locale) {
        out.push(Channel::Email);
    }
    if user.is_some_and(|u| u.phone.is_some()) && template.has_channel(Channel::Sms, locale) {
        out.push(Channel::Sms);
    }
    if template.has_channel(Channel::Inapp, locale) {
        out.push(Channel::Inapp);
    }
    out
}

fn address(user: Option<&User>, channel: Channel) -> Option<String> {
    let user = user?;
    match channel {
        Channel::Email => user.email.clone(),
        Channel::Sms => user.phone.clone(),
        // Push tokens come with device registration; without a device there is no address.
        Channel::Push => None,
        Channel::Inapp => Some(user.user_id.clone()),
    }
}

/// Creates the delivery record (once) and returns the task to queue, if any.
#[allow(clippy::too_many_arguments)]
async fn plan_delivery(
    deps: &Deps,
    t: &TenantId,
    n: &Notification,
    user_id: &str,
    user: Option<&User>,
    template: Option<&Template>,
    channel: Channel,
) -> CoreResult<Option<(String, ChannelTask)>> {
    let key = keys::delivery(t, &n.notification_id, user_id, channel);
    let now = deps.clock.now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let mut delivery = Delivery {
        user_id: user_id.to_owned(),
        channel,
        status: DeliveryStatus::Pending,
        attempts: 0,
        last_error: None,
        reason: None,
        sent_at: None,
        first_failed_at: None,
        lease_until_ms: None,
        provider_message_id: None,
        category: n.request.category,
        updated_at: now.clone(),
    };
    let rendered = match (address(user, channel), template) {
        (None, _) => {
            delivery.status = DeliveryStatus::Suppressed;
            delivery.reason = Some("no_address".into());
            None
        }
        (Some(_), None) => {
            delivery.status = DeliveryStatus::Failed;
            delivery.last_error = Some(format!("template_error: template {} not found", n.request.template_id));
            None
        }
        (Some(to), Some(template)) => {
            let params = params_for(&n.request.params, user_id, user);
            match template.render(channel, user.and_then(|u| u.locale.as_deref()), &params) {
                Ok(r) => Some((to, r)),
                Err(e) => {
                    delivery.status = DeliveryStatus::Failed;
                    delivery.last_error = Some(e.to_string());
                    None
                }
            }
        }
    };
    let Some((to, rendered)) = rendered else {
        return match deps.table.put(Item::new(key, attrs_of(&delivery)?), Cond::NotExists).await {
            Ok(()) | Err(StoreError::ConditionFailed { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        };
    };
    if channel == Channel::Inapp {
        delivery.status = DeliveryStatus::Sent;
        delivery.attempts = 1;
        delivery.sent_at = Some(now);
        let mut writes = inbox::message_writes(
            t,
            user_id,
            n,
            rendered.subject.unwrap_or_default(),
            rendered.body,
            &delivery.updated_at,
        )?;
        writes.push(Write::Put { item: Item::new(key, attrs_of(&delivery)?), cond: Cond::NotExists });
        return match deps.table.transact(writes).await {
            Ok(()) | Err(StoreError::ConditionFailed { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        };
    }
    match deps.table.put(Item::new(key.clone(), attrs_of(&delivery)?), Cond::NotExists).await {
        Ok(()) => {}
        Err(StoreError::ConditionFailed { .. }) => {
            // Made by an earlier run: queue it again only if it is still waiting to be sent.
            let existing: Option<Delivery> = deps.table.get(&key).await?.map(|i| i.parse()).transpose()?;
            if !existing.is_some_and(|d| d.status == DeliveryStatus::Pending) {
                return Ok(None);
            }
        }
        Err(e) => return Err(e.into()),
    }
    let task = ChannelTask {
        tenant: t.as_str().to_owned(),
        notification_id: n.notification_id.clone(),
        user_id: user_id.to_owned(),
        channel,
        category: n.request.category,
        to,
        subject: rendered.subject,
        body: rendered.body,
        headers: Vec::new(),
    };
    Ok(Some((channel_queue(channel, n.priority), task)))
}

/// Template parameters: the request's, plus `user_id` and the user's locale when not given.
fn params_for(params: &Value, user_id: &str, user: Option<&User>) -> Value {
    let mut p = params.clone();
    if let Value::Object(map) = &mut p {
        map.entry("user_id").or_insert_with(|| json!(user_id));
        if let Some(locale) = user.and_then(|u| u.locale.clone()) {
            map.entry("locale").or_insert_with(|| json!(locale));
        }
    }
    p
}

impl From<serde_json::Error> for CoreError {
    fn from(e: serde_json::Error) -> Self {
        CoreError::Store(StoreError::Corrupt(e.to_string()))
    }
}
