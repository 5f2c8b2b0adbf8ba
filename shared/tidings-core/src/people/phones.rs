//! Whether a phone number given with its country code is a valid number of a numbering plan,
//! its E.164 form and its country: what the `phonenumber` crate answers (`parse(None, ..)`,
//! `is_valid`, `Mode::E164`, `country().id()`), step for step, over libphonenumber's metadata
//! written as static tables at build time (`build.rs`), with `regex-lite` for its patterns.
//!
//! Why not the crate itself at run time: it loads the whole metadata at first use and compiles
//! its patterns with the Unicode regex engine, 2 MB of every function that checks a number
//! (docs/deploy.md, "The functions' size"). Here a region's patterns are compiled the first
//! time a number is tried against that region, and kept. `the_crate_and_this_agree` (tests)
//! holds the two to the same answers over every region's example numbers, written in several
//! ways and mutated.
//!
//! Input is what [`crate::people::users::e164_and_country`] lets through: a `+`, then digits
//! and the separators ` -().` (no letters, so no extension). libphonenumber then reads the
//! digits alone.

use std::sync::OnceLock;

use regex_lite::{Regex, RegexBuilder};

use super::calling_codes::split_code;

include!(concat!(env!("OUT_DIR"), "/phone_metadata.rs"));

/// A calling code and its regions, in the order libphonenumber tries them.
struct Code {
    code: u16,
    regions: &'static [Region],
}

/// One region's numbering plan (libphonenumber's `PhoneMetadata`, what validity needs).
struct Region {
    /// ISO 3166 (`US`), or `001` for a code of no country (`+800`).
    id: &'static str,
    national_prefix: Option<&'static str>,
    prefix_for_parsing: Option<&'static str>,
    transform: Option<&'static str>,
    leading_digits: Option<&'static str>,
    general: Desc,
    /// Lengths of numbers dialled only within an area.
    local_lengths: &'static [u16],
    /// Each type a number may be of (fixed line, mobile, toll free, ...).
    types: &'static [Desc],
}

/// A number type's pattern and possible lengths.
struct Desc {
    pattern: &'static str,
    lengths: &'static [u16],
}

/// A region's patterns, compiled.
struct Compiled {
    prefix_for_parsing: Option<Regex>,
    leading_digits: Option<Regex>,
    general: Option<Regex>,
    types: Vec<Option<Regex>>,
}

/// The shortest and longest national significant numbers libphonenumber accepts.
const MIN_NSN: usize = 2;
const MAX_NSN: usize = 17;
/// More digits than any valid number is written with: a code (3), the longest national prefix
/// and carrier code the metadata strips (under 10) and the longest national number.
const MAX_DIGITS: usize = 3 + 10 + MAX_NSN;

/// The E.164 form of `number` and its region (`None` for a code of no country), when it is a
/// valid number; `number` starts with `+` (see the module).
pub(crate) fn e164_and_country(number: &str) -> Option<(String, Option<String>)> {
    let digits: String = number.chars().filter(char::is_ascii_digit).collect();
    // The parser's viability check: three digits at least; then more than two after the `+`.
    // And never more than a code, a national prefix with a carrier code and the longest national
    // number could make: the patterns are not run over a tenant's megabyte of digits.
    if digits.len() <= MIN_NSN || digits.len() > MAX_DIGITS || digits.starts_with('0') {
        return None;
    }
    let (index, rest) = split_code(&digits)?;
    let code = &CODES[index];
    let mut national = rest.to_owned();
    if let Some(r) = source_for(index, national.trim_start_matches('0')) {
        let (region, patterns) = (&code.regions[r], compiled(index, r));
        let mut potential = strip_national_prefix(region, patterns, &national);
        if let Some(prefix) = region.national_prefix
            && potential.starts_with(prefix)
        {
            potential.drain(..prefix.len());
        }
        if !too_short(region, potential.len()) {
            national = potential;
        }
    }
    if national.len() < MIN_NSN || national.len() > MAX_NSN {
        return None;
    }
    // The national number as the crate keeps it: its leading zeros, then a number below 2^56.
    let significant = national.trim_start_matches('0');
    if !significant.parse::<u64>().is_ok_and(|v| v < 1 << 56) {
        return None;
    }
    let r = source_for(index, &national)?;
    if !is_valid_in(&code.regions[r], compiled(index, r), &national) {
        return None;
    }
    // The country, as the crate finds it: from the digits without the leading zeros (nearly
    // always the national number itself, whose region is known).
    let country = if significant == national { Some(r) } else { source_for(index, significant) };
    let country = country.map(|r| code.regions[r].id).filter(|id| *id != "001").map(str::to_owned);
    Some((format!("+{}{national}", code.code), country))
}

/// The region of `code` a national number belongs to (libphonenumber's
/// `getRegionCodeForNumber`): the one region of the code, else the first whose leading digits
/// start the number, or, without leading digits, of whose types the number is one.
fn source_for(index: usize, national: &str) -> Option<usize> {
    let regions = CODES[index].regions;
    if regions.len() == 1 {
        return Some(0);
    }
    regions.iter().enumerate().position(|(r, region)| {
        let patterns = compiled(index, r);
        match &patterns.leading_digits {
            Some(leading) => leading.find(national).is_some_and(|m| m.start() == 0),
            None if region.leading_digits.is_some() => false,
            None => is_valid_in(region, patterns, national),
        }
    })
}

/// Whether `national` is of the region's general pattern and of one of its types.
fn is_valid_in(region: &Region, patterns: &Compiled, national: &str) -> bool {
    matches(&region.general, patterns.general.as_ref(), national)
        && region.types.iter().zip(&patterns.types).any(|(d, p)| matches(d, p.as_ref(), national))
}

/// A descriptor's match: one of its lengths (when it has any), and its pattern from the start.
fn matches(desc: &Desc, pattern: Option<&Regex>, national: &str) -> bool {
    if !desc.lengths.is_empty() && !desc.lengths.iter().any(|l| usize::from(*l) == national.len()) {
        return false;
    }
    pattern.and_then(|p| p.find(national)).is_some_and(|m| m.start() == 0)
}

/// Whether a national number is shorter than every number of the region (libphonenumber's
/// `TOO_SHORT`), a local length being possible.
fn too_short(region: &Region, len: usize) -> bool {
    let Some(min) = region.general.lengths.first() else { return false };
    !region.local_lengths.iter().any(|l| usize::from(*l) == len) && len < usize::from(*min)
}

/// The national number without the national prefix (and carrier code) the region's plan
/// dials before it, as libphonenumber strips it (`maybeStripNationalPrefixAndCarrierCode`).
fn strip_national_prefix(region: &Region, patterns: &Compiled, national: &str) -> String {
    let Some(parsing) = &patterns.prefix_for_parsing else {
        if region.prefix_for_parsing.is_none()
            && let Some(prefix) = region.national_prefix
            && let Some(rest) = national.strip_prefix(prefix)
        {
            return rest.to_owned();
        }
        return national.to_owned();
    };
    let Some(captures) = parsing.captures(national) else { return national.to_owned() };
    let Some(whole) = captures.get(0).filter(|m| m.start() == 0) else { return national.to_owned() };
    let general = patterns.general.as_ref();
    let viable = matches(&region.general, general, national);
    let last = captures.get(captures.len() - 1);
    match region.transform {
        Some(transform) if last.is_some() => {
            let transformed = parsing.replace(national, transform).into_owned();
            if viable && !matches(&region.general, general, &transformed) {
                return national.to_owned();
            }
            transformed
        }
        // Without a transform the crate strips what the pattern matched whatever is left (its
        // check of the general pattern reads the number from the match's start, which is the
        // whole number here); libphonenumber's Java compares what follows the prefix.
        _ => national[whole.end()..].to_owned(),
    }
}

/// The patterns of region `region` of the code at `index` in [`CODES`], compiled at their first
/// use.
fn compiled(index: usize, region: usize) -> &'static Compiled {
    static COMPILED: OnceLock<Vec<Vec<OnceLock<Compiled>>>> = OnceLock::new();
    let all =
        COMPILED.get_or_init(|| CODES.iter().map(|c| c.regions.iter().map(|_| OnceLock::new()).collect()).collect());
    all[index][region].get_or_init(|| {
        let r = &CODES[index].regions[region];
        Compiled {
            prefix_for_parsing: r.prefix_for_parsing.and_then(regex),
            leading_digits: r.leading_digits.and_then(regex),
            general: regex(r.general.pattern),
            types: r.types.iter().map(|d| regex(d.pattern)).collect(),
        }
    })
}

/// One of the metadata's patterns (whitespace in them is layout, as libphonenumber reads
/// them). Every one compiles (`every_pattern_compiles`); one that did not would match nothing.
fn regex(pattern: &str) -> Option<Regex> {
    RegexBuilder::new(pattern).ignore_whitespace(true).build().ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    use super::*;

    /// What `users::e164_and_country` answered with the crate at run time.
    fn by_the_crate(number: &str) -> Option<(String, Option<String>)> {
        let parsed = phonenumber::parse(None, number).ok()?;
        (parsed.is_valid() && parsed.extension().is_none()).then(|| {
            let country = parsed.country().id().map(|id| id.as_ref().to_owned());
            (parsed.format().mode(phonenumber::Mode::E164).to_string(), country)
        })
    }

    #[test]
    fn every_pattern_compiles() {
        for (i, code) in CODES.iter().enumerate() {
            for (r, region) in code.regions.iter().enumerate() {
                let patterns = compiled(i, r);
                let at = format!("+{} {}", code.code, region.id);
                assert!(patterns.general.is_some(), "{at}: {}", region.general.pattern);
                assert_eq!(patterns.prefix_for_parsing.is_some(), region.prefix_for_parsing.is_some(), "{at}");
                assert_eq!(patterns.leading_digits.is_some(), region.leading_digits.is_some(), "{at}");
                for (d, p) in region.types.iter().zip(&patterns.types) {
                    assert!(p.is_some(), "{at}: {}", d.pattern);
                }
            }
        }
    }

    #[test]
    fn every_region_of_the_metadata_is_in_the_tables() {
        let mut regions = 0;
        for m in phonenumber::metadata::DATABASE.iter() {
            let code = CODES.iter().find(|c| c.code == m.country_code());
            assert!(code.is_some_and(|c| c.regions.iter().any(|r| r.id == m.id())), "{} {}", m.country_code(), m.id());
            regions += 1;
        }
        assert!(regions > 200, "{regions} regions");
    }

    #[test]
    fn a_code_has_the_same_index_in_both_tables() {
        use crate::people::calling_codes::CALLING_CODES;
        assert_eq!(CODES.len(), CALLING_CODES.len());
        for (code, (number, regions)) in CODES.iter().zip(CALLING_CODES) {
            assert_eq!(code.code, *number);
            let mut ids: Vec<&str> = code.regions.iter().map(|r| r.id).collect();
            ids.sort_unstable();
            ids.dedup();
            assert_eq!(ids, *regions, "+{number}");
        }
    }

    /// Numbers to ask both: each region's example numbers, written with spaces, parentheses,
    /// the national prefix or a stray zero, shortened, lengthened and with each digit changed;
    /// and for every code, digit strings of every length from a fixed seed.
    fn numbers() -> Vec<String> {
        let mut out = Vec::new();
        for m in phonenumber::metadata::DATABASE.iter() {
            let code = m.country_code();
            let d = m.descriptors();
            let examples = [
                Some(d.general()),
                d.fixed_line(),
                d.mobile(),
                d.toll_free(),
                d.premium_rate(),
                d.shared_cost(),
                d.personal_number(),
                d.voip(),
                d.pager(),
                d.uan(),
                d.voicemail(),
            ]
            .into_iter()
            .flatten()
            .filter_map(|desc| desc.example());
            for example in examples {
                let national_prefix = m.national_prefix().unwrap_or("0");
                out.push(format!("+{code}{example}"));
                out.push(format!("+{code} {example}"));
                out.push(format!("+{code}{national_prefix}{example}"));
                out.push(format!("+{code} ({national_prefix}) {example}"));
                out.push(format!("+{code}0{example}"));
                out.push(format!("+{code}00{example}"));
                out.push(format!("+{code}{}", &example[..example.len() - 1]));
                out.push(format!("+{code}{example}7"));
                if example.len() > 3 {
                    out.push(format!("+{code} ({}) {}-{}", &example[..2], &example[2..3], &example[3..]));
                }
                for (i, c) in example.char_indices() {
                    let changed = char::from(b'0' + (c as u8 - b'0' + 3) % 10);
                    out.push(format!("+{code}{}{changed}{}", &example[..i], &example[i + 1..]));
                }
            }
        }
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        for code in CODES {
            for len in 1..=18 {
                for _ in 0..4 {
                    let mut digits = String::new();
                    for _ in 0..len {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        digits.push(char::from(b'0' + (seed % 10) as u8));
                    }
                    out.push(format!("+{}{digits}", code.code));
                }
            }
        }
        out.extend(["+", "+0", "+00", "+1", "+12", "+123", "+000000", "+999 123456", "+80012345678"].map(String::from));
        // Long strings of digits: more than any number is written with.
        for n in [25, 29, 30, 31, 40, 200] {
            out.push(format!("+54 0343 15{}", "6".repeat(n - 9)));
            out.push(format!("+1{}", "2".repeat(n - 1)));
        }
        out
    }

    #[test]
    fn the_crate_and_this_agree() {
        let numbers = numbers();
        let mut valid = 0;
        let mut differ = Vec::new();
        for number in &numbers {
            let ours = e164_and_country(number);
            let theirs = by_the_crate(number);
            valid += usize::from(theirs.is_some());
            if ours != theirs {
                differ.push(format!("{number}: ours {ours:?}, the crate's {theirs:?}"));
            }
        }
        assert!(differ.is_empty(), "{} of {} differ:\n{}", differ.len(), numbers.len(), differ.join("\n"));
        // Both sides of the line are asked about.
        assert!(valid > 5_000 && numbers.len() - valid > 5_000, "{valid} valid of {}", numbers.len());
    }

    #[test]
    fn a_few_numbers_by_hand() {
        let us = e164_and_country("+1 (415) 555-0100");
        assert_eq!(us, Some(("+14155550100".into(), Some("US".into()))));
        assert_eq!(e164_and_country("+1 416 555 0100").unwrap().1.as_deref(), Some("CA"));
        // The national prefix written after the code is dropped.
        assert_eq!(e164_and_country("+44 (0)20 7946 0958").unwrap().0, "+442079460958");
        // Italy keeps its leading zero.
        assert_eq!(e164_and_country("+39 06 698 80000").unwrap().0, "+390669880000");
        assert_eq!(e164_and_country("+800 1234 5678").unwrap(), ("+80012345678".into(), None));
        assert_eq!(e164_and_country("+1 415 555 010"), None, "too short");
        assert_eq!(e164_and_country("+999 1234"), None, "no such code");
    }
}
