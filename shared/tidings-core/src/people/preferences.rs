//! A user's preferences: global unsubscribe, per category, per channel, quiet hours in the
//! user's own IANA zone (docs/people.md, "Preferences"). Stored next to the user's profile.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, NaiveTime, Utc};
use serde::{Deserialize, Deserializer, Serialize};

use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::ids::{TenantId, check_id};
use crate::keys;
use crate::notify::model::Category;
use crate::people::zones::Zone;
use crate::ports::{Channel, Cond, Item, attrs_of};

/// Quiet hours, `HH:MM` wall-clock times in the user's zone. `start > end` wraps midnight
/// (`22:00`–`08:00`); `start == end` means no quiet hours.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QuietHours {
    pub start: String,
    pub end: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Preferences {
    #[serde(default)]
    pub user_id: String,
    #[serde(default)]
    pub unsubscribe_all: bool,
    /// `false` turns a category off; absent means on.
    #[serde(default)]
    pub categories: BTreeMap<String, bool>,
    /// `false` turns a channel off; absent means on.
    #[serde(default)]
    pub channels: BTreeMap<String, bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quiet_hours: Option<QuietHours>,
    /// Per workflow: `false` turns it off, a map of channels turns those channels off for it;
    /// absent means on (docs/workflows.md, "Preferences").
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub workflows: BTreeMap<String, WorkflowPreference>,
    #[serde(default)]
    pub updated_at: String,
}

/// A user's preference for one workflow: on or off, or on and off per channel.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum WorkflowPreference {
    All(bool),
    Channels(BTreeMap<String, bool>),
}

/// The body of `PUT /v1/users/{id}/preferences`: every field is optional and only the fields
/// given change (`quiet_hours: null` removes the quiet hours).
#[derive(Clone, Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PreferencesInput {
    pub unsubscribe_all: Option<bool>,
    pub categories: Option<BTreeMap<String, bool>>,
    pub channels: Option<BTreeMap<String, bool>>,
    #[serde(default, deserialize_with = "present")]
    pub quiet_hours: Option<Option<QuietHours>>,
    /// `{"comment": {"email": false}, "price_drop": false}`: a workflow off, or off on some
    /// channels; a map given for a workflow changes only the channels it names.
    pub workflows: Option<BTreeMap<String, WorkflowPreference>>,
}

/// Tells "absent" (`None`) from "null" (`Some(None)`).
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

pub const CATEGORIES: [&str; 2] = ["transactional", "marketing"];

fn category_name(c: Category) -> &'static str {
    match c {
        Category::Transactional => "transactional",
        Category::Marketing => "marketing",
    }
}

/// Parses `HH:MM` (24 h).
pub fn parse_hhmm(s: &str) -> Option<NaiveTime> {
    let (h, m) = s.split_once(':')?;
    if h.len() != 2 || m.len() != 2 {
        return None;
    }
    NaiveTime::from_hms_opt(h.parse().ok()?, m.parse().ok()?, 0)
}

impl PreferencesInput {
    fn validate(&self) -> CoreResult<()> {
        for (name, on) in self.categories.iter().flatten() {
            if !CATEGORIES.contains(&name.as_str()) {
                return Err(CoreError::invalid(
                    format!("categories.{name}"),
                    "unknown category (transactional, marketing)",
                ));
            }
            // Password resets, one-time codes and security alerts always go out; a user stops
            // them per channel (`channels`) instead (docs/security.md, "Which preference stops what").
            if name == category_name(Category::Transactional) && !on {
                return Err(CoreError::invalid(
                    "categories.transactional",
                    "transactional messages cannot be turned off; turn a channel off instead",
                ));
            }
        }
        for name in self.channels.iter().flat_map(|m| m.keys()) {
            if Channel::parse(name).is_none() {
                return Err(CoreError::invalid(
                    format!("channels.{name}"),
                    "unknown channel (email, sms, push, inapp)",
                ));
            }
        }
        for (id, pref) in self.workflows.iter().flatten() {
            check_id(&format!("workflows.{id}"), id)?;
            if let WorkflowPreference::Channels(m) = pref {
                for name in m.keys() {
                    if Channel::parse(name).is_none() {
                        return Err(CoreError::invalid(
                            format!("workflows.{id}.{name}"),
                            "unknown channel (email, sms, push, inapp)",
                        ));
                    }
                }
            }
        }
        if let Some(Some(q)) = &self.quiet_hours {
            if parse_hhmm(&q.start).is_none() {
                return Err(CoreError::invalid("quiet_hours.start", "must be HH:MM, e.g. 22:00"));
            }
            if parse_hhmm(&q.end).is_none() {
                return Err(CoreError::invalid("quiet_hours.end", "must be HH:MM, e.g. 08:00"));
            }
        }
        Ok(())
    }
}

impl Preferences {
    pub fn category_on(&self, c: Category) -> bool {
        self.categories.get(category_name(c)).copied().unwrap_or(true)
    }

    pub fn channel_on(&self, c: Channel) -> bool {
        self.channels.get(c.as_str()).copied().unwrap_or(true)
    }

    /// Whether the user takes workflow `id` on channel `c`.
    pub fn workflow_on(&self, id: &str, c: Channel) -> bool {
        match self.workflows.get(id) {
            None => true,
            Some(WorkflowPreference::All(on)) => *on,
            Some(WorkflowPreference::Channels(m)) => m.get(c.as_str()).copied().unwrap_or(true),
        }
    }

    /// When the quiet hours that contain `now` end (in UTC), or `None` when `now` is not in
    /// them. `zone` is the user's IANA zone (UTC when absent or unknown).
    pub fn quiet_until(&self, zone: Option<&str>, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let q = self.quiet_hours.as_ref()?;
        let (start, end) = (parse_hhmm(&q.start)?, parse_hhmm(&q.end)?);
        quiet_window_end(&Zone::of(zone), start, end, now)
    }
}

/// The end of the quiet window `[start, end)` (wall clock in `tz`) containing `now`.
pub fn quiet_window_end(tz: &Zone, start: NaiveTime, end: NaiveTime, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    if start == end {
        return None;
    }
    let local = tz.local(now);
    let (date, time) = (local.date(), local.time());
    let inside = if start < end { time >= start && time < end } else { time >= start || time < end };
    if !inside {
        return None;
    }
    // The window ends today when `end` is still ahead, else tomorrow (wrapping windows).
    let end_date = if time < end { date } else { date.succ_opt()? };
    Some(tz.instant(end_date, end))
}

/// A user's preferences; `updated_at` always an RFC 3339 time (a record written before it was
/// made one, `…Z+`, reads as that time plus a microsecond).
pub async fn get(deps: &Deps, t: &TenantId, user_id: &str) -> CoreResult<Preferences> {
    let mut p = stored(deps, t, user_id).await?;
    if let Some(at) = p.updated_at.ends_with('+').then(|| stamp_of(&p.updated_at)).flatten() {
        p.updated_at = at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    }
    Ok(p)
}

/// The record as stored (its `updated_at` is the optimistic write's condition).
async fn stored(deps: &Deps, t: &TenantId, user_id: &str) -> CoreResult<Preferences> {
    check_id("user_id", user_id)?;
    match deps.table.get(&keys::preferences(t, user_id)).await? {
        Some(item) => Ok(item.parse()?),
        None => Ok(Preferences { user_id: user_id.to_owned(), ..Preferences::default() }),
    }
}

/// The time an `updated_at` stands for: an old `…Z+` stamp is a microsecond past its time.
fn stamp_of(updated_at: &str) -> Option<DateTime<Utc>> {
    let (time, bumped) = match updated_at.strip_suffix('+') {
        Some(time) => (time, true),
        None => (updated_at, false),
    };
    let at = DateTime::parse_from_rfc3339(time).ok()?.with_timezone(&Utc);
    Some(if bumped { at + Duration::microseconds(1) } else { at })
}

/// The `updated_at` of a write replacing one stamped `previous`: `now`, or a microsecond past
/// `previous` when the clock has not moved beyond it (a manual clock, two writes in one
/// microsecond). Always an RFC 3339 time, and never the one it replaces (the next write's
/// condition tells them apart). `previous` may be empty (none) or an old `…Z+` stamp.
fn next_updated_at(now: DateTime<Utc>, previous: &str) -> String {
    // Compared as written: to the microsecond (a clock's nanoseconds would otherwise make a
    // `now` later than `previous` that is written as the same stamp).
    let now = chrono::SubsecRound::trunc_subsecs(now, 6);
    let at = match stamp_of(previous) {
        Some(p) if now <= p => p + Duration::microseconds(1),
        _ => now,
    };
    at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// Merges the given fields into the stored preferences. Optimistic: the write is conditioned on
/// the `updated_at` that was read, and retried once on a race.
pub async fn put(deps: &Deps, t: &TenantId, user_id: &str, input: PreferencesInput) -> CoreResult<Preferences> {
    check_id("user_id", user_id)?;
    input.validate()?;
    for _ in 0..3 {
        let current = stored(deps, t, user_id).await?;
        let cond = if current.updated_at.is_empty() {
            Cond::NotExists
        } else {
            Cond::eq("updated_at", current.updated_at.clone())
        };
        let mut next = current.clone();
        if let Some(v) = input.unsubscribe_all {
            next.unsubscribe_all = v;
        }
        if let Some(m) = &input.categories {
            next.categories.extend(m.iter().map(|(k, v)| (k.clone(), *v)));
        }
        if let Some(m) = &input.channels {
            next.channels.extend(m.iter().map(|(k, v)| (k.clone(), *v)));
        }
        if let Some(q) = &input.quiet_hours {
            next.quiet_hours = q.clone();
        }
        for (id, pref) in input.workflows.iter().flatten() {
            let merged = match (next.workflows.get(id), pref) {
                (Some(WorkflowPreference::Channels(old)), WorkflowPreference::Channels(new)) => {
                    let mut m = old.clone();
                    m.extend(new.iter().map(|(k, v)| (k.clone(), *v)));
                    WorkflowPreference::Channels(m)
                }
                (_, p) => p.clone(),
            };
            next.workflows.insert(id.clone(), merged);
        }
        next.user_id = user_id.to_owned();
        next.updated_at = next_updated_at(deps.clock.now(), &current.updated_at);
        match deps.table.put(Item::new(keys::preferences(t, user_id), attrs_of(&next)?), cond).await {
            Ok(()) => return Ok(next),
            Err(e) if e.is_condition_failed() => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(CoreError::conflict("concurrent_update", "the preferences changed while they were being updated; try again"))
}

/// The user leaves marketing on every channel (`categories.marketing: false`): what the one-click
/// unsubscribe link does (`tracking::unsubscribe`) and what an imported opt-out means
/// (docs/people.md, "Importing users"). `false` when the user had left it already: nothing is
/// written then, so doing it again changes nothing.
pub async fn leave_marketing(deps: &Deps, t: &TenantId, user_id: &str) -> CoreResult<bool> {
    let marketing = category_name(Category::Marketing);
    if !get(deps, t, user_id).await?.category_on(Category::Marketing) {
        return Ok(false);
    }
    let input = PreferencesInput {
        categories: Some([(marketing.to_owned(), false)].into_iter().collect()),
        ..PreferencesInput::default()
    };
    put(deps, t, user_id, input).await?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every stamp is an RFC 3339 time that reads back as itself, and a write under a clock that
    /// stands still (or went back) still gets a stamp later than the one it replaces.
    #[test]
    fn updated_at_is_rfc3339_and_moves_on_even_when_the_clock_does_not() {
        let now = at("2026-11-29T12:00:00Z");
        let parse = |s: &str| DateTime::parse_from_rfc3339(s).unwrap_or_else(|e| panic!("{s:?}: {e}"));
        let first = next_updated_at(now, "");
        assert_eq!(parse(&first), now);
        let mut previous = first;
        for clock in [now, now, now - Duration::seconds(5)] {
            let next = next_updated_at(clock, &previous);
            assert!(parse(&next) > parse(&previous), "{next} after {previous}");
            assert_eq!(parse(&next).to_rfc3339_opts(chrono::SecondsFormat::Micros, true), next, "round trip");
            previous = next;
        }
        // A clock standing still within a microsecond (nanoseconds past the stamp) still moves it.
        let still = parse(&previous).with_timezone(&Utc) + Duration::nanoseconds(300);
        let next = next_updated_at(still, &previous);
        assert!(parse(&next) > parse(&previous), "{next} after {previous}");
        previous = next;
        // A clock that moved on is taken as it is.
        assert_eq!(parse(&next_updated_at(now + Duration::seconds(1), &previous)), now + Duration::seconds(1));
        // A stamp written by the old `…Z+` rule is replaced by a valid, later time.
        let old = format!("{}+", now.to_rfc3339_opts(chrono::SecondsFormat::Micros, true));
        let next = next_updated_at(now, &old);
        assert!(parse(&next) > now && !next.ends_with('+'), "{next}");
    }

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn prefs(start: &str, end: &str) -> Preferences {
        Preferences { quiet_hours: Some(QuietHours { start: start.into(), end: end.into() }), ..Default::default() }
    }

    #[test]
    fn quiet_hours_are_in_the_users_zone_and_wrap_midnight() {
        let p = prefs("22:00", "08:00");
        // 15:00 UTC is 23:00 in Shanghai: quiet until 08:00 Shanghai = 00:00 UTC next day.
        assert_eq!(p.quiet_until(Some("Asia/Shanghai"), at("2026-11-29T15:00:00Z")), Some(at("2026-11-30T00:00:00Z")));
        // 19:00 UTC is 03:00 in Shanghai: the same window.
        assert_eq!(p.quiet_until(Some("Asia/Shanghai"), at("2026-11-29T19:00:00Z")), Some(at("2026-11-30T00:00:00Z")));
        // 15:00 UTC in UTC is not quiet.
        assert_eq!(p.quiet_until(None, at("2026-11-29T15:00:00Z")), None);
        // 08:00 sharp is outside.
        assert_eq!(p.quiet_until(Some("Asia/Shanghai"), at("2026-11-30T00:00:00Z")), None);
    }

    #[test]
    fn quiet_hours_within_a_day_and_across_dst() {
        let p = prefs("12:00", "14:00");
        assert_eq!(p.quiet_until(None, at("2026-11-29T13:30:00Z")), Some(at("2026-11-29T14:00:00Z")));
        // New York, the night clocks go back (2026-11-01): 01:30 EDT is inside 01:00-03:00;
        // the window ends at 03:00 EST = 08:00 UTC.
        let p = prefs("01:00", "03:00");
        assert_eq!(
            p.quiet_until(Some("America/New_York"), at("2026-11-01T05:30:00Z")),
            Some(at("2026-11-01T08:00:00Z"))
        );
    }

    #[test]
    fn input_names_the_bad_field() {
        let bad: PreferencesInput =
            serde_json::from_str(r#"{"quiet_hours": {"start": "25:00", "end": "08:00"}}"#).unwrap();
        match bad.validate() {
            Err(CoreError::Invalid { field, .. }) => assert_eq!(field, "quiet_hours.start"),
            other => panic!("{other:?}"),
        }
        let bad: PreferencesInput = serde_json::from_str(r#"{"channels": {"fax": false}}"#).unwrap();
        assert!(matches!(bad.validate(), Err(CoreError::Invalid { field, .. }) if field == "channels.fax"));
        let cleared: PreferencesInput = serde_json::from_str(r#"{"quiet_hours": null}"#).unwrap();
        assert_eq!(cleared.quiet_hours, Some(None));
        let absent: PreferencesInput = serde_json::from_str(r#"{}"#).unwrap();
        assert_eq!(absent.quiet_hours, None);
    }

    #[test]
    fn the_transactional_category_cannot_be_turned_off() {
        let off: PreferencesInput = serde_json::from_str(r#"{"categories": {"transactional": false}}"#).unwrap();
        assert!(matches!(off.validate(), Err(CoreError::Invalid { field, .. }) if field == "categories.transactional"));
        let on: PreferencesInput =
            serde_json::from_str(r#"{"categories": {"transactional": true, "marketing": false}}"#).unwrap();
        assert!(on.validate().is_ok());
    }
}
