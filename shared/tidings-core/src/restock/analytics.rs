//! What back-in-stock alerts earn (docs/restock.md, "What alerts earn"): per SKU, how many wait,
//! how many were notified, how many clicked, how many orders followed within 7 days of the
//! notice, their revenue, and the median minutes from notice to order.
//!
//! Nothing here is on the order's hot path. The figures are kept where the facts are written:
//! - **waiting**: a counter in shards ([`keys::waiting_shard`]), +1 in the subscribe
//!   transaction and -1 in every transaction that moves a subscription out of WAITING
//!   ([`super::subscriptions::leave_waiting_writes`]), so it is exact;
//! - **notified**: +1 on the SKU's day bucket ([`keys::day_bucket`]) in the claim's
//!   transaction (the one that marks the subscription NOTIFIED and writes the notice);
//! - **clicked**: +1 on the click's day bucket with a marker put only if absent, in one
//!   transaction, the first time a user clicks a tracked link of a restock message (once per
//!   message, user and SKU: [`on_click`]);
//! - **ordered**: when an order is paid ([`on_paid`]): for each of its SKUs the buyer was
//!   notified about at most 7 days before the order was **placed** (never after it), one
//!   attribution record keyed by (SKU, order), put only if absent, so a pay retried or repeated
//!   counts once. Revenue and the median are computed from these records when read.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::json;
use tracing::warn;

use super::keys;
use super::model::{RESTOCK_TEMPLATE, Subscription};
use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::ids::{TenantId, check_id};
use crate::money::Amount;
use crate::notify::model::Notification;
use crate::ports::{Cond, Item, QueryOpts, StoreError, Update, Write, attrs_of};

/// An order counts for a notice when it was placed at most this long after it.
pub const ATTRIBUTION_WINDOW_MS: i64 = 7 * 24 * 3600 * 1000;
/// The most attribution records one SKU's figures read (past it the figures say `truncated`).
pub const MAX_ATTRIBUTIONS_READ: usize = 10_000;
/// The most SKUs in one page of the list.
pub const MAX_SKUS_PER_PAGE: usize = 100;
/// The most of a buyer's subscriptions read to attribute one order (newest first).
const MAX_SUBSCRIPTIONS_READ: usize = 1_000;
/// The most SKUs of one restock message a click is counted for.
const MAX_CLICK_SKUS: usize = 100;

/// The write that moves a SKU's WAITING count by `delta` (in the shard of `user`).
pub(crate) fn waiting_write(t: &TenantId, sku: &str, user: &str, delta: i64) -> Write {
    Write::Update {
        key: keys::waiting_shard(t, sku, user),
        updates: vec![Update::add("waiting", delta)],
        cond: Cond::Always,
    }
}

/// The write that adds one to `counter` (`notified`, `clicked`) of the SKU's day of `ms`.
pub(crate) fn day_write(t: &TenantId, sku: &str, ms: i64, counter: &str) -> Write {
    Write::Update { key: keys::day_bucket(t, sku, ms), updates: vec![Update::add(counter, 1)], cond: Cond::Always }
}

/// One order attributed to an alert about one of its SKUs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Attribution {
    pub sku_id: String,
    pub order_id: String,
    pub qty: i64,
    /// `qty × unit_price` as an exact decimal; absent when the line had no price.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revenue: Option<String>,
    pub order_created_ms: i64,
    pub notified_ms: i64,
    /// The subscription whose notice the order follows.
    pub subscription_id: String,
}

/// A line of a paid order, as attribution reads it.
#[derive(Clone, Debug)]
pub struct PaidLine<'a> {
    pub sku_id: &'a str,
    pub qty: i64,
    pub unit_price: Option<&'a str>,
}

/// A paid order, as attribution reads it.
#[derive(Clone, Debug)]
pub struct PaidOrder<'a> {
    pub order_id: &'a str,
    pub user_id: &'a str,
    /// When it was placed (RFC 3339): the 7 days are counted to this, not to the payment.
    pub created_at: &'a str,
    pub lines: Vec<PaidLine<'a>>,
}

fn parse_ms(text: &str) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(text).ok().map(|d| d.timestamp_millis())
}

/// Attributes a paid order to the alerts that preceded it: for each SKU of the order, the
/// buyer's latest notice about it at most 7 days before the order was placed. Returns how many
/// records this call wrote (0 when they were all there already). Safe to call any number of
/// times.
pub async fn on_paid(deps: &Deps, t: &TenantId, order: &PaidOrder<'_>) -> CoreResult<usize> {
    let Some(created_ms) = parse_ms(order.created_at) else { return Ok(0) };
    let wanted: BTreeSet<&str> = order.lines.iter().map(|l| l.sku_id).collect();
    // Subscriptions are listed newest first; one notified in the window was WAITING at most
    // `max_age` before its notice, so older ones cannot count.
    let max_age_ms = i64::try_from(deps.config.restock.max_age.as_millis()).unwrap_or(i64::MAX / 4);
    let oldest_ms = created_ms.saturating_sub(ATTRIBUTION_WINDOW_MS).saturating_sub(max_age_ms);
    let mut best: BTreeMap<String, (i64, String)> = BTreeMap::new();
    let mut cursor = None;
    let mut read = 0;
    'pages: loop {
        let page = deps
            .table
            .query(
                &keys::user_subscriptions_pk(t, order.user_id),
                "",
                QueryOpts { limit: 100, cursor, descending: true },
            )
            .await?;
        for item in &page.items {
            read += 1;
            let sub: Subscription = item.parse()?;
            if sub.created_ms < oldest_ms {
                break 'pages;
            }
            if !wanted.contains(sub.sku_id.as_str()) {
                continue;
            }
            // Notified (and perhaps cancelled since: the alert went out all the same).
            let Some(notified_ms) = sub.notified_at.as_deref().and_then(parse_ms) else { continue };
            if notified_ms > created_ms || created_ms - notified_ms > ATTRIBUTION_WINDOW_MS {
                continue;
            }
            let slot = best.entry(sub.sku_id.clone()).or_insert((i64::MIN, String::new()));
            if notified_ms > slot.0 {
                *slot = (notified_ms, sub.subscription_id.clone());
            }
        }
        cursor = page.next_cursor;
        if cursor.is_none() || read >= MAX_SUBSCRIPTIONS_READ {
            break;
        }
    }
    let mut written = 0;
    for line in &order.lines {
        let Some((notified_ms, subscription_id)) = best.get(line.sku_id) else { continue };
        let revenue = match line.unit_price {
            Some(p) => Some(Amount::parse("unit_price", p)?.times(line.qty).to_string()),
            None => None,
        };
        let record = Attribution {
            sku_id: line.sku_id.to_owned(),
            order_id: order.order_id.to_owned(),
            qty: line.qty,
            revenue,
            order_created_ms: created_ms,
            notified_ms: *notified_ms,
            subscription_id: subscription_id.clone(),
        };
        let key = keys::attribution(t, line.sku_id, created_ms, order.order_id);
        match deps.table.put(Item::new(key, attrs_of(&record)?), Cond::NotExists).await {
            Ok(()) => written += 1,
            Err(StoreError::ConditionFailed { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(written)
}

/// Counts a click on a tracked link of a restock message for each SKU it lists, once per
/// (message, user, SKU). Other notifications' clicks are not counted here.
pub async fn on_click(deps: &Deps, t: &TenantId, notification_id: &str, user: &str, at_ms: i64) -> CoreResult<()> {
    let Some(item) = deps.table.get(&crate::keys::notification(t, notification_id)).await? else { return Ok(()) };
    let n: Notification = item.parse()?;
    if n.request.template_id != RESTOCK_TEMPLATE {
        return Ok(());
    }
    let skus = n.request.params.get("sku_ids").and_then(|v| v.as_array()).cloned().unwrap_or_default();
    for sku in skus.iter().filter_map(|v| v.as_str()).take(MAX_CLICK_SKUS) {
        let marker = Item::new(keys::click_marker(t, notification_id, sku, user), {
            let mut m = serde_json::Map::new();
            m.insert("at_ms".into(), json!(at_ms));
            m
        });
        let writes = vec![Write::Put { item: marker, cond: Cond::NotExists }, day_write(t, sku, at_ms, "clicked")];
        match deps.table.transact(writes).await {
            Ok(()) | Err(StoreError::ConditionFailed { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// [`on_paid`] after a payment committed: a failure is logged, not returned (the payment
/// stands); paying the order again (409) attributes it then.
pub async fn on_paid_logged(deps: &Deps, t: &TenantId, order: &PaidOrder<'_>) {
    if let Err(e) = on_paid(deps, t, order).await {
        warn!(tenant = %t, order_id = order.order_id, error = %e, "restock attribution not written; paying again writes it");
    }
}

/// One SKU's figures (`GET /v1/restock/analytics`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SkuEarnings {
    pub sku_id: String,
    /// WAITING subscriptions now (`since` does not apply).
    pub waiting: i64,
    /// Notices written (subscriptions marked NOTIFIED).
    pub notified: i64,
    /// Clicks on a tracked link of a restock message listing the SKU, once per message and user.
    pub clicked: i64,
    /// Paid orders of the SKU placed by a notified user at most 7 days after the notice.
    pub ordered: i64,
    /// Units in those orders.
    pub units: i64,
    /// Their revenue (`qty × unit_price` summed exactly; lines without a price add nothing).
    pub revenue: String,
    /// Median minutes from the notice to the order (`null` with no order).
    pub median_minutes_to_order: Option<f64>,
    /// Notices sent per order (`null` with no order): what one order costs in alerts.
    pub notices_per_order: Option<f64>,
    /// More than [`MAX_ATTRIBUTIONS_READ`] orders: `ordered`, `units`, `revenue` and the median
    /// cover the first ones from `from` only.
    pub truncated: bool,
}

/// A page of SKUs' figures.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EarningsPage {
    /// The start of the UTC day of `since` (the figures are kept per day); absent: all time.
    pub from: Option<String>,
    pub items: Vec<SkuEarnings>,
    pub next_cursor: Option<String>,
}

/// The figures of one SKU (`sku_id`), or of a page of the SKUs that ever had subscribers.
pub async fn analytics(
    deps: &Deps,
    t: &TenantId,
    sku_id: Option<&str>,
    since: Option<&str>,
    limit: usize,
    cursor: Option<String>,
) -> CoreResult<EarningsPage> {
    let from_ms = match since {
        None => None,
        Some(text) => {
            let at = chrono::DateTime::parse_from_rfc3339(text)
                .map_err(|_| CoreError::invalid("since", "must be an RFC 3339 time (2026-12-01T00:00:00Z)"))?;
            let day = at.with_timezone(&chrono::Utc).date_naive();
            Some(day.and_hms_opt(0, 0, 0).unwrap_or_default().and_utc().timestamp_millis())
        }
    };
    let from = from_ms
        .and_then(chrono::DateTime::<chrono::Utc>::from_timestamp_millis)
        .map(|d| d.to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
    if !(1..=MAX_SKUS_PER_PAGE).contains(&limit) {
        return Err(CoreError::invalid("limit", format!("must be 1 to {MAX_SKUS_PER_PAGE}")));
    }
    if let Some(sku) = sku_id {
        check_id("sku_id", sku)?;
        let one = sku_earnings(deps, t, sku, from_ms).await?;
        return Ok(EarningsPage { from, items: vec![one], next_cursor: None });
    }
    let page = deps
        .table
        .query(&keys::watched_pk(t), "", QueryOpts { limit, cursor, descending: false })
        .await
        .map_err(CoreError::of_page_query)?;
    let mut items = Vec::with_capacity(page.items.len());
    for item in &page.items {
        items.push(sku_earnings(deps, t, &item.key.sk, from_ms).await?);
    }
    Ok(EarningsPage { from, items, next_cursor: page.next_cursor })
}

/// Every item of a partition between two sort keys, at most `max` (and whether there were more).
async fn read_range(deps: &Deps, pk: &str, from: &str, to: &str, max: usize) -> CoreResult<(Vec<Item>, bool)> {
    let mut out = Vec::new();
    let mut cursor = None;
    loop {
        let page = deps
            .table
            .query_range(pk, from, to, QueryOpts { limit: 100.min(max + 1 - out.len()), cursor, descending: false })
            .await?;
        out.extend(page.items);
        if out.len() > max {
            out.truncate(max);
            return Ok((out, true));
        }
        cursor = page.next_cursor;
        if cursor.is_none() {
            return Ok((out, false));
        }
    }
}

async fn sku_earnings(deps: &Deps, t: &TenantId, sku: &str, from_ms: Option<i64>) -> CoreResult<SkuEarnings> {
    let stats = keys::stats_pk(t, sku);
    let shards = deps
        .table
        .query(&stats, keys::WAITING_SHARD_PREFIX, QueryOpts { limit: 100, cursor: None, descending: false })
        .await?;
    // Subscriptions made before the count existed leave it below zero when they leave WAITING.
    let waiting = shards.items.iter().filter_map(|i| i.i64("waiting")).sum::<i64>().max(0);
    let first_day = from_ms.map_or_else(|| keys::DAY_PREFIX.to_owned(), keys::day_sk);
    let (days, _) = read_range(deps, &stats, &first_day, &format!("{}~", keys::DAY_PREFIX), usize::MAX - 1).await?;
    let notified = days.iter().filter_map(|i| i.i64("notified")).sum();
    let clicked = days.iter().filter_map(|i| i.i64("clicked")).sum();
    let (records, truncated) = read_range(
        deps,
        &keys::attribution_pk(t, sku),
        &keys::attribution_sort(from_ms.unwrap_or(0)),
        "~",
        MAX_ATTRIBUTIONS_READ,
    )
    .await?;
    let mut revenue = Amount::ZERO;
    let mut units = 0i64;
    let mut delays = Vec::with_capacity(records.len());
    for item in &records {
        let a: Attribution = item.parse()?;
        units = units.saturating_add(a.qty);
        if let Some(r) = a.revenue.as_deref().and_then(Amount::read) {
            revenue = revenue.plus(r);
        }
        delays.push(a.order_created_ms.saturating_sub(a.notified_ms));
    }
    let ordered = i64::try_from(records.len()).unwrap_or(i64::MAX);
    Ok(SkuEarnings {
        sku_id: sku.to_owned(),
        waiting,
        notified,
        clicked,
        ordered,
        units,
        revenue: revenue.to_string(),
        median_minutes_to_order: median_ms(&mut delays).map(|ms| round2(ms / 60_000.0)),
        notices_per_order: (ordered > 0).then(|| round2(notified as f64 / ordered as f64)),
        truncated,
    })
}

/// The median of the samples in milliseconds (the mean of the middle two for an even count).
pub fn median_ms(samples: &mut [i64]) -> Option<f64> {
    if samples.is_empty() {
        return None;
    }
    samples.sort_unstable();
    let mid = samples.len() / 2;
    Some(if samples.len() % 2 == 1 {
        samples[mid] as f64
    } else {
        (i128::from(samples[mid - 1]) + i128::from(samples[mid])) as f64 / 2.0
    })
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_median_of_an_odd_count_is_the_middle_and_of_an_even_one_the_mean_of_the_two() {
        assert_eq!(median_ms(&mut []), None);
        assert_eq!(median_ms(&mut [30, 10, 20]), Some(20.0));
        assert_eq!(median_ms(&mut [30, 10, 20, 45]), Some(25.0));
        assert_eq!(median_ms(&mut [7]), Some(7.0));
    }
}
