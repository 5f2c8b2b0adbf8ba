//! Hostile template sources, generated: huge numbers into every filter, test and function
//! argument, chains of filters, nested loops and string growth, rendered as a save (the trial
//! render) and as a send with hostile params. A template is tenant input rendered in workers
//! every tenant shares (docs/templates.md, "Limits"): no source and no params may end the
//! process or grow it past the budget.
//!
//! `a_process_rendering_every_hostile_source_under_a_memory_limit_never_dies` runs the same
//! corpus again in a child process (this test binary) with its address space limited: a failed
//! allocation aborts a Rust process, so an unbounded builtin shows up as the child's death,
//! and the child also checks how far its peak resident memory grew.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tidings_core::ports::Channel;
use tidings_core::templates::{ENGINE_FAILED, LocaleContent, MAX_VALUE_BYTES, Template, TemplateError};

/// The filters of the engine's allowlist, and names that must not exist.
const FILTERS: &[&str] = &[
    "abs",
    "attr",
    "batch",
    "bool",
    "capitalize",
    "chain",
    "count",
    "d",
    "default",
    "dictsort",
    "e",
    "escape",
    "first",
    "float",
    "format",
    "groupby",
    "indent",
    "int",
    "items",
    "join",
    "last",
    "length",
    "lines",
    "list",
    "lower",
    "map",
    "max",
    "min",
    "pprint",
    "reject",
    "rejectattr",
    "replace",
    "reverse",
    "round",
    "safe",
    "select",
    "selectattr",
    "slice",
    "sort",
    "split",
    "string",
    "sum",
    "title",
    "trim",
    "unique",
    "upper",
    "zip",
    "tojson",
    "urlencode",
    "center",
    "wordwrap",
    "truncate",
];
const TESTS: &[&str] =
    &["divisibleby", "startingwith", "endingwith", "sameas", "eq", "lt", "in", "filter", "test", "odd", "string"];
/// What gets filtered.
const INPUTS: &[&str] = &["[]", "'x'", "p", "items", "range(1000)", "m", "1.5", "n", "(p ~ p ~ p ~ p)"];
/// Arguments that ask for the most.
const ARGS: &[&str] = &[
    "1000000000000000",
    "-1000000000000000",
    "9223372036854775807",
    "18446744073709551615",
    "1e300",
    "100000000",
    "0",
    "-1",
    "n",
    "p",
    "items",
    "'%1000000000000000s'",
    "w",
    "true",
    "none",
    "'upper'",
    "'format'",
];

/// The params of a hostile send: every value at its limit.
fn params() -> Value {
    let m: serde_json::Map<String, Value> = (0..100).map(|i| (format!("k{i}"), json!("v".repeat(300)))).collect();
    json!({
        "p": "x".repeat(MAX_VALUE_BYTES),
        "items": (0..1000).map(|i| format!("item-{i}-{}", "y".repeat(20))).collect::<Vec<_>>(),
        "m": m,
        "n": 1_000_000_000_000_000_u64,
        "w": "%1000000000000000s",
    })
}

/// One of `from`, by the run's seeded generator.
fn pick<'a>(rng: &mut StdRng, from: &[&'a str]) -> &'a str {
    from.choose(rng).copied().unwrap_or_default()
}

fn corpus() -> Vec<String> {
    let mut out = Vec::new();
    // Every filter, from every input, with every hostile argument, alone, twice and as a kwarg.
    for f in FILTERS {
        for input in INPUTS {
            out.push(format!("{{{{ {input}|{f} }}}}"));
            for a in ARGS {
                out.push(format!("{{{{ {input}|{f}({a}) }}}}"));
            }
            out.push(format!("{{{{ {input}|{f}(width=n, attribute='x', indent=n, count=n) }}}}"));
        }
    }
    for t in TESTS {
        for input in INPUTS {
            for a in ARGS {
                out.push(format!("{{{{ {input} is {t}({a}) }}}}"));
            }
        }
    }
    for a in ARGS {
        for b in ARGS {
            out.push(format!("{{{{ range({a}, {b})|length }}}}"));
        }
        out.push(format!(
            "{{{{ range({a})|length }}}}{{{{ dict(a={a})|length }}}}{{{{ debug() }}}}{{{{ namespace() }}}}"
        ));
        out.push(format!("{{{{ ('%' ~ {a} ~ 's')|format('x') }}}}"));
    }
    // Loops within loops, and growth through every way a value can grow.
    out.extend([
        "{% for a in range(1000) %}{% for b in range(1000) %}{{ p }}{% endfor %}{% endfor %}".to_owned(),
        "{% for a in items %}{% for b in items %}{{ a ~ b ~ p }}{% endfor %}{% endfor %}".to_owned(),
        "{% for i in range(1000) %}{{ p|list|sort|unique|list|length }}{% endfor %}".to_owned(),
        "{% for i in range(1000) %}{{ p|list|batch(1)|map('list')|list|length }}{% endfor %}".to_owned(),
        "{% for x in p %}{{ (p ~ p ~ p ~ p ~ p ~ p ~ p ~ p)|length }}{% endfor %}".to_owned(),
        "{{ (p ~ p ~ p ~ p ~ p ~ p ~ p ~ p ~ p ~ p ~ p ~ p ~ p ~ p ~ p ~ p)|escape|escape|escape }}".to_owned(),
        "{{ p|replace('x', p)|replace('x', p) }}".to_owned(),
        "{{ items|join(p)|join(p) }}".to_owned(),
        "{{ p|list|join(p) }}".to_owned(),
        "{{ p|pprint|pprint|pprint|pprint }}".to_owned(),
        "{{ m|items|list|pprint }}{{ m|dictsort|pprint }}".to_owned(),
        "{{ items|map('format', n)|list }}".to_owned(),
        "{{ items|map('indent', 100000000)|join }}".to_owned(),
        "{{ items|select('divisibleby', 0)|list }}".to_owned(),
        "{{ items|groupby('x')|list }}{{ items|zip(items, items, items)|list|length }}".to_owned(),
        "{{ items|chain(items, items, items, items)|list|length }}".to_owned(),
        "{{ p[::-1] ~ ''[::-1] ~ [][::-1] ~ p[1000000000000000:] ~ p[:1000000000000000] }}".to_owned(),
        "{{ p[-1000000000000000:1000000000000000] ~ items[1000000000000000:-1000000000000000]|length }}".to_owned(),
        "{% filter upper %}{% for i in range(1000) %}{{ p }}{% endfor %}{% endfilter %}".to_owned(),
        "{% macro m() %}{{ p }}{{ p }}{% endmacro %}{{ m() ~ m() }}".to_owned(),
        "{{ loop.cycle(p) }}{% for i in range(1000) %}{{ loop.cycle(p, p) }}{{ loop.changed(p) }}{% endfor %}"
            .to_owned(),
        format!("{{{{ [{}]|length }}}}", vec!["p"; 2000].join(",")),
        format!("{{{{ {}p{} }}}}", "[".repeat(5000), "]".repeat(5000)),
        format!("{}x{}", "{% if true %}".repeat(500), "{% endif %}".repeat(500)),
    ]);
    // Random chains of filters with hostile arguments.
    let mut rng = StdRng::seed_from_u64(0x7d1d_1265_0a11_ce55);
    for _ in 0..2000 {
        let mut text = format!("{{{{ {}", pick(&mut rng, INPUTS));
        for _ in 0..rng.random_range(1..=5) {
            let f = pick(&mut rng, FILTERS);
            match rng.random_range(0..3) {
                0 => text.push_str(&format!("|{f}")),
                1 => text.push_str(&format!("|{f}({})", pick(&mut rng, ARGS))),
                _ => text.push_str(&format!("|{f}({}, {})", pick(&mut rng, ARGS), pick(&mut rng, ARGS))),
            }
        }
        text.push_str(" }}");
        if rng.random_ratio(1, 4) {
            text = format!("{{% for i in {} %}}{text}{{% endfor %}}", pick(&mut rng, INPUTS));
        }
        out.push(text);
    }
    out
}

/// A template whose in-app body (plain text) and email HTML part (escaped) are `text`.
fn template(text: &str) -> Template {
    let content = LocaleContent {
        email_subject: Some("s".into()),
        email_html: Some(text.to_owned()),
        inapp_body: Some(text.to_owned()),
        ..LocaleContent::default()
    };
    Template {
        template_id: "hostile".into(),
        default_locale: "en".into(),
        locales: BTreeMap::from([("en".to_owned(), content)]),
        updated_at: String::new(),
    }
}

/// Peak resident memory of this process, from the kernel.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// What a render may grow this process by at most (docs/templates.md, "Limits"): a few values
/// at their limit, their escaped copies and the render's output.
const RENDER_GROWTH_KIB: u64 = 64 * 1024;

const CHILD: &str = "TIDINGS_HOSTILE_TEMPLATES_CHILD";

#[test]
fn every_hostile_source_is_refused_or_renders_within_its_limits() {
    let params = params();
    let corpus = corpus();
    let before = peak_rss_kib();
    let (mut refused, mut rendered) = (0usize, 0usize);
    for text in &corpus {
        // The child's last line on stderr is the source that killed it.
        if std::env::var_os(CHILD).is_some() {
            eprintln!("{text}");
        }
        let t = template(text);
        // Saved: the trial render of both fields. Sent: rendered with the hostile params, as
        // plain text and (one in ten, it costs more) as an escaped HTML part.
        let _ = t.validate();
        let channels: &[Channel] =
            if text.len().is_multiple_of(10) { &[Channel::Inapp, Channel::Email] } else { &[Channel::Inapp] };
        for &channel in channels {
            match t.render(channel, None, &params) {
                Ok(r) => {
                    rendered += 1;
                    assert!(r.body.len() <= 256 * 1024, "{text}: {} bytes", r.body.len());
                }
                // A panic caught around the engine keeps the process alive, but is a bug to find.
                Err(TemplateError::Render(m)) if m == ENGINE_FAILED => panic!("the engine panicked on {text}"),
                Err(TemplateError::Limit(_) | TemplateError::Render(_) | TemplateError::MissingPlaceholder(_)) => {
                    refused += 1
                }
                Err(e) => panic!("{text}: {e:?}"),
            }
        }
    }
    assert!(corpus.len() > 9_000, "{}", corpus.len());
    assert!(refused > 0 && rendered > 0, "refused {refused}, rendered {rendered}");
    // Alone in its process (the child), the growth is this corpus's own.
    if std::env::var_os(CHILD).is_some() {
        let grown = peak_rss_kib().saturating_sub(before);
        assert!(grown < RENDER_GROWTH_KIB, "the renders grew the process by {grown} KiB");
        eprintln!("hostile templates: {} sources, peak grew by {grown} KiB", corpus.len());
    }
}

#[test]
fn a_process_rendering_every_hostile_source_under_a_memory_limit_never_dies() {
    // 512 MiB of address space: the test binary's own mappings (code, one malloc arena, the
    // test thread's stack) take a fraction of it; any builtin that sized a buffer from an
    // argument asked for far more.
    let limit_kib = 512 * 1024;
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!("ulimit -v {limit_kib} && exec \"$0\" \"$@\""))
        .arg(&exe)
        .args([
            "--exact",
            "every_hostile_source_is_refused_or_renders_within_its_limits",
            "--test-threads=1",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .env("MALLOC_ARENA_MAX", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
    assert!(out.status.success(), "the child died ({}); its last lines, newest first: {tail:#?}", out.status);
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(stderr.contains("hostile templates:"), "{tail:#?}");
}
