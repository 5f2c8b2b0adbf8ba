//! Whether, and when, one user gets one notification on one channel, in this order
//! (docs/delivery.md, "Orchestrate").
//!
//! 1. global unsubscribe → `unsubscribed` (marketing only)
//! 2. the category turned off → `category_off` (marketing only)
//! 3. the channel available: turned on (`channel_off`), an address or a valid push token
//!    (`no_address`), the address not on the suppression list (`address_suppressed`); an SMS
//!    number in an allowed country (`country_not_allowed`, see [`crate::notify::abuse`])
//! 4. quiet hours in the user's zone: marketing is deferred to the end of the window (never
//!    dropped)
//! 5. the frequency cap: marketing, per user, channel and day in the user's zone, default 3
//!    (`frequency_cap`), counted by a conditional counter item with a TTL that remembers which
//!    notifications it counted, so a repeated orchestration never counts twice.
//!
//! Transactional notifications skip 1 and 2: `unsubscribe_all` and the categories are marketing
//! opt-outs, and a user who left the newsletter still gets the password reset and the security
//! alert. The transactional category cannot be turned off ([`crate::people::preferences`]); a channel
//! the user turned off or has no address for (3) still stops it.
//! Transactional notifications skip 4 and 5 too: a one-time password at 3 a.m. goes at once. Their
//! SMS count against the per-number limits instead (`number_rate_limited`, see
//! [`crate::notify::abuse`]), so skipping the cap does not leave the door open to SMS pumping.
//! In-app messages are silent, so quiet hours and caps do not apply to them either.
//!
//! Other gates (campaign segments, rate limits) belong beside these, as further functions called
//! from the orchestrator's `plan_delivery`.

use chrono::{DateTime, Duration, Utc};

use super::caps::capped_count;
use super::model::{Category, Notification};
use crate::deps::Deps;
use crate::error::CoreResult;
use crate::ids::TenantId;
use crate::keys;
use crate::people::devices::Device;
use crate::people::preferences::Preferences;
use crate::people::suppression;
use crate::people::users::User;
use crate::people::zones::Zone;
use crate::ports::{Channel, Key, Write};

/// Why a delivery was suppressed (the delivery's `reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SuppressReason {
    Unsubscribed,
    CategoryOff,
    ChannelOff,
    NoAddress,
    AddressSuppressed,
    FrequencyCap,
    CountryNotAllowed,
    NumberRateLimited,
    /// The user turned this workflow off (on this channel, or on all).
    WorkflowOff,
}

impl SuppressReason {
    pub fn as_str(self) -> &'static str {
        match self {
            SuppressReason::Unsubscribed => "unsubscribed",
            SuppressReason::CategoryOff => "category_off",
            SuppressReason::ChannelOff => "channel_off",
            SuppressReason::NoAddress => "no_address",
            SuppressReason::AddressSuppressed => "address_suppressed",
            SuppressReason::FrequencyCap => "frequency_cap",
            SuppressReason::CountryNotAllowed => "country_not_allowed",
            SuppressReason::NumberRateLimited => "number_rate_limited",
            SuppressReason::WorkflowOff => "workflow_off",
        }
    }
}

/// Why a delivery waits (the delivery's `reason` meanwhile).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeferReason {
    /// The user's quiet hours (marketing).
    QuietHours,
    /// `local_time`: `send_at`'s wall-clock time has not come yet in the user's zone.
    LocalTime,
}

impl DeferReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DeferReason::QuietHours => "quiet_hours",
            DeferReason::LocalTime => "local_time",
        }
    }
}

/// What to do with one `user × channel`.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Send now. `writes` (for gates that need it) must commit in the same transaction as the
    /// delivery record; one of them failing its condition suppresses the delivery with
    /// [`gate_reason`] of that write.
    Send {
        to: String,
        writes: Vec<Write>,
    },
    Suppress(SuppressReason),
    /// Quiet hours: try again at this time.
    Defer(DateTime<Utc>, DeferReason),
}

/// Everything known about one recipient.
pub struct Recipient<'a> {
    pub user_id: &'a str,
    pub user: Option<&'a User>,
    pub prefs: &'a Preferences,
    pub devices: &'a [Device],
}

impl Recipient<'_> {
    pub fn zone(&self) -> Option<&str> {
        self.user.and_then(|u| u.timezone.as_deref())
    }

    /// The address of a channel. Push sends to every device (the channel worker reads them at
    /// send time), so its address is the user id.
    /// In-app and push need no contact record: the inbox is the user's, and devices are
    /// registered on their own.
    pub fn address(&self, channel: Channel) -> Option<String> {
        match channel {
            Channel::Email => self.user?.email.clone(),
            Channel::Sms => self.user?.phone.clone(),
            Channel::Push => (!self.devices.is_empty()).then(|| self.user_id.to_owned()),
            Channel::Inapp => Some(self.user_id.to_owned()),
        }
    }
}

/// The checks, in the order of the module doc (cheapest opt-outs first, the cap last).
pub async fn check(
    deps: &Deps,
    t: &TenantId,
    n: &Notification,
    r: &Recipient<'_>,
    channel: Channel,
) -> CoreResult<Verdict> {
    let category = n.request.category();
    // A required workflow (OTPs, security notices): no preference stops it, nor quiet hours or
    // the frequency cap; an address and the suppression list still do.
    let required = n.workflow.as_ref().is_some_and(|w| w.required);
    let transactional = category == Category::Transactional || required;
    if !required {
        if !transactional && r.prefs.unsubscribe_all {
            return Ok(Verdict::Suppress(SuppressReason::Unsubscribed));
        }
        // Preferences stored before `transactional` could not be turned off may still say `false`.
        if !transactional && !r.prefs.category_on(category) {
            return Ok(Verdict::Suppress(SuppressReason::CategoryOff));
        }
        if !r.prefs.channel_on(channel) {
            return Ok(Verdict::Suppress(SuppressReason::ChannelOff));
        }
        if let Some(w) = &n.workflow
            && !r.prefs.workflow_on(&w.workflow_id, channel)
        {
            return Ok(Verdict::Suppress(SuppressReason::WorkflowOff));
        }
    }
    let Some(to) = r.address(channel) else {
        return Ok(Verdict::Suppress(SuppressReason::NoAddress));
    };
    if matches!(channel, Channel::Email | Channel::Sms) && suppression::is_suppressed(deps, t, channel, &to).await? {
        return Ok(Verdict::Suppress(SuppressReason::AddressSuppressed));
    }
    if channel == Channel::Sms
        && !deps.config.abuse.allows_country(&to, r.user.and_then(|u| u.phone_country.as_deref()))
    {
        return Ok(Verdict::Suppress(SuppressReason::CountryNotAllowed));
    }
    let now = deps.clock.now();
    // `local_time`: not before `send_at`'s wall-clock time in the user's zone. A campaign's
    // pages are expanded when the earliest zone's time comes; its other members wait here.
    if n.request.local_time
        && let Some(send_at) = n.request.send_at
    {
        let wall = send_at.naive_utc();
        let due = Zone::of(r.zone()).instant(wall.date(), wall.time());
        if due > now {
            return Ok(Verdict::Defer(due, DeferReason::LocalTime));
        }
    }
    if transactional || channel == Channel::Inapp {
        let writes = match channel {
            Channel::Sms => deps.config.abuse.number_writes(t, &n.notification_id, &to, now),
            _ => Vec::new(),
        };
        return Ok(Verdict::Send { to, writes });
    }
    if let Some(until) = r.prefs.quiet_until(r.zone(), now) {
        return Ok(Verdict::Defer(until, DeferReason::QuietHours));
    }
    let cap = deps.config.frequency_cap_of(t.as_str());
    if cap == 0 {
        return Ok(Verdict::Suppress(SuppressReason::FrequencyCap));
    }
    Ok(Verdict::Send { to, writes: vec![cap_write(t, n, r.user_id, r.zone(), channel, now, cap)] })
}

/// Why a delivery is suppressed when `gate`, one of [`Verdict::Send`]'s writes, fails its
/// condition: a per-number SMS limit, else the frequency cap.
pub fn gate_reason(gate: &Write) -> SuppressReason {
    match gate {
        Write::Update { key, .. } if crate::notify::abuse::is_counter(key) => SuppressReason::NumberRateLimited,
        _ => SuppressReason::FrequencyCap,
    }
}

/// The item counting a user's sends on a channel for the day of `now` in the user's zone.
pub fn cap_key(t: &TenantId, user_id: &str, zone: Option<&str>, channel: Channel, now: DateTime<Utc>) -> Key {
    let local_day = Zone::of(zone).local(now).date();
    keys::frequency_counter(t, user_id, &local_day.format("%Y%m%d").to_string(), channel)
}

/// Counts one send against the user's cap for today (in the user's zone), in the same
/// transaction as the delivery's creation: its condition fails when the cap is reached (the
/// delivery is then `frequency_cap`). Atomic, and idempotent per notification: the counter item
/// remembers which notifications it counted, and the delivery is created with the count, so a
/// repeated orchestration (a retried task, a crash) never counts twice. Kept three days by the
/// table's TTL.
pub fn cap_write(
    t: &TenantId,
    n: &Notification,
    user_id: &str,
    zone: Option<&str>,
    channel: Channel,
    now: DateTime<Utc>,
    cap: u32,
) -> Write {
    let key = cap_key(t, user_id, zone, channel, now);
    capped_count(key, cap, Some(&cap_mark(n)), (now + Duration::days(3)).timestamp())
}

/// The attribute of a frequency counter saying it counted `n`.
pub fn cap_mark(n: &Notification) -> String {
    format!("n_{}", n.notification_id)
}
