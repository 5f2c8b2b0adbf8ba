//! IANA time zones: a user's zone for quiet hours, local-time sends, the daily cap's day and a
//! workflow's wall-clock waits.
//!
//! The rules come from the IANA database bundled in the binary, in its compact TZif form
//! (`jiff`'s `tzdb-bundle-always`): the same on a laptop and in a Lambda function, whose image
//! has no `/usr/share/zoneinfo`, and about 0.8 MB smaller in every function than a table per
//! zone compiled to code (docs/deploy.md, "The functions' size").

use chrono::{DateTime, Duration, NaiveDate, NaiveDateTime, NaiveTime, Utc};
use jiff::tz::TimeZone;

/// A zone of the bundled database, or UTC.
#[derive(Clone, Debug)]
pub struct Zone(TimeZone);

/// The database's placeholder zone, which names no place: not a user's zone.
const NOT_A_PLACE: &str = "Factory";

impl Zone {
    pub fn utc() -> Self {
        Zone(TimeZone::UTC)
    }

    /// The zone of an IANA name, spelt as the database spells it (`Asia/Shanghai`, not
    /// `asia/shanghai`).
    pub fn named(name: &str) -> Option<Self> {
        if name == NOT_A_PLACE {
            return None;
        }
        let tz = TimeZone::get(name).ok()?;
        (tz.iana_name() == Some(name)).then_some(Zone(tz))
    }

    /// The zone a user's stored name stands for: UTC when absent or unknown.
    pub fn of(name: Option<&str>) -> Self {
        name.and_then(Self::named).unwrap_or_else(Self::utc)
    }

    /// Every zone name the database has, sorted.
    pub fn names() -> Vec<String> {
        let mut names: Vec<String> =
            jiff::tz::db().available().map(|n| n.to_string()).filter(|n| n != NOT_A_PLACE).collect();
        names.sort_unstable();
        names
    }

    /// Every zone of the database, each looked up once (in the database's order).
    pub fn all() -> impl Iterator<Item = Zone> {
        jiff::tz::db().available().filter_map(|name| Self::named(name.as_str()))
    }

    /// The wall-clock time in this zone at `at`.
    pub fn local(&self, at: DateTime<Utc>) -> NaiveDateTime {
        let offset = jiff::Timestamp::from_second(at.timestamp()).map(|ts| self.0.to_offset(ts).seconds()).unwrap_or(0);
        at.naive_utc() + Duration::seconds(i64::from(offset))
    }

    /// The instant of a wall-clock time on a date in this zone. A time skipped by a DST jump
    /// moves forward by the gap (an hour, mostly); an ambiguous one takes the earlier instant.
    pub fn instant(&self, date: NaiveDate, time: NaiveTime) -> DateTime<Utc> {
        let naive = date.and_time(time);
        civil(naive)
            .and_then(|dt| self.0.to_ambiguous_timestamp(dt).compatible().ok())
            .and_then(|ts| DateTime::from_timestamp(ts.as_second(), ts.subsec_nanosecond().unsigned_abs()))
            .unwrap_or_else(|| naive.and_utc())
    }
}

/// `jiff`'s civil time of a `chrono` one; `None` outside jiff's years (-9999 to 9999).
fn civil(t: NaiveDateTime) -> Option<jiff::civil::DateTime> {
    use chrono::{Datelike, Timelike};
    let narrow = |v: u32| i8::try_from(v).ok();
    let date = jiff::civil::Date::new(i16::try_from(t.year()).ok()?, narrow(t.month())?, narrow(t.day())?).ok()?;
    let time = jiff::civil::Time::new(
        narrow(t.hour())?,
        narrow(t.minute())?,
        narrow(t.second())?,
        i32::try_from(t.nanosecond()).ok()?,
    )
    .ok()?;
    Some(date.to_datetime(time))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn day(s: &str) -> NaiveDate {
        s.parse().unwrap()
    }

    fn hm(h: u32, m: u32) -> NaiveTime {
        NaiveTime::from_hms_opt(h, m, 0).unwrap()
    }

    #[test]
    fn names_are_the_databases_spelling_and_nothing_else() {
        assert!(Zone::named("Asia/Shanghai").is_some());
        assert!(Zone::named("America/Argentina/Buenos_Aires").is_some());
        assert!(Zone::named("asia/shanghai").is_none(), "spelt otherwise");
        assert!(Zone::named("Mars/Olympus_Mons").is_none());
        assert!(Zone::named("Factory").is_none());
        assert!(Zone::named("").is_none());
        let names = Zone::names();
        assert!(names.len() > 500, "{}", names.len());
        assert!(names.windows(2).all(|w| w[0] < w[1]), "sorted, once each");
        assert!(names.iter().all(|n| Zone::named(n).is_some()), "every listed name is taken");
        assert!(!names.iter().any(|n| n == "Factory"));
        let mut all: Vec<String> = Zone::all().filter_map(|z| z.0.iana_name().map(str::to_owned)).collect();
        all.sort_unstable();
        assert_eq!(all, names, "every zone, once, the same as the names");
    }

    #[test]
    fn local_time_follows_the_zones_rules() {
        let berlin = Zone::named("Europe/Berlin").unwrap();
        assert_eq!(berlin.local(at("2026-01-15T12:00:00Z")), day("2026-01-15").and_time(hm(13, 0)));
        assert_eq!(berlin.local(at("2026-07-15T12:00:00Z")), day("2026-07-15").and_time(hm(14, 0)));
        let kolkata = Zone::named("Asia/Kolkata").unwrap();
        assert_eq!(kolkata.local(at("2026-07-15T20:00:00Z")), day("2026-07-16").and_time(hm(1, 30)));
        assert_eq!(Zone::of(None).local(at("2026-07-15T20:00:00Z")), day("2026-07-15").and_time(hm(20, 0)));
        assert_eq!(Zone::of(Some("Nowhere")).local(at("2026-07-15T20:00:00Z")), day("2026-07-15").and_time(hm(20, 0)));
    }

    #[test]
    fn a_skipped_time_moves_on_by_the_gap_and_a_repeated_one_takes_the_first() {
        let ny = Zone::named("America/New_York").unwrap();
        // 2026-03-08 02:30 does not exist in New York (02:00 -> 03:00): 03:30 EDT.
        assert_eq!(ny.instant(day("2026-03-08"), hm(2, 30)), at("2026-03-08T07:30:00Z"));
        // 2026-11-01 01:30 happens twice: the first, in EDT.
        assert_eq!(ny.instant(day("2026-11-01"), hm(1, 30)), at("2026-11-01T05:30:00Z"));
        assert_eq!(ny.instant(day("2026-06-01"), hm(9, 0)), at("2026-06-01T13:00:00Z"));
        // Lord Howe's DST is half an hour: its gap moves a time on by 30 minutes.
        let lord_howe = Zone::named("Australia/Lord_Howe").unwrap();
        assert_eq!(lord_howe.instant(day("2026-10-04"), hm(2, 15)), at("2026-10-03T15:45:00Z"));
    }
}
