//! Amounts of money as exact decimals (never `f64`): an order line's `unit_price` ("19.99") and
//! the revenue summed from them (docs/restock.md, "What alerts earn").
//!
//! An amount is a whole number of ten-thousandths held in an `i128`: at most 9 digits before
//! the point and 4 after it, never negative. A line (price × at most
//! [`crate::inventory::MAX_QTY`] units) and any sum of lines stay far inside `i128`; sums
//! saturate rather than wrap.

use std::fmt;

use crate::error::{CoreError, CoreResult};

/// Digits after the point kept exactly.
pub const SCALE: u32 = 4;
const UNIT: i128 = 10_i128.pow(SCALE);
/// Digits before the point an amount may have.
pub const MAX_WHOLE_DIGITS: usize = 9;

/// An exact, non-negative amount.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Amount(i128);

impl Amount {
    pub const ZERO: Amount = Amount(0);

    /// Parses `"19.99"`-style text: digits, optionally a point and 1 to 4 digits; no sign, no
    /// exponent, no spaces. Anything else is 422 naming `field`.
    pub fn parse(field: &str, text: &str) -> CoreResult<Amount> {
        let bad = || {
            CoreError::invalid(
                field,
                format!(
                    "must be a non-negative decimal amount as a string, at most {MAX_WHOLE_DIGITS} digits before the point and {SCALE} after it (\"19.99\")"
                ),
            )
        };
        let (whole, frac) = match text.split_once('.') {
            Some((w, f)) => (w, Some(f)),
            None => (text, None),
        };
        if whole.is_empty() || whole.len() > MAX_WHOLE_DIGITS || !whole.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let mut units: i128 = whole.parse::<i128>().map_err(|_| bad())? * UNIT;
        if let Some(f) = frac {
            if f.is_empty() || f.len() > SCALE as usize || !f.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            let digits: i128 = f.parse().map_err(|_| bad())?;
            let missing = SCALE - u32::try_from(f.len()).map_err(|_| bad())?;
            units += digits * 10_i128.pow(missing);
        }
        Ok(Amount(units))
    }

    /// Reads back an amount this module wrote (`None` for anything else).
    pub fn read(text: &str) -> Option<Amount> {
        Amount::parse("amount", text).ok()
    }

    /// This amount times `qty` (negative counts as 0).
    pub fn times(self, qty: i64) -> Amount {
        Amount(self.0.saturating_mul(i128::from(qty.max(0))))
    }

    pub fn plus(self, other: Amount) -> Amount {
        Amount(self.0.saturating_add(other.0))
    }
}

/// At least two digits after the point, more only when they are not zero: "59.97", "0.00",
/// "1.2345".
impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whole = self.0 / UNIT;
        let mut frac = format!("{:04}", self.0 % UNIT);
        while frac.len() > 2 && frac.ends_with('0') {
            frac.pop();
        }
        write!(f, "{whole}.{frac}")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn sums_exactly_and_prints_two_or_more_decimals() {
        let p = Amount::parse("p", "19.99").unwrap();
        assert_eq!(p.times(3).to_string(), "59.97");
        // 0.1 + 0.2 is 0.3 here (in f64 it is 0.30000000000000004).
        let s = Amount::parse("p", "0.1").unwrap().plus(Amount::parse("p", "0.2").unwrap());
        assert_eq!(s.to_string(), "0.30");
        assert_eq!(Amount::parse("p", "7").unwrap().to_string(), "7.00");
        assert_eq!(Amount::parse("p", "1.2345").unwrap().to_string(), "1.2345");
        assert_eq!(Amount::ZERO.to_string(), "0.00");
        let big = Amount::parse("p", "999999999.9999").unwrap().times(crate::inventory::MAX_QTY);
        assert_eq!(big.to_string(), "999999999999900.00");
    }

    #[test]
    fn refuses_what_is_not_a_plain_non_negative_decimal() {
        for bad in ["", "-1", "+1", "1.", ".5", "1.23456", "1e3", " 1", "1,00", "NaN", "1234567890", "0x10", "1.2.3"] {
            let e = Amount::parse("items[0].unit_price", bad).unwrap_err();
            assert!(matches!(&e, CoreError::Invalid { field, .. } if field == "items[0].unit_price"), "{bad}: {e:?}");
        }
    }
}
