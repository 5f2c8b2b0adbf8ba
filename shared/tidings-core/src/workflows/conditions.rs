//! Whether a step's `if` (or a branch's) holds for a run: on the params, on the user, or on what
//! an earlier send reached, as the channel worker, the provider receipts, the tracking routes and
//! the inbox recorded it.

use serde_json::Value;

use super::definition::{Condition, Engagement, Reach, UserAttr};
use super::model::Run;
use crate::deps::Deps;
use crate::error::CoreResult;
use crate::ids::TenantId;
use crate::notify::model::{Delivery, DeliveryStatus, Notification};
use crate::people::users::User;
use crate::ports::Channel;

/// What one send of a run reached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reached {
    pub status: Option<DeliveryStatus>,
    pub channel: Option<Channel>,
    /// An in-app message marked read.
    pub read: bool,
}

impl Reached {
    fn at_least(&self, rank: u8) -> bool {
        let inapp = self.channel == Some(Channel::Inapp);
        let r = match self.status {
            Some(DeliveryStatus::Sent) if inapp => 2, // in the inbox: delivered
            Some(DeliveryStatus::Sent) => 1,
            Some(DeliveryStatus::Delivered) => 2,
            Some(DeliveryStatus::Opened) => 3,
            Some(DeliveryStatus::Clicked) => 4,
            _ => 0,
        };
        let r = if inapp && self.read { r.max(3) } else { r };
        r >= rank && rank > 0
    }

    /// Read: an in-app message marked read; another channel's message opened or clicked.
    pub fn is_read(&self) -> bool {
        if self.channel == Some(Channel::Inapp) { self.read } else { self.at_least(3) }
    }

    pub fn reaches(&self, reach: Reach) -> bool {
        match reach {
            Reach::Sent => self.at_least(1),
            Reach::Delivered => self.at_least(2),
            Reach::Opened => self.at_least(3),
            Reach::Clicked => self.at_least(4),
            Reach::Read => self.is_read(),
        }
    }

    pub fn is(&self, e: Engagement) -> bool {
        match e {
            Engagement::Sent => self.at_least(1),
            Engagement::NotSent => !self.at_least(1),
            Engagement::Delivered => self.at_least(2),
            Engagement::NotDelivered => !self.at_least(2),
            Engagement::Opened => self.at_least(3),
            Engagement::NotOpened => !self.at_least(3),
            Engagement::Clicked => self.at_least(4),
            Engagement::NotClicked => !self.at_least(4),
            Engagement::Read => self.is_read(),
            Engagement::NotRead => !self.is_read(),
            Engagement::Failed => matches!(self.status, Some(DeliveryStatus::Failed | DeliveryStatus::Dead)),
            Engagement::Suppressed => self.status == Some(DeliveryStatus::Suppressed),
        }
    }
}

/// What the send of node `step` on `channel` reached for this run's user.
pub async fn reached(
    deps: &Deps,
    t: &TenantId,
    n: &Notification,
    user_id: &str,
    step: u32,
    channel: Channel,
) -> CoreResult<Reached> {
    let key = crate::keys::delivery_at(t, &n.notification_id, user_id, channel, Some(step));
    let status = match deps.table.get(&key).await? {
        Some(item) => Some(item.parse::<Delivery>()?.status),
        None => None,
    };
    let mut read = false;
    if channel == Channel::Inapp && status == Some(DeliveryStatus::Sent) {
        let id = crate::inbox::message_id_at(n, Some(step));
        if let Some(item) = deps.table.get(&crate::keys::inbox_message(t, user_id, &id)).await? {
            read = item.attrs.get("read").and_then(Value::as_bool).unwrap_or(false);
        }
    }
    Ok(Reached { status, channel: Some(channel), read })
}

/// Whether `c` holds for the run.
pub async fn holds(
    deps: &Deps,
    t: &TenantId,
    n: &Notification,
    run: &Run,
    user: Option<&User>,
    c: &Condition,
) -> CoreResult<bool> {
    if let (Some(step), Some(is)) = (c.step, c.is) {
        // The channel the step last used (a fallback's last tried); none: never sent.
        let Some(channel) = run.channel_of(step) else { return Ok(Reached::default().is(is)) };
        let r = reached(deps, t, n, &run.user_id, step, channel).await?;
        return Ok(r.is(is));
    }
    if let Some(path) = &c.param {
        let value = path.split('.').try_fold(&run.params, |v, part| v.get(part));
        return Ok(compare(value, c));
    }
    if let Some(attr) = c.user {
        let values: Vec<Value> = match (attr, user) {
            (_, None) => Vec::new(),
            (UserAttr::Locale, Some(u)) => u.locale.iter().map(|s| Value::from(s.as_str())).collect(),
            (UserAttr::Timezone, Some(u)) => u.timezone.iter().map(|s| Value::from(s.as_str())).collect(),
            (UserAttr::Tags, Some(u)) => u.tags.iter().map(|s| Value::from(s.as_str())).collect(),
        };
        return Ok(values.iter().any(|v| compare(Some(v), c)));
    }
    Ok(false)
}

fn compare(value: Option<&Value>, c: &Condition) -> bool {
    let Some(value) = value else { return false };
    if let Some(eq) = &c.eq {
        return loosely_equal(value, eq);
    }
    if let Some(list) = &c.any_of {
        return list.iter().any(|v| loosely_equal(value, v));
    }
    let Some(x) = number(value) else { return false };
    if let Some(gte) = c.gte {
        return x >= gte;
    }
    if let Some(lte) = c.lte {
        return x <= lte;
    }
    false
}

/// Numbers compare as numbers (`100` equals `100.0` and `"100"`), the rest as JSON.
fn loosely_equal(a: &Value, b: &Value) -> bool {
    match (number(a), number(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

fn number(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn engagement_reads_the_ladder_of_a_send() {
        let email = |s| Reached { status: Some(s), channel: Some(Channel::Email), read: false };
        assert!(email(DeliveryStatus::Delivered).is(Engagement::Delivered));
        assert!(email(DeliveryStatus::Delivered).is(Engagement::NotRead));
        assert!(email(DeliveryStatus::Opened).is(Engagement::Read));
        assert!(!email(DeliveryStatus::Pending).is(Engagement::Sent));
        assert!(email(DeliveryStatus::Dead).is(Engagement::Failed));
        let inapp = |read| Reached { status: Some(DeliveryStatus::Sent), channel: Some(Channel::Inapp), read };
        assert!(inapp(false).is(Engagement::Delivered));
        assert!(inapp(false).is(Engagement::NotRead));
        assert!(inapp(true).is(Engagement::Read));
        assert!(Reached::default().is(Engagement::NotRead));
        assert!(!Reached::default().is(Engagement::Sent));
    }

    #[test]
    fn params_compare_as_numbers_where_they_are() {
        let c = |v: Value| serde_json::from_value::<Condition>(v).unwrap_or_default();
        assert!(compare(Some(&json!(120)), &c(json!({"param": "total", "gte": 100}))));
        assert!(compare(Some(&json!("100")), &c(json!({"param": "total", "eq": 100}))));
        assert!(!compare(Some(&json!(99.5)), &c(json!({"param": "total", "gte": 100}))));
        assert!(compare(Some(&json!("vip")), &c(json!({"param": "tier", "in": ["gold", "vip"]}))));
        assert!(!compare(None, &c(json!({"param": "total", "lte": 100}))));
    }
}
