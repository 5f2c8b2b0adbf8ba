//! How many one-time codes were used (docs/gates.md, "Abuse guard": watch the share of codes sent
//! that nobody verifies — the mark of SMS pumping, where a script asks for codes nobody reads).
//!
//! A notification accepted with a `requester` is user-triggered: its template's count of
//! `accepted` for the hour goes up in the accept transaction. When the shop's user enters the
//! code, the shop calls `POST /v1/notifications/{id}/verified`: the notification gets
//! `verified_at` (once: repeats answer the same time) and the same hour's `verified` count goes
//! up in the same transaction. `GET /v1/ops/verification?template_id=` shows both per hour and
//! their ratio; a ratio that falls is someone requesting codes that nobody uses.
//!
//! Every accept of a template's codes counts in that template's hour: one item would be written
//! by every concurrent accept transaction, and DynamoDB refuses a transaction whose item another
//! one holds at that moment (a transaction conflict). So an hour is counted over
//! [`COUNTER_SHARDS`] items, the notification's id choosing one, and read as their sum: the
//! count stays exact and in the accept's own transaction, and concurrent accepts of one
//! template rarely meet on an item (those that do are retried by the store adapter).

use chrono::{DateTime, Duration, Utc};
use serde::Serialize;

use super::model::Notification;
use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::ids::{TenantId, check_id};
use crate::keys;
use crate::ports::{Cond, Key, QueryOpts, StoreError, Update, Write};

/// How long hourly counts are kept (table TTL).
const KEEP_DAYS: i64 = 35;

/// The most hours `stats` reports.
pub const MAX_HOURS: u32 = 24 * 7;

/// Items each hour's counts are spread over.
pub const COUNTER_SHARDS: u32 = 16;

fn hour_of(at: DateTime<Utc>) -> String {
    at.format("%Y%m%d%H").to_string()
}

/// A stable shard of a notification id (FNV-1a), so its `verified` lands beside its `accepted`.
fn shard_of(notification_id: &str) -> u32 {
    keys::stable_shard(notification_id, COUNTER_SHARDS)
}

fn hour_key(t: &TenantId, template_id: &str, at: DateTime<Utc>, notification_id: &str) -> Key {
    keys::verification_hour(t, template_id, &hour_of(at), shard_of(notification_id))
}

fn count(key: Key, what: &str, at: DateTime<Utc>) -> Write {
    let ttl = (at + Duration::days(KEEP_DAYS)).timestamp();
    Write::Update { key, updates: vec![Update::add(what, 1), Update::set("ttl", ttl)], cond: Cond::Always }
}

/// The write counting one user-triggered notification of `template_id` accepted at `at` (part
/// of the accept transaction).
pub fn accepted_write(t: &TenantId, template_id: &str, at: DateTime<Utc>, notification_id: &str) -> Write {
    count(hour_key(t, template_id, at, notification_id), "accepted", at)
}

/// The answer to `POST /v1/notifications/{id}/verified`.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Verified {
    pub notification_id: String,
    /// When it was first reported verified (repeats answer the same time).
    pub verified_at: String,
}

/// Marks a notification verified (its code was used); counted once, in the hour it was
/// accepted, when it was user-triggered. `None`: no such notification for this tenant.
pub async fn verify(deps: &Deps, t: &TenantId, id: &str) -> CoreResult<Option<Verified>> {
    check_id("notification_id", id)?;
    let key = keys::notification(t, id);
    let Some(item) = deps.table.get(&key).await? else { return Ok(None) };
    let n: Notification = item.parse()?;
    if let Some(at) = n.verified_at {
        return Ok(Some(Verified { notification_id: n.notification_id, verified_at: at }));
    }
    let now = deps.clock.now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let mut writes = vec![Write::Update {
        key: key.clone(),
        updates: vec![Update::set("verified_at", now.clone())],
        cond: Cond::And(vec![Cond::Exists, Cond::AttrNotExists("verified_at".into())]),
    }];
    if n.user_triggered {
        let accepted_at = DateTime::from_timestamp_millis(n.created_ms).unwrap_or_else(|| deps.clock.now());
        writes.push(count(hour_key(t, n.request.sends_what(), accepted_at, id), "verified", accepted_at));
    }
    match deps.table.transact(writes).await {
        Ok(()) => Ok(Some(Verified { notification_id: n.notification_id, verified_at: now })),
        // Verified meanwhile by a concurrent call: its time stands.
        Err(StoreError::ConditionFailed { .. }) => {
            let current: Option<Notification> = match deps.table.get(&key).await? {
                Some(item) => Some(item.parse()?),
                None => None,
            };
            Ok(current
                .and_then(|n| n.verified_at.map(|at| Verified { notification_id: n.notification_id, verified_at: at })))
        }
        Err(e) => Err(e.into()),
    }
}

/// One hour of a template's user-triggered notifications.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct HourStats {
    /// The hour's start (UTC).
    pub hour: String,
    pub accepted: u64,
    pub verified: u64,
    /// `verified / accepted`; absent when nothing was accepted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
}

/// `GET /v1/ops/verification`.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct VerificationStats {
    pub template_id: String,
    /// The last hours that had any, newest first.
    pub hours: Vec<HourStats>,
    /// Over all of `hours`.
    pub accepted: u64,
    pub verified: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
}

fn ratio(verified: u64, accepted: u64) -> Option<f64> {
    (accepted > 0).then(|| verified as f64 / accepted as f64)
}

/// The counts of the last `hours` hours (1 to [`MAX_HOURS`]) of `template_id`.
pub async fn stats(deps: &Deps, t: &TenantId, template_id: &str, hours: u32) -> CoreResult<VerificationStats> {
    check_id("template_id", template_id)?;
    if !(1..=MAX_HOURS).contains(&hours) {
        return Err(CoreError::invalid("hours", format!("must be 1 to {MAX_HOURS}")));
    }
    let since = hour_of(deps.clock.now() - Duration::hours(i64::from(hours) - 1));
    // Newest first, the shards of an hour side by side: summed per hour until an hour before
    // `since` (or the partition's end).
    let mut sums: Vec<(String, u64, u64)> = Vec::new();
    let mut cursor = None;
    'pages: loop {
        let opts = QueryOpts { limit: 1000, cursor, descending: true };
        let page =
            deps.table.query(&keys::verification_pk(t, template_id), keys::VERIFICATION_HOUR_PREFIX, opts).await?;
        for item in &page.items {
            let Some(rest) = item.key.sk.strip_prefix(keys::VERIFICATION_HOUR_PREFIX) else { continue };
            let hour = rest.split('#').next().unwrap_or(rest);
            if hour < since.as_str() {
                break 'pages;
            }
            let accepted = item.i64("accepted").unwrap_or(0).max(0) as u64;
            let verified = item.i64("verified").unwrap_or(0).max(0) as u64;
            match sums.last_mut() {
                Some((h, a, v)) if h == hour => {
                    *a += accepted;
                    *v += verified;
                }
                _ => sums.push((hour.to_owned(), accepted, verified)),
            }
        }
        cursor = page.next_cursor;
        if cursor.is_none() {
            break;
        }
    }
    let mut out = VerificationStats {
        template_id: template_id.to_owned(),
        hours: Vec::new(),
        accepted: 0,
        verified: 0,
        ratio: None,
    };
    for (hour, accepted, verified) in sums {
        let start = chrono::NaiveDateTime::parse_from_str(&format!("{hour}0000"), "%Y%m%d%H%M%S")
            .map(|d| d.and_utc().to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
            .unwrap_or_else(|_| hour.clone());
        out.accepted += accepted;
        out.verified += verified;
        out.hours.push(HourStats { hour: start, accepted, verified, ratio: ratio(verified, accepted) });
    }
    out.ratio = ratio(out.verified, out.accepted);
    Ok(out)
}
