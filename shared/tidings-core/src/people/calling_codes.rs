//! The countries (ISO 3166 regions, as libphonenumber names them) of each E.164 country calling
//! code: what the SMS country guard needs of a number whose country was not recorded when it
//! was stored (`notify::abuse`), without the numbering plans' patterns (`people::phones`).
//! `001` is a code for no country (`+800`, `+882`). The table is libphonenumber's metadata,
//! written at build time (build.rs).

// Each calling code and its regions (`CALLING_CODES`, sorted by code), written by build.rs from
// the metadata. ITU codes are prefix-free: a number's code is the one of its first one, two or
// three digits that is there.
include!(concat!(env!("OUT_DIR"), "/calling_codes.rs"));

/// The regions of the calling code `number` (E.164, `+` and digits) starts with.
pub fn regions_of(number: &str) -> Option<&'static [&'static str]> {
    split_code(number.strip_prefix('+')?).map(|(i, _)| CALLING_CODES[i].1)
}

/// The calling code `digits` start with, as its index in [`CALLING_CODES`] (the same index in
/// `people::phones`' table, written by the same loop), and the digits after it.
pub(crate) fn split_code(digits: &str) -> Option<(usize, &str)> {
    (1..=3).find_map(|n| {
        let code = digits.get(..n)?.parse::<u16>().ok()?;
        CALLING_CODES.binary_search_by_key(&code, |(c, _)| *c).ok().map(|i| (i, &digits[n..]))
    })
}

/// Whether `region` is a region of some calling code (`US`, `GG`; not `001`).
pub fn is_region(region: &str) -> bool {
    region != "001" && CALLING_CODES.iter().any(|(_, regions)| regions.contains(&region))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_numbers_code_is_its_first_digits_that_are_one() {
        assert_eq!(regions_of("+8613800001234"), Some(&["CN"][..]));
        assert!(regions_of("+14155550100").is_some_and(|r| r.contains(&"US") && r.contains(&"JM")));
        assert_eq!(regions_of("+447911123456"), Some(&["GB", "GG", "IM", "JE"][..]));
        assert_eq!(regions_of("+35312345678"), Some(&["IE"][..]), "353, not 35 (no such code)");
        assert_eq!(regions_of("+88212345678"), Some(&["001"][..]));
        assert_eq!(regions_of("14155550100"), None);
        assert_eq!(regions_of("+"), None);
        assert!(is_region("US") && is_region("GG") && !is_region("001") && !is_region("XX"));
    }
}
