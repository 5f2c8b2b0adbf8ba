//! `tidings bench reserve --http`: a real `tidings serve` started by the bench, real `wrk`
//! (Debian's package; `make test` installs it) posting single-unit orders over loopback, the
//! server killed after each wrk run and its database read: the stock sold out exactly, every
//! `201` on disk. And the check fails when a load generator claims answers the server never
//! gave (a stand-in that sends nothing and prints a count), so the durability check is real.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Command, Output};

/// A wrk script of the shape the bench reads: unique order ids on the SKU `SKU`, answers
/// counted by status (as `../shared/bench/orders.lua` does).
const ORDERS_LUA: &str = r#"
local counter = 0
local threads = {}
function setup(thread)
  thread:set("tid", #threads)
  table.insert(threads, thread)
end
function init(args)
  key = os.getenv("KEY"); sku = os.getenv("SKU"); run = os.getenv("RUN")
  created, refused, other = 0, 0, 0
end
function request()
  counter = counter + 1
  local body = string.format('{"order_id":"%s-%d-%d","user_id":"buyer","items":[{"sku_id":"%s","qty":1}]}', run, tid, counter, sku)
  return wrk.format("POST", "/v1/orders", {["Content-Type"]="application/json", ["Authorization"]="Bearer " .. key}, body)
end
function response(status, headers, body)
  if status == 201 then created = created + 1 elseif status == 409 then refused = refused + 1 else other = other + 1 end
end
function done(summary, latency, requests)
  local c, r, o = 0, 0, 0
  for _, t in ipairs(threads) do
    c = c + t:get("created"); r = r + t:get("refused"); o = o + t:get("other")
  end
  io.write(string.format("created %d refused %d other %d p50_ms %.2f p99_ms %.2f rps %.0f\n", c, r, o,
    latency:percentile(50)/1000, latency:percentile(99)/1000, summary.requests / (summary.duration/1e6)))
end
"#;

fn bench(dir: &Path, extra: &[&str]) -> Output {
    let script = dir.join("orders.lua");
    std::fs::write(&script, ORDERS_LUA).expect("write the wrk script");
    Command::new(env!("CARGO_BIN_EXE_tidings"))
        .args(["bench", "reserve", "--http", "--no-peer", "--wrk-threads", "1", "--wrk-script"])
        .arg(&script)
        .args(extra)
        .env("TIDINGS_LOG", "warn")
        .env_remove("TIDINGS_BENCH_PEERS")
        .env_remove("TIDINGS_API_KEYS")
        .output()
        .expect("the tidings binary runs")
}

fn text(out: &Output) -> String {
    format!("stdout:\n{}\nstderr:\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// The number after `word` on `line`.
fn after(line: &str, word: &str) -> i64 {
    let words: Vec<&str> = line.split([' ', ',', ';']).filter(|w| !w.is_empty()).collect();
    let i = words.iter().position(|w| *w == word).unwrap_or_else(|| panic!("no {word} in {line}"));
    words[i + 1].parse().unwrap_or_else(|_| panic!("{word} is not followed by a number in {line}"))
}

#[test]
fn orders_over_http_sell_the_stock_exactly_and_every_201_survives_a_kill() {
    assert!(
        Command::new("wrk").arg("--version").output().is_ok(),
        "wrk is not installed (Debian: apt-get install wrk; make test installs it)"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    // 150 units for two runs of 3 s: the first sells some or all, the second refuses once gone.
    let out = bench(dir.path(), &["--connections", "2,4", "--seconds", "3", "--units", "150"]);
    assert!(out.status.success(), "the bench failed:\n{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let answers: Vec<&str> = stdout.lines().filter(|l| l.contains("answered 201")).collect();
    assert_eq!(answers.len(), 2, "one line per connection count:\n{stdout}");
    assert_eq!(stdout.matches("invariants hold").count(), 2, "{stdout}");
    let created: i64 = answers.iter().map(|l| after(l, "201")).sum();
    let held: i64 = answers.iter().map(|l| after(l, "-9:")).sum();
    let last = answers[1];
    // Every unit sold, none twice: the last run's counters read the whole stock reserved.
    assert_eq!(after(last, "reserved"), 150, "{stdout}");
    assert_eq!(after(last, "available"), 0, "{stdout}");
    assert_eq!(held, 150, "{stdout}");
    // wrk saw every sale answered except the few in flight when it stopped.
    assert!((150 - 6..=150).contains(&created), "201s {created}:\n{stdout}");
    assert!(after(last, "409") > 0, "the second run finds the SKU sold out:\n{stdout}");
    assert!(stdout.contains("2 connections, 3 s:") && stdout.contains("4 connections, 3 s:"), "{stdout}");
    // After each connection count, the floor: the same wrk against GET /healthz, all answered.
    let floors: Vec<&str> = stdout.lines().filter(|l| l.contains("floor: GET /healthz")).collect();
    assert_eq!(floors.len(), 2, "one floor per connection count:\n{stdout}");
    for line in floors {
        let rate: f64 = line
            .split_whitespace()
            .nth(3)
            .and_then(|w| w.strip_suffix("/s,"))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no rate in {line}"));
        assert!(rate > 0.0, "{line}");
        assert!(line.contains("orders ") && line.contains(" of it"), "{line}");
    }
}

#[test]
fn a_201_the_database_does_not_hold_fails_the_bench() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Sends nothing, claims 40 orders created.
    let liar = dir.path().join("liar-wrk");
    std::fs::write(&liar, "#!/bin/sh\necho 'created 40 refused 0 other 0 p50_ms 1.00 p99_ms 2.00 rps 40'\n")
        .expect("write the stand-in");
    let chmod = Command::new("chmod").arg("+x").arg(&liar).status().expect("chmod");
    assert!(chmod.success());
    let liar = liar.to_string_lossy().into_owned();
    let out = bench(dir.path(), &["--connections", "2", "--seconds", "1", "--units", "100", "--wrk", &liar]);
    assert!(!out.status.success(), "the bench passed a run whose 201s are not on disk:\n{}", text(&out));
    assert!(!text(&out).contains("floor: GET"), "the floor is measured only once the orders' run held");
    let all = text(&out);
    assert!(all.contains("40 orders answered 201 but 0 on disk"), "{all}");
}
