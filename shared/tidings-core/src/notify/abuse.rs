//! The abuse guard of user-triggered messages (docs/gates.md, "Abuse guard": skipping the
//! frequency cap must not leave the door open to SMS pumping). Transactional messages — one-time
//! passwords above all — skip quiet hours and the user's frequency cap, so they are guarded
//! instead:
//!
//! - **countries** (SMS pumping): `TIDINGS_SMS_COUNTRIES="+86,+44,US,CA"` lists where SMS may
//!   go (any category): E.164 prefixes, or ISO 3166 country codes, the country derived from the
//!   number by libphonenumber's metadata (`US` and `CA` rather than `+1`, which also takes in
//!   the Caribbean's premium-rate ranges) when the user's phone is written, and stored with it
//!   (`phone_country`). Another number is `suppressed` with reason `country_not_allowed`, so a
//!   script requesting codes for premium-rate ranges abroad earns nothing. A number stored
//!   before its country was recorded passes when every country of its calling code is allowed
//!   (`+86` under `CN`), and else is suppressed, logged, until the user is written again.
//!   Empty: all.
//! - **per-number limits**: `TIDINGS_SMS_NUMBER_LIMITS="5/1h,10/1d"` caps transactional SMS to
//!   one number per fixed window (`s`, `m`, `h`, `d`). Beyond it the delivery is `suppressed`
//!   with reason `number_rate_limited`. Each window is a counter item, counted in the same
//!   transaction as the delivery's creation with a condition (atomic under any concurrency)
//!   and a mark of the notification (a repeated orchestration never counts twice), like the
//!   marketing frequency cap. The number is hashed in the key: no phone number in a key.
//! - **per-requester limits**: a request may name who asked for it (`requester`: the end
//!   user's `ip` and `device_id`, as the shop's endpoint saw them).
//!   `TIDINGS_REQUESTER_IP_LIMITS="20/1h"` and `TIDINGS_REQUESTER_DEVICE_LIMITS="5/1h"` cap the
//!   notifications accepted per IP (an IPv6 address counts by its /64) and per device; beyond
//!   them `POST /v1/notifications` answers 429 `rate_limited` naming the field, with
//!   `Retry-After`, and nothing is accepted. Counted in the accept transaction itself, so a
//!   repeated request (same idempotency key) never counts twice. Neither value is stored.

use std::net::IpAddr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};

use crate::ids::TenantId;
use crate::notify::model::Requester;
use crate::ports::{Key, Write};

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
pub struct AbuseGuard {
    /// E.164 prefixes SMS may go to (`+86`, `+1`); with `regions` empty: every number.
    pub countries: Vec<String>,
    /// ISO 3166 countries SMS may go to (`US`, `CN`), the number's country as libphonenumber
    /// derives it.
    pub regions: Vec<String>,
    /// Per-number limits on transactional SMS; empty: none.
    pub number_limits: Vec<Limit>,
    /// Per-requester limits on accepted notifications; empty: none.
    pub ip_limits: Vec<Limit>,
    pub device_limits: Vec<Limit>,
}

/// The settings the guard reads.
pub const SETTINGS: [&str; 4] = [
    "TIDINGS_SMS_COUNTRIES",
    "TIDINGS_SMS_NUMBER_LIMITS",
    "TIDINGS_REQUESTER_IP_LIMITS",
    "TIDINGS_REQUESTER_DEVICE_LIMITS",
];

impl AbuseGuard {
    /// Parses the settings `get` gives; a malformed entry is an error naming the setting and
    /// the entry.
    pub fn from_settings(get: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let [countries, numbers, ips, devices] = SETTINGS.map(|name| get(name).unwrap_or_default());
        let mut guard = AbuseGuard::default();
        for prefix in countries.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if crate::people::calling_codes::is_region(prefix) {
                guard.regions.push(prefix.to_owned());
                continue;
            }
            let digits = prefix.strip_prefix('+').unwrap_or("");
            if digits.is_empty() || digits.len() > 6 || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!(
                    "TIDINGS_SMS_COUNTRIES: {prefix:?} is neither an E.164 prefix such as +86 nor a country such as CN"
                ));
            }
            guard.countries.push(prefix.to_owned());
        }
        guard.number_limits = parse_limits(SETTINGS[1], &numbers)?;
        guard.ip_limits = parse_limits(SETTINGS[2], &ips)?;
        guard.device_limits = parse_limits(SETTINGS[3], &devices)?;
        Ok(guard)
    }

    /// Whether an SMS may go to `number` at all; `country` is the one recorded with it when it
    /// was written (`User::phone_country`).
    pub fn allows_country(&self, number: &str, country: Option<&str>) -> bool {
        if self.countries.is_empty() && self.regions.is_empty() {
            return true;
        }
        if self.countries.iter().any(|p| number.starts_with(p.as_str())) {
            return true;
        }
        if self.regions.is_empty() {
            return false;
        }
        let allowed = |region: &str| self.regions.iter().any(|r| r == region);
        match country {
            Some(country) => allowed(country),
            // Stored before its country was recorded: its calling code's countries decide when
            // they agree.
            None => {
                let every =
                    crate::people::calling_codes::regions_of(number).is_some_and(|r| r.iter().all(|c| allowed(c)));
                // Once per process, not per send: a campaign to many such numbers would repeat
                // it; each refused send says why itself (`country_not_allowed`).
                static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
                if !every && !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::warn!(
                        "an SMS number stored without its country is refused by TIDINGS_SMS_COUNTRIES; \
                         writing the user again records it (said once per process)"
                    );
                }
                every
            }
        }
    }

    /// The counter writes that count one transactional SMS of `notification_id` to `number`
    /// against every limit; each fails its condition when its window is full.
    pub fn number_writes(&self, t: &TenantId, notification_id: &str, number: &str, now: DateTime<Utc>) -> Vec<Write> {
        let pk = number_pk(t, number);
        let mark = format!("n_{notification_id}");
        self.number_limits.iter().map(|limit| counter(&pk, COUNTER_SK_PREFIX, limit, Some(&mark), now).0).collect()
    }

    /// The counter items [`AbuseGuard::number_writes`] updates (for a page read ahead).
    pub fn number_keys(&self, t: &TenantId, number: &str, now: DateTime<Utc>) -> Vec<Key> {
        let pk = number_pk(t, number);
        self.number_limits.iter().map(|limit| window_key(&pk, COUNTER_SK_PREFIX, limit, now).0).collect()
    }

    /// The counter writes that count one accepted notification against the requester's limits,
    /// each with the field it names and the seconds until its window ends (for `Retry-After`).
    pub fn requester_writes(&self, t: &TenantId, requester: &Requester, now: DateTime<Utc>) -> Vec<RequesterCount> {
        let mut out = Vec::new();
        let subjects = [
            ("requester.ip", "ip", requester.ip.as_deref().and_then(ip_subject), &self.ip_limits),
            ("requester.device_id", "device", requester.device_id.clone(), &self.device_limits),
        ];
        for (field, kind, subject, limits) in subjects {
            let Some(subject) = subject else { continue };
            let hash = subject_hash(&subject);
            for limit in limits {
                let (write, retry_after_s) = counter(&format!("T#{t}#REQ#{kind}#{hash}"), "REQLIM#", limit, None, now);
                out.push(RequesterCount { write, field, retry_after_s });
            }
        }
        out
    }
}

/// One requester counter of an accept transaction.
#[derive(Clone, Debug, PartialEq)]
pub struct RequesterCount {
    pub write: Write,
    /// The request field it limits (`requester.ip`, `requester.device_id`).
    pub field: &'static str,
    /// Seconds until its window ends.
    pub retry_after_s: u64,
}

/// What an IP counts as: an IPv4 address itself, an IPv6 address its /64 (one subscriber's
/// prefix: rotating within it does not escape the limit).
pub(crate) fn ip_subject(ip: &str) -> Option<String> {
    match ip.parse::<IpAddr>().ok()? {
        IpAddr::V4(v4) => Some(v4.to_string()),
        IpAddr::V6(v6) => {
            let s = v6.segments();
            Some(format!("{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3]))
        }
    }
}

/// A counted subject in a key: a truncated SHA-256, so no number, IP or device id is stored.
pub(crate) fn subject_hash(subject: &str) -> String {
    hex::encode(&Sha256::digest(subject.as_bytes())[..12])
}

/// The partition of a phone number's counters.
fn number_pk(t: &TenantId, number: &str) -> String {
    format!("T#{t}#SMS#{}", subject_hash(number))
}

/// The counter item of `limit`'s window holding `now` under `pk`, and when that window ends
/// (epoch seconds).
fn window_key(pk: &str, sk_prefix: &str, limit: &Limit, now: DateTime<Utc>) -> (Key, i64) {
    let window_s = limit.window.as_secs().max(1) as i64;
    let index = now.timestamp().div_euclid(window_s);
    (Key::new(pk.to_owned(), format!("{sk_prefix}{window_s}#{index}")), (index + 1) * window_s)
}

/// A fixed-window counter item under `pk`: incremented only while below the limit (and, with a
/// `mark`, only once per mark). Returns the write and the seconds left in the window.
fn counter(pk: &str, sk_prefix: &str, limit: &Limit, mark: Option<&str>, now: DateTime<Utc>) -> (Write, u64) {
    let (key, end) = window_key(pk, sk_prefix, limit, now);
    // Kept a day past its window by the table's TTL.
    let write = super::caps::capped_count(key, limit.count, mark, end + 86_400);
    (write, (end - now.timestamp()).max(1) as u64)
}

fn parse_limits(setting: &str, value: &str) -> Result<Vec<Limit>, String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|entry| {
            parse_limit(entry).ok_or_else(|| format!("{setting}: {entry:?} is not count/window, such as 5/1h or 10/1d"))
        })
        .collect()
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

    fn guard(settings: &[(&str, &str)]) -> Result<AbuseGuard, String> {
        AbuseGuard::from_settings(|name| settings.iter().find(|(n, _)| *n == name).map(|(_, v)| (*v).to_owned()))
    }

    fn sms(countries: &str, limits: &str) -> AbuseGuard {
        guard(&[("TIDINGS_SMS_COUNTRIES", countries), ("TIDINGS_SMS_NUMBER_LIMITS", limits)]).unwrap()
    }

    #[test]
    fn parses_countries_and_limits() {
        let g = sms(" +86, +1 ", "5/1h, 10/1d,3/90s,2/m");
        assert_eq!(g.countries, vec!["+86", "+1"]);
        let secs: Vec<(u32, u64)> = g.number_limits.iter().map(|l| (l.count, l.window.as_secs())).collect();
        assert_eq!(secs, vec![(5, 3600), (10, 86_400), (3, 90), (2, 60)]);
        assert_eq!(guard(&[]).unwrap(), AbuseGuard::default());
        let g = guard(&[("TIDINGS_REQUESTER_IP_LIMITS", "20/1h"), ("TIDINGS_REQUESTER_DEVICE_LIMITS", "5/1h,8/1d")])
            .unwrap();
        assert_eq!((g.ip_limits.len(), g.device_limits.len()), (1, 2));
    }

    #[test]
    fn refuses_malformed_entries_by_setting_and_entry() {
        for (setting, value) in [
            ("TIDINGS_SMS_COUNTRIES", "86"),
            ("TIDINGS_SMS_COUNTRIES", "+8a"),
            ("TIDINGS_SMS_NUMBER_LIMITS", "x/1h"),
            ("TIDINGS_SMS_NUMBER_LIMITS", "5/1w"),
            ("TIDINGS_REQUESTER_IP_LIMITS", "0/1h"),
            ("TIDINGS_REQUESTER_DEVICE_LIMITS", "5 per hour"),
        ] {
            let e = guard(&[(setting, value)]).unwrap_err();
            assert!(e.starts_with(setting) && e.contains(&format!("{value:?}")), "{e}");
        }
    }

    #[test]
    fn countries_are_prefixes_and_empty_allows_all() {
        let g = sms("+86,+1", "");
        assert!(g.allows_country("+8613800001234", Some("CN")));
        assert!(g.allows_country("+14155550100", None));
        assert!(!g.allows_country("+88212345678", None));
        assert!(AbuseGuard::default().allows_country("+88212345678", None));
    }

    #[test]
    fn countries_may_be_named_and_are_derived_from_the_number() {
        let g = sms("US,+86", "");
        assert_eq!(g.regions, vec!["US"]);
        let country = |n: &str| crate::people::users::e164_and_country(n).and_then(|(_, c)| c);
        assert_eq!(country("+14155550100").as_deref(), Some("US"), "San Francisco");
        assert_eq!(country("+18765550100").as_deref(), Some("JM"), "Jamaica shares +1");
        assert!(g.allows_country("+14155550100", country("+14155550100").as_deref()));
        assert!(!g.allows_country("+18765550100", country("+18765550100").as_deref()));
        assert!(g.allows_country("+8613800001234", country("+8613800001234").as_deref()));
        assert!(!g.allows_country("+447911123456", country("+447911123456").as_deref()));
        let e = guard(&[("TIDINGS_SMS_COUNTRIES", "USA")]).unwrap_err();
        assert!(e.contains("\"USA\""), "{e}");
    }

    #[test]
    fn a_number_stored_without_its_country_passes_only_when_its_codes_countries_all_do() {
        let g = sms("US,CN,RU", "");
        assert!(g.allows_country("+8613800001234", None), "+86 is China's alone");
        assert!(!g.allows_country("+14155550100", None), "+1 is also Jamaica's: not known to be the US");
        assert!(!g.allows_country("+77012345678", None), "+7 is also Kazakhstan's");
        assert!(!g.allows_country("+447911123456", None));
        assert!(sms("RU,KZ", "").allows_country("+77012345678", None), "both of +7's countries");
        assert!(!g.allows_country("+88212345678", None), "a code of no country");
    }

    #[test]
    fn an_ipv6_address_counts_by_its_prefix() {
        assert_eq!(ip_subject("203.0.113.7").as_deref(), Some("203.0.113.7"));
        assert_eq!(ip_subject("2001:db8:1:2:aaaa::1"), ip_subject("2001:db8:1:2:bbbb::9"));
        assert_ne!(ip_subject("2001:db8:1:2::1"), ip_subject("2001:db8:1:3::1"));
        assert_eq!(ip_subject("not an ip"), None);
    }

    #[test]
    fn requester_counters_name_their_field_and_the_time_left() {
        let g =
            guard(&[("TIDINGS_REQUESTER_IP_LIMITS", "20/1h"), ("TIDINGS_REQUESTER_DEVICE_LIMITS", "5/1h")]).unwrap();
        let t = TenantId::parse("shop").unwrap();
        let now = DateTime::parse_from_rfc3339("2026-11-30T10:45:00Z").unwrap().with_timezone(&Utc);
        let who = Requester { ip: Some("203.0.113.7".into()), device_id: Some("dev-1".into()) };
        let counts = g.requester_writes(&t, &who, now);
        let fields: Vec<(&str, u64)> = counts.iter().map(|c| (c.field, c.retry_after_s)).collect();
        assert_eq!(fields, vec![("requester.ip", 900), ("requester.device_id", 900)]);
        let only_ip = Requester { ip: Some("203.0.113.7".into()), device_id: None };
        assert_eq!(g.requester_writes(&t, &only_ip, now).len(), 1);
    }

    #[test]
    fn one_counter_per_limit_in_the_current_window_without_the_number() {
        let g = sms("", "5/1h,10/1d");
        let t = TenantId::parse("shop").unwrap();
        let now = DateTime::parse_from_rfc3339("2026-11-30T10:30:00Z").unwrap().with_timezone(&Utc);
        let writes = g.number_writes(&t, "n1", "+8613800001234", now);
        let keys: Vec<&Key> = writes
            .iter()
            .map(|w| match w {
                Write::Update { key, .. } => key,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(keys.len(), 2);
        assert_eq!(g.number_keys(&t, "+8613800001234", now).iter().collect::<Vec<_>>(), keys, "the keys read ahead");
        assert!(keys.iter().all(|k| is_counter(k) && !k.pk.contains("13800001234")), "{keys:?}");
        assert_eq!(keys[0].sk, format!("{COUNTER_SK_PREFIX}3600#{}", now.timestamp() / 3600));
        // The same hour, another minute: the same counter; the next hour: another.
        let later = g.number_writes(&t, "n2", "+8613800001234", now + chrono::Duration::minutes(20));
        let next = g.number_writes(&t, "n3", "+8613800001234", now + chrono::Duration::minutes(40));
        let key_of = |w: &Write| match w {
            Write::Update { key, .. } => key.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(key_of(&later[0]), *keys[0]);
        assert_ne!(key_of(&next[0]), *keys[0]);
    }
}
