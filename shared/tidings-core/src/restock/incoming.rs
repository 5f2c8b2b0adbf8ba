//! Telling subscribers that stock is on its way (docs/inventory.md, "Incoming stock"): a WAITING
//! subscription made with `notify_incoming` hears the date a shipment of its SKU is expected,
//! once per shipment and date. A shipment recorded (or its date moved) has its SKU's WAITING
//! subscribers told a page at a time by timer tasks (`restock.incoming`); a subscription made
//! while a shipment is on its way is told at once of the soonest. Each message is a
//! notification (template `restock_incoming`, transactional) whose idempotency key is the
//! (SKU, shipment, date, user): whatever runs twice, a user hears a date once.

use serde_json::json;
use sha2::{Digest, Sha256};

use super::keys;
use super::model::{Subscription, SubscriptionStatus, WaitingEntry};
use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::ids::TenantId;
use crate::inventory::incoming::{self as shipments, Incoming, IncomingStatus};
use crate::notify::api;
use crate::notify::model::NotificationRequest;
use crate::ports::QueryOpts;
use crate::templates::LocaleContent;
use crate::timers::task::{self as timer, TimerTask};
use tracing::warn;

/// The built-in template's id; a tenant may replace it with `PUT /v1/templates/restock_incoming`.
pub const INCOMING_TEMPLATE: &str = "restock_incoming";
/// Subscribers read per task.
const PAGE: usize = 100;

/// Where a [`tell_page`] task is in the SKU's WAITING indexes.
#[derive(Clone, Debug, Default)]
pub struct Page {
    /// The index: a market's, or (`None`) that of no market.
    pub market: Option<String>,
    pub cursor: Option<String>,
}

/// One page of a SKU's WAITING subscribers told of shipment `reference`'s date `expected_at`,
/// then the next page's task; index by index (no market first, then each market's; a market the
/// shipment's location does not serve is skipped: docs/restock.md, "Markets"). A shipment
/// arrived, or whose date moved since (its own task tells the new one), tells nobody more.
pub async fn tell_page(
    deps: &Deps,
    t: &TenantId,
    sku_id: &str,
    reference: &str,
    expected_at: &str,
    page: Page,
) -> CoreResult<()> {
    let Some(item) = deps.table.get(&crate::inventory::keys::incoming(t, sku_id, reference)).await? else {
        return Ok(());
    };
    let incoming: Incoming = item.parse()?;
    if incoming.status != IncomingStatus::Expected || incoming.expected_at != expected_at {
        return Ok(());
    }
    let next = |market: Option<String>, cursor: Option<String>| TimerTask::RestockIncoming {
        tenant: t.clone(),
        sku_id: sku_id.to_owned(),
        reference: reference.to_owned(),
        expected_at: expected_at.to_owned(),
        market,
        cursor,
    };
    let served = match page.market.as_deref() {
        None => true,
        Some(m) => {
            let locations = crate::inventory::locations::all(deps, t).await?;
            locations.iter().any(|l| l.location_id == incoming.location_id && l.serves(Some(m)))
        }
    };
    if served {
        let pk = keys::waiting_pk(t, sku_id, page.market.as_deref());
        let found =
            deps.table.query(&pk, "", QueryOpts { limit: PAGE, cursor: page.cursor, descending: false }).await?;
        for item in &found.items {
            let entry: WaitingEntry = item.parse()?;
            if entry.notify_incoming {
                tell(deps, t, &incoming, &entry.user_id).await?;
            }
        }
        if let Some(cursor) = found.next_cursor {
            return timer::schedule(deps, deps.clock.now(), next(page.market, Some(cursor))).await;
        }
    }
    let buckets = super::waiting::waiting_buckets(deps, t, sku_id).await?;
    let after = buckets.iter().position(|b| *b == page.market).and_then(|i| buckets.get(i + 1));
    if let Some(market) = after {
        timer::schedule(deps, deps.clock.now(), next(market.clone(), None)).await?;
    }
    Ok(())
}

/// A WAITING subscription that asked is told of the soonest shipment of its SKU on its way.
pub(crate) async fn tell_subscriber(deps: &Deps, t: &TenantId, sub: &Subscription) -> CoreResult<()> {
    if !sub.notify_incoming || sub.status != SubscriptionStatus::Waiting {
        return Ok(());
    }
    let on_the_way = shipments::on_the_way(deps, t, &sub.sku_id).await?;
    let locations = match sub.market {
        Some(_) => crate::inventory::locations::all(deps, t).await?,
        None => Vec::new(),
    };
    // The soonest shipment to a location that serves the subscriber's market (any, for none).
    let serves = |i: &&Incoming| {
        sub.market
            .as_deref()
            .is_none_or(|m| locations.iter().any(|l| l.location_id == i.location_id && l.serves(Some(m))))
    };
    if let Some(soonest) = on_the_way.iter().find(serves) {
        tell(deps, t, soonest, &sub.user_id).await?;
    }
    Ok(())
}

/// The notification of one shipment's date to one user, once per (shipment, date, user).
async fn tell(deps: &Deps, t: &TenantId, incoming: &Incoming, user: &str) -> CoreResult<()> {
    ensure_template(deps, t).await?;
    let basis = format!("{}\n{}\n{}\n{user}", incoming.sku_id, incoming.reference, incoming.expected_at);
    let key = format!("incoming-{}", &hex::encode(Sha256::digest(basis.as_bytes()))[..40]);
    let request = json!({
        "idempotency_key": key,
        "recipients": {"user_ids": [user]},
        "template_id": INCOMING_TEMPLATE,
        "params": {
            "sku_id": incoming.sku_id,
            "expected_at": incoming.expected_at,
            "expected_date": incoming.expected_at.get(..10).unwrap_or_default(),
        },
        "category": "transactional",
        "priority": "normal",
    });
    let request: NotificationRequest = serde_json::from_value(request)?;
    match api::accept(deps, t, request).await {
        Ok(_) => Ok(()),
        // A message that can never be accepted (the tenant's own `restock_incoming` asks for
        // params this one does not give, the user is gone): told to the logs, the others told.
        Err(
            e @ (CoreError::Invalid { .. }
            | CoreError::MissingParam { .. }
            | CoreError::NotFound { .. }
            | CoreError::NotFoundAt { .. }),
        ) => {
            warn!(tenant = %t, sku_id = %incoming.sku_id, user, error = %e, "the expected date cannot be told to this user");
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// The built-in `restock_incoming` template, written for the tenant once (never over theirs).
async fn ensure_template(deps: &Deps, t: &TenantId) -> CoreResult<()> {
    if deps.table.get(&crate::keys::template(t, INCOMING_TEMPLATE)).await?.is_some() {
        return Ok(());
    }
    let en = LocaleContent {
        email_subject: Some("On its way: {{ sku_id }}".into()),
        email_body: Some("{{ sku_id }} is on its way to us, expected on {{ expected_date }}.".into()),
        email_html: None,
        sms: Some("{{ sku_id }} is expected on {{ expected_date }}".into()),
        push_title: Some("On its way".into()),
        push_body: Some("{{ sku_id }}: expected on {{ expected_date }}".into()),
        inapp_title: Some("On its way".into()),
        inapp_body: Some("{{ sku_id }} is expected on {{ expected_date }}".into()),
    };
    let zh = LocaleContent {
        email_subject: Some("补货在途：{{ sku_id }}".into()),
        email_body: Some("您关注的商品 {{ sku_id }} 正在补货途中，预计 {{ expected_date }} 到货。".into()),
        email_html: None,
        sms: Some("您关注的商品 {{ sku_id }} 预计 {{ expected_date }} 到货".into()),
        push_title: Some("补货在途".into()),
        push_body: Some("{{ sku_id }}：预计 {{ expected_date }} 到货".into()),
        inapp_title: Some("补货在途".into()),
        inapp_body: Some("{{ sku_id }} 预计 {{ expected_date }} 到货".into()),
    };
    crate::templates::put_builtin(deps, t, INCOMING_TEMPLATE, en, zh).await
}
