//! The engine a template runs on: minijinja with nothing registered but an allowlist of filters,
//! tests and functions, every one called through [`bounded_call`], and one work budget per render
//! (docs/templates.md, "Limits").
//!
//! minijinja's fuel counts one instruction for a whole filter call, and several builtins size a
//! buffer from an argument (`'%1000000000000000s'|format('x')`, `[]|batch(1000000000000000)`):
//! one call could ask for petabytes, and Rust aborts the whole process when an allocation fails.
//! So nothing reaches a builtin unchecked: the arguments that size something are bounded before
//! the call, what goes in and what comes out is charged to the render's budget
//! ([`crate::templates::MAX_WORK`]), and a result over [`crate::templates::MAX_VALUE_BYTES`] is
//! refused. A builtin not in the tables below does not exist for a template (`debug`,
//! `namespace`, and any builtin a later minijinja adds).

use std::cell::Cell;
use std::sync::LazyLock;

use minijinja::value::{Kwargs, Rest, StringInput};
use minijinja::{AutoEscape, Environment, ErrorKind, State, UndefinedBehavior, Value as JinjaValue};

use super::{FUEL, MAX_FORMAT_WIDTH, MAX_RANGE, MAX_VALUE_BYTES, MAX_WORK, RECURSION_LIMIT};

/// The prefix of the bounded functions' errors (`classify` tells them apart from the rest).
pub(super) const LIMIT: &str = "limit: ";

/// The environment every template field is compiled in.
pub(super) fn environment() -> Environment<'static> {
    let mut env = Environment::empty();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_auto_escape_callback(|name| if name.ends_with(".html") { AutoEscape::Html } else { AutoEscape::None });
    env.set_fuel(Some(FUEL));
    env.set_recursion_limit(RECURSION_LIMIT);
    for (name, filter) in FILTERS.iter() {
        let (name, filter): (&'static str, JinjaValue) = (name, filter.clone());
        env.add_filter(name, move |state: &State, args: Rest<JinjaValue>| bounded_call(state, name, &filter, &args));
    }
    for (name, test) in TESTS.iter() {
        let (name, test): (&'static str, JinjaValue) = (name, test.clone());
        env.add_test(name, move |state: &State, args: Rest<JinjaValue>| {
            bounded_call(state, name, &test, &args).map(|v| v.is_true())
        });
    }
    for (name, function) in FUNCTIONS.iter() {
        let (name, function): (&'static str, JinjaValue) = (name, function.clone());
        env.add_function(name, move |state: &State, args: Rest<JinjaValue>| {
            bounded_call(state, name, &function, &args)
        });
    }
    env
}

/// The filters a template may use: minijinja's own where nothing they build is sized by an
/// argument alone, bounded versions of the rest. Not here: `tojson` and `urlencode` (features
/// this build leaves out).
static FILTERS: LazyLock<Vec<(&'static str, JinjaValue)>> = LazyLock::new(|| {
    use minijinja::filters as f;
    let escape = JinjaValue::from_function(escape);
    vec![
        ("abs", JinjaValue::from_function(f::abs)),
        ("attr", JinjaValue::from_function(f::attr)),
        ("batch", JinjaValue::from_function(f::batch)),
        ("bool", JinjaValue::from_function(f::bool)),
        ("capitalize", JinjaValue::from_function(f::capitalize)),
        ("chain", JinjaValue::from_function(f::chain)),
        ("count", JinjaValue::from_function(f::length)),
        ("d", JinjaValue::from_function(f::default)),
        ("default", JinjaValue::from_function(f::default)),
        ("dictsort", JinjaValue::from_function(f::dictsort)),
        ("e", escape.clone()),
        ("escape", escape),
        ("first", JinjaValue::from_function(f::first)),
        ("float", JinjaValue::from_function(f::float)),
        ("format", JinjaValue::from_function(f::format)),
        ("groupby", JinjaValue::from_function(f::groupby)),
        ("indent", JinjaValue::from_function(indent)),
        ("int", JinjaValue::from_function(f::int)),
        ("items", JinjaValue::from_function(f::items)),
        ("join", JinjaValue::from_function(join)),
        ("last", JinjaValue::from_function(f::last)),
        ("length", JinjaValue::from_function(f::length)),
        ("lines", JinjaValue::from_function(f::lines)),
        ("list", JinjaValue::from_function(f::list)),
        ("lower", JinjaValue::from_function(f::lower)),
        ("map", JinjaValue::from_function(f::map)),
        ("max", JinjaValue::from_function(f::max)),
        ("min", JinjaValue::from_function(f::min)),
        ("pprint", JinjaValue::from_function(f::pprint)),
        ("reject", JinjaValue::from_function(f::reject)),
        ("rejectattr", JinjaValue::from_function(f::rejectattr)),
        ("replace", JinjaValue::from_function(replace)),
        ("reverse", JinjaValue::from_function(f::reverse)),
        ("round", JinjaValue::from_function(f::round)),
        ("safe", JinjaValue::from_function(f::safe)),
        ("select", JinjaValue::from_function(f::select)),
        ("selectattr", JinjaValue::from_function(f::selectattr)),
        ("slice", JinjaValue::from_function(f::slice)),
        ("sort", JinjaValue::from_function(f::sort)),
        ("split", JinjaValue::from_function(f::split)),
        ("string", JinjaValue::from_function(f::string)),
        ("sum", JinjaValue::from_function(f::sum)),
        ("title", JinjaValue::from_function(f::title)),
        ("trim", JinjaValue::from_function(f::trim)),
        ("unique", JinjaValue::from_function(f::unique)),
        ("upper", JinjaValue::from_function(f::upper)),
        ("zip", JinjaValue::from_function(f::zip)),
    ]
});

/// The tests (`x is odd`): each answers from its operands, so only the operands are charged.
static TESTS: LazyLock<Vec<(&'static str, JinjaValue)>> = LazyLock::new(|| {
    use minijinja::tests as t;
    let f = |test: JinjaValue, names: &[&'static str]| names.iter().map(|n| (*n, test.clone())).collect::<Vec<_>>();
    [
        f(JinjaValue::from_function(t::is_undefined), &["undefined"]),
        f(JinjaValue::from_function(t::is_defined), &["defined"]),
        f(JinjaValue::from_function(t::is_none), &["none"]),
        f(JinjaValue::from_function(t::is_safe), &["safe", "escaped"]),
        f(JinjaValue::from_function(t::is_boolean), &["boolean"]),
        f(JinjaValue::from_function(t::is_odd), &["odd"]),
        f(JinjaValue::from_function(t::is_even), &["even"]),
        f(JinjaValue::from_function(divisibleby), &["divisibleby"]),
        f(JinjaValue::from_function(t::is_number), &["number"]),
        f(JinjaValue::from_function(t::is_integer), &["integer", "int"]),
        f(JinjaValue::from_function(t::is_float), &["float"]),
        f(JinjaValue::from_function(t::is_string), &["string"]),
        f(JinjaValue::from_function(t::is_sequence), &["sequence"]),
        f(JinjaValue::from_function(t::is_iterable), &["iterable"]),
        f(JinjaValue::from_function(t::is_mapping), &["mapping"]),
        f(JinjaValue::from_function(t::is_startingwith), &["startingwith"]),
        f(JinjaValue::from_function(t::is_endingwith), &["endingwith"]),
        f(JinjaValue::from_function(t::is_lower), &["lower"]),
        f(JinjaValue::from_function(t::is_upper), &["upper"]),
        f(JinjaValue::from_function(t::is_sameas), &["sameas"]),
        f(JinjaValue::from_function(t::is_eq), &["eq", "equalto", "=="]),
        f(JinjaValue::from_function(t::is_ne), &["ne", "!="]),
        f(JinjaValue::from_function(t::is_lt), &["lt", "lessthan", "<"]),
        f(JinjaValue::from_function(t::is_le), &["le", "<="]),
        f(JinjaValue::from_function(t::is_gt), &["gt", "greaterthan", ">"]),
        f(JinjaValue::from_function(t::is_ge), &["ge", ">="]),
        f(JinjaValue::from_function(t::is_in), &["in"]),
        f(JinjaValue::from_function(t::is_true), &["true"]),
        f(JinjaValue::from_function(t::is_false), &["false"]),
        f(JinjaValue::from_function(t::is_filter), &["filter"]),
        f(JinjaValue::from_function(t::is_test), &["test"]),
    ]
    .concat()
});

/// The global functions: `range` bounded, `dict` (as many entries as it is given). Not `debug`
/// (the whole render state), nor `namespace` (only useful with `set`, which the sandbox refuses).
static FUNCTIONS: LazyLock<Vec<(&'static str, JinjaValue)>> = LazyLock::new(|| {
    vec![("range", JinjaValue::from_function(range)), ("dict", JinjaValue::from_function(minijinja::functions::dict))]
});

/// Every filter, test and function call: the arguments that size something are checked before
/// the call, what goes in and what comes out is charged to the render's budget, and a result
/// over [`MAX_VALUE_BYTES`] (bytes of a string, items of a sequence or map) is refused.
fn bounded_call(
    state: &State,
    name: &'static str,
    inner: &JinjaValue,
    args: &[JinjaValue],
) -> Result<JinjaValue, minijinja::Error> {
    check_size_arguments(name, args)?;
    spend(name, args.iter().map(weight).fold(0, usize::saturating_add))?;
    let out = inner.call(state, args)?;
    let size = weight(&out);
    if size > MAX_VALUE_BYTES {
        return Err(too_large(name, size));
    }
    spend(name, size)?;
    Ok(out)
}

/// What a value costs to read or build: a string's bytes, a sequence's or map's items (their
/// contents were charged when they were made), 1 for anything else.
fn weight(v: &JinjaValue) -> usize {
    v.as_str().map(str::len).or_else(|| v.len()).unwrap_or(1)
}

/// The builtins whose arguments size what they build, bounded before they run.
fn check_size_arguments(name: &str, args: &[JinjaValue]) -> Result<(), minijinja::Error> {
    match name {
        // `batch(n)` reserves n slots; `slice(n)` makes n lists.
        "batch" | "slice" => match args.get(1).and_then(number) {
            Some(n) if n > MAX_RANGE as f64 => Err(limit_error(format!("{name} into {n} parts; at most {MAX_RANGE}"))),
            _ => Ok(()),
        },
        // A width or precision is a buffer of that many bytes, whatever the value.
        "format" => match args.first().and_then(JinjaValue::as_str).map(widest_conversion) {
            Some(w) if w > MAX_FORMAT_WIDTH => {
                Err(limit_error(format!("a format width or precision of {w}; at most {MAX_FORMAT_WIDTH}")))
            }
            _ => Ok(()),
        },
        _ => Ok(()),
    }
}

fn number(v: &JinjaValue) -> Option<f64> {
    if v.kind() == minijinja::value::ValueKind::Number { f64::try_from(v.clone()).ok() } else { None }
}

/// The largest width or precision a printf-style format string asks for (`%10.2f` asks 10):
/// minijinja's `format` takes both from the string only (no `*`).
fn widest_conversion(spec: &str) -> u64 {
    fn digits(b: &[u8], mut i: usize) -> (u64, usize) {
        let mut n = 0u64;
        while let Some(d @ b'0'..=b'9') = b.get(i) {
            n = n.saturating_mul(10).saturating_add(u64::from(d - b'0'));
            i += 1;
        }
        (n, i)
    }
    let b = spec.as_bytes();
    let (mut widest, mut i) = (0u64, 0usize);
    while i < b.len() {
        if b[i] != b'%' {
            i += 1;
            continue;
        }
        i += 1;
        match b.get(i) {
            Some(b'%') => {
                i += 1;
                continue;
            }
            Some(b'(') => {
                while i < b.len() && b[i] != b')' {
                    i += 1;
                }
                i += 1;
            }
            _ => {}
        }
        while matches!(b.get(i), Some(b'#' | b'0' | b'-' | b' ' | b'+')) {
            i += 1;
        }
        let (width, next) = digits(b, i);
        i = next;
        widest = widest.max(width);
        if b.get(i) == Some(&b'.') {
            let (precision, next) = digits(b, i + 1);
            i = next;
            widest = widest.max(precision);
        }
    }
    widest
}

thread_local! {
    /// What the render running on this thread may still spend ([`with_budget`]). A render is
    /// synchronous: it never moves threads and never interleaves with another on one thread.
    static WORK_LEFT: Cell<usize> = const { Cell::new(0) };
}

/// Runs one render with a full budget of [`MAX_WORK`].
pub(super) fn with_budget<R>(render: impl FnOnce() -> R) -> R {
    struct Restore(usize);
    impl Drop for Restore {
        fn drop(&mut self) {
            WORK_LEFT.with(|w| w.set(self.0));
        }
    }
    let _restore = Restore(WORK_LEFT.with(|w| w.replace(MAX_WORK)));
    render()
}

fn spend(what: &str, units: usize) -> Result<(), minijinja::Error> {
    WORK_LEFT.with(|left| match left.get().checked_sub(units) {
        Some(rest) => {
            left.set(rest);
            Ok(())
        }
        None => {
            left.set(0);
            Err(limit_error(format!(
                "the filters and functions of one render read and build more than {MAX_WORK} bytes (at `{what}`)"
            )))
        }
    })
}

fn limit_error(detail: String) -> minijinja::Error {
    minijinja::Error::new(ErrorKind::InvalidOperation, format!("{LIMIT}{detail}"))
}

fn too_large(what: &str, size: usize) -> minijinja::Error {
    limit_error(format!("{what} would be {size} bytes or items; at most {MAX_VALUE_BYTES}"))
}

fn range(lower: i64, upper: Option<i64>, step: Option<i64>) -> Result<JinjaValue, minijinja::Error> {
    let (lower, upper) = match upper {
        Some(upper) => (lower, upper),
        None => (0, lower),
    };
    let step = step.unwrap_or(1);
    if step == 0 {
        return Err(minijinja::Error::new(ErrorKind::InvalidOperation, "cannot create range with step of 0"));
    }
    let span = if step > 0 { upper.saturating_sub(lower) } else { lower.saturating_sub(upper) };
    let len = if span <= 0 { 0 } else { (span as u64).div_ceil(step.unsigned_abs()) };
    if len > MAX_RANGE as u64 {
        return Err(limit_error(format!("range of {len} elements; at most {MAX_RANGE}")));
    }
    let items: Vec<i64> = std::iter::successors(Some(lower), |i| i.checked_add(step))
        .take_while(|i| if step > 0 { *i < upper } else { *i > upper })
        .take(MAX_RANGE)
        .collect();
    Ok(JinjaValue::from(items))
}

fn join(state: &State, value: &JinjaValue, joiner: Option<StringInput<'_>>) -> Result<JinjaValue, minijinja::Error> {
    let joiner_len = joiner.as_ref().map_or(0, |j| j.as_str().len());
    let mut bytes = 0usize;
    for (i, item) in value.try_iter()?.enumerate() {
        bytes += item.as_str().map_or_else(|| item.to_string().len(), str::len) + if i > 0 { joiner_len } else { 0 };
        if bytes > MAX_VALUE_BYTES {
            return Err(too_large("join", bytes));
        }
    }
    minijinja::filters::join(state, value, joiner)
}

fn replace(
    state: &State,
    value: StringInput<'_>,
    from: StringInput<'_>,
    to: StringInput<'_>,
) -> Result<JinjaValue, minijinja::Error> {
    let (v, f) = (value.as_str(), from.as_str());
    let count = if f.is_empty() { v.chars().count() + 1 } else { v.matches(f).count() };
    let bytes =
        (v.len() - count.saturating_mul(f.len()).min(v.len())).saturating_add(count.saturating_mul(to.as_str().len()));
    if bytes > MAX_VALUE_BYTES {
        return Err(too_large("replace", bytes));
    }
    minijinja::filters::replace(state, value, from, to)
}

fn indent(
    value: StringInput<'_>,
    width: Option<usize>,
    first: Option<bool>,
    blank: Option<bool>,
    kwargs: Kwargs,
) -> Result<JinjaValue, minijinja::Error> {
    let width_given = match width {
        Some(w) => w,
        None => kwargs.get::<Option<usize>>("width")?.unwrap_or(4),
    };
    let lines = value.as_str().lines().count() + 1;
    let bytes = value.as_str().len().saturating_add(lines.saturating_mul(width_given));
    if bytes > MAX_VALUE_BYTES {
        return Err(too_large("indent", bytes));
    }
    minijinja::filters::indent(value, width, first, blank, kwargs)
}

/// minijinja's `divisibleby` panics on a zero divisor (and on `i128::MIN % -1`).
fn divisibleby(v: &JinjaValue, by: &JinjaValue) -> bool {
    match (i128::try_from(v.clone()), i128::try_from(by.clone())) {
        (Ok(a), Ok(b)) => a.checked_rem(b) == Some(0),
        _ => match (f64::try_from(v.clone()), f64::try_from(by.clone())) {
            (Ok(a), Ok(b)) if b != 0.0 => a % b == 0.0,
            _ => false,
        },
    }
}

fn escape(state: &State, value: &JinjaValue) -> Result<JinjaValue, minijinja::Error> {
    // `&quot;` is the longest entity: six bytes for one.
    let bytes = value.as_str().map_or(0, str::len).saturating_mul(6);
    if bytes > MAX_VALUE_BYTES * 6 {
        return Err(too_large("escape", bytes / 6));
    }
    minijinja::filters::escape(state, value)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_widest_conversion_of_a_format_string() {
        for (spec, widest) in [
            ("%s", 0),
            ("%10.2f", 10),
            ("%.300f", 300),
            ("%-1000000000000000s", 1_000_000_000_000_000),
            ("100%% of %(name)8s", 8),
            ("%+#012x", 12),
            ("order 123456789: %s", 0),
            ("%99999999999999999999999s", u64::MAX),
        ] {
            assert_eq!(widest_conversion(spec), widest, "{spec}");
        }
    }

    #[test]
    fn only_the_allowlist_is_registered() {
        let env = environment();
        let mut env = env;
        for (source, refused) in [
            ("{{ debug() }}", "debug"),
            ("{{ namespace() }}", "namespace"),
            ("{{ x|tojson }}", "tojson"),
            ("{{ x|urlencode }}", "urlencode"),
        ] {
            env.add_template_owned("t.txt", source.to_owned()).unwrap();
            let r = env.get_template("t.txt").unwrap().render(minijinja::context! { x => "a" });
            let e = r.unwrap_err().to_string();
            assert!(e.contains("unknown") && e.contains(refused), "{source}: {e}");
        }
    }

    #[test]
    fn divisibleby_never_divides_by_zero() {
        let v = |n: i64| JinjaValue::from(n);
        assert!(divisibleby(&v(42), &v(2)));
        assert!(!divisibleby(&v(42), &v(0)));
        assert!(!divisibleby(&JinjaValue::from(i128::MIN), &v(-1)) || i128::MIN.checked_rem(-1).is_some());
        assert!(!divisibleby(&JinjaValue::from(1.5), &JinjaValue::from(0.0)));
        assert!(divisibleby(&JinjaValue::from(3.0), &JinjaValue::from(1.5)));
    }

    #[test]
    fn a_budget_is_per_render_and_spent_by_every_call() {
        let left = |f: &dyn Fn()| {
            with_budget(|| {
                f();
                WORK_LEFT.with(Cell::get)
            })
        };
        assert_eq!(left(&|| {}), MAX_WORK);
        assert_eq!(left(&|| spend("x", 10).unwrap()), MAX_WORK - 10);
        let e = with_budget(|| spend("upper", MAX_WORK + 1)).unwrap_err();
        assert!(e.to_string().contains("at `upper`"), "{e}");
        // Outside a render nothing may be spent.
        assert!(spend("x", 1).is_err());
    }
}
