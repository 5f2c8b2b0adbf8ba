//! The SMS pumping guard (seed 004 §5.4: skipping the frequency cap is not the same as leaving
//! the door open). Transactional SMS — one-time passwords above all — skip quiet hours and the
//! user's frequency cap, so the numbers they go to are guarded instead:
//!
//! - **countries**: `TIDINGS_SMS_COUNTRIES="+86,+1,+44"` lists the E.164 prefixes SMS may go to
//!   (any category). Another number is `suppressed` with reason `country_not_allowed`, so a
//!   script requesting codes for premium-rate ranges abroad earns nothing. Empty: all.
//! - **per-number limits**: `TIDINGS_SMS_NUMBER_LIMITS="5/1h,10/1d"` caps transactional SMS to
//!   one number per fixed window (`s`, `m`, `h`, `d`). Beyond it the delivery is `suppressed`
//!   with reason `number_rate_limited`. Each window is a counter item, counted in the same
//!   transaction as the delivery's creation with a condition (atomic under any concurrency)
//!   and a mark of the notification (a repeated orchestration never counts twice), like the
//!   marketing frequency cap. The number is hashed in the key: no phone number in a key.
//!
//! Limits per requester (IP, device) belong to the shop's endpoint that asks for the code,
//! which knows them; Tidings guards what it alone sees, the destination.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};

use crate::ids::TenantId;
use crate::ports::{Cond, Key, Update, Write};

/// The prefix of a per-number counter's sort key.
pub const COUNTER_SK_PREFIX: &str = "SMSLIM#";

/// At most `count` SMS to one number per `window`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    pub count: u32,
    pub window: Duration,
}

/// The guard's configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SmsGuard {
    /// E.164 prefixes SMS may go to (`+86`, `+1`); empty: every number.
    pub countries: Vec<String>,
    /// Per-number limits on transactional SMS; empty: none.
    pub limits: Vec<Limit>,
}

impl SmsGuard {
    /// Reads `TIDINGS_SMS_COUNTRIES` and `TIDINGS_SMS_NUMBER_LIMITS`.
    pub fn from_env() -> Result<Self, String> {
        let countries = std::env::var("TIDINGS_SMS_COUNTRIES").unwrap_or_default();
        let limits = std::env::var("TIDINGS_SMS_NUMBER_LIMITS").unwrap_or_default();
        Self::parse(&countries, &limits)
    }

    /// Parses the two settings; a malformed entry is an error naming it.
    pub fn parse(countries: &str, limits: &str) -> Result<Self, String> {
        let mut guard = SmsGuard::default();
        for prefix in countries.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let digits = prefix.strip_prefix('+').unwrap_or("");
            if digits.is_empty() || digits.len() > 6 || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!("TIDINGS_SMS_COUNTRIES: {prefix:?} is not an E.164 prefix such as +86"));
            }
            guard.countries.push(prefix.to_owned());
        }
        for entry in limits.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            guard.limits.push(parse_limit(entry).ok_or_else(|| {
                format!("TIDINGS_SMS_NUMBER_LIMITS: {entry:?} is not count/window, such as 5/1h or 10/1d")
            })?);
        }
        Ok(guard)
    }

    /// Whether an SMS may go to `number` at all.
    pub fn allows_country(&self, number: &str) -> bool {
        self.countries.is_empty() || self.countries.iter().any(|p| number.starts_with(p.as_str()))
    }

    /// The counter writes that count one transactional SMS of `notification_id` to `number`
    /// against every limit; each fails its condition when its window is full.
    pub fn writes(&self, t: &TenantId, notification_id: &str, number: &str, now: DateTime<Utc>) -> Vec<Write> {
        let hash = hex::encode(&Sha256::digest(number.as_bytes())[..12]);
        let mark = format!("n_{notification_id}");
        self.limits
            .iter()
            .map(|limit| {
                let window_s = limit.window.as_secs().max(1) as i64;
                let index = now.timestamp().div_euclid(window_s);
                let key = Key::new(format!("T#{t}#SMS#{hash}"), format!("{COUNTER_SK_PREFIX}{window_s}#{index}"));
                // Kept a day past its window by the table's TTL.
                let ttl = (index + 1) * window_s + 86_400;
                let cond = Cond::And(vec![
                    Cond::Or(vec![Cond::AttrNotExists("count".into()), Cond::lt("count", i64::from(limit.count))]),
                    Cond::AttrNotExists(mark.clone()),
                ]);
                let updates = vec![Update::add("count", 1), Update::set(&mark, true), Update::set("ttl", ttl)];
                Write::Update { key, updates, cond }
            })
            .collect()
    }
}

/// Whether `key` is a per-number counter (a gate write's failure then means
/// `number_rate_limited`).
pub fn is_counter(key: &Key) -> bool {
    key.sk.starts_with(COUNTER_SK_PREFIX)
}

fn parse_limit(entry: &str) -> Option<Limit> {
    let (count, window) = entry.split_once('/')?;
    let count: u32 = count.trim().parse().ok().filter(|c| *c > 0)?;
    let window = window.trim();
    let split = window.find(|c: char| !c.is_ascii_digit()).unwrap_or(window.len());
    let (n, unit) = window.split_at(split);
    let n: u64 = if n.is_empty() { 1 } else { n.parse().ok()? };
    let secs = match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86_400,
        _ => return None,
    };
    (secs > 0).then_some(Limit { count, window: Duration::from_secs(secs) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_countries_and_limits() {
        let g = SmsGuard::parse(" +86, +1 ", "5/1h, 10/1d,3/90s,2/m").unwrap();
        assert_eq!(g.countries, vec!["+86", "+1"]);
        let secs: Vec<(u32, u64)> = g.limits.iter().map(|l| (l.count, l.window.as_secs())).collect();
        assert_eq!(secs, vec![(5, 3600), (10, 86_400), (3, 90), (2, 60)]);
        assert_eq!(SmsGuard::parse("", "").unwrap(), SmsGuard::default());
    }

    #[test]
    fn refuses_malformed_entries_by_name() {
        for (countries, limits, named) in [
            ("86", "", "\"86\""),
            ("+8a", "", "\"+8a\""),
            ("", "x/1h", "\"x/1h\""),
            ("", "5/1w", "\"5/1w\""),
            ("", "0/1h", "\"0/1h\""),
        ] {
            let e = SmsGuard::parse(countries, limits).unwrap_err();
            assert!(e.contains(named), "{e}");
        }
    }

    #[test]
    fn countries_are_prefixes_and_empty_allows_all() {
        let g = SmsGuard::parse("+86,+1", "").unwrap();
        assert!(g.allows_country("+8613800001234"));
        assert!(g.allows_country("+14155550100"));
        assert!(!g.allows_country("+88212345678"));
        assert!(SmsGuard::default().allows_country("+88212345678"));
    }

    #[test]
    fn one_counter_per_limit_in_the_current_window_without_the_number() {
        let g = SmsGuard::parse("", "5/1h,10/1d").unwrap();
        let t = TenantId::parse("shop").unwrap();
        let now = DateTime::parse_from_rfc3339("2026-11-30T10:30:00Z").unwrap().with_timezone(&Utc);
        let writes = g.writes(&t, "n1", "+8613800001234", now);
        let keys: Vec<&Key> = writes
            .iter()
            .map(|w| match w {
                Write::Update { key, .. } => key,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(keys.len(), 2);
        assert!(keys.iter().all(|k| is_counter(k) && !k.pk.contains("13800001234")), "{keys:?}");
        assert_eq!(keys[0].sk, format!("{COUNTER_SK_PREFIX}3600#{}", now.timestamp() / 3600));
        // The same hour, another minute: the same counter; the next hour: another.
        let later = g.writes(&t, "n2", "+8613800001234", now + chrono::Duration::minutes(20));
        let next = g.writes(&t, "n3", "+8613800001234", now + chrono::Duration::minutes(40));
        let key_of = |w: &Write| match w {
            Write::Update { key, .. } => key.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(key_of(&later[0]), *keys[0]);
        assert_ne!(key_of(&next[0]), *keys[0]);
    }
}
