//! `tidings import` end to end: the binary against a temporary embedded store, a CSV of 100
//! users, NDJSON, and a Pinpoint export (the fixture `fixtures/pinpoint-endpoints.jsonl`,
//! gzipped here into two files as an export job leaves them); each run again writes nothing;
//! a missing store is refused, not made; `tidings bench import` on a few hundred users.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output};

use serde_json::{Value, json};
use tidings_core::keys;
use tidings_core::people::devices::Device;
use tidings_core::people::preferences::Preferences;
use tidings_core::people::users::User;
use tidings_core::ports::{QueryOpts, Table};
use tidings_core::{TenantId, notify::model::Category};

fn tidings(args: &[&str], data_dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tidings"))
        .args(args)
        .env("TIDINGS_DATA_DIR", data_dir)
        .env("TIDINGS_BACKEND", "embedded")
        .env("TIDINGS_LOG", "warn")
        .output()
        .expect("the tidings binary runs")
}

/// Runs the command, which must succeed, and returns its stdout's JSON and its stderr.
fn ok(args: &[&str], data_dir: &Path) -> (Value, String) {
    let out = tidings(args, data_dir);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "tidings {args:?} failed:\nstdout:\n{stdout}\nstderr:\n{stderr}");
    let json =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}):\n{stdout}"));
    (json, stderr)
}

/// A store made the way an operator makes one (`--bootstrap`).
fn store(dir: &Path) -> std::path::PathBuf {
    let data = dir.join("data");
    ok(&["keys", "list", "--bootstrap"], &data);
    data
}

fn open(data: &Path) -> tidings_embedded::EmbeddedStore {
    tidings_embedded::EmbeddedStore::open(&data.join("tidings.db")).unwrap()
}

async fn user(store: &tidings_embedded::EmbeddedStore, t: &str, id: &str) -> Option<User> {
    let t = TenantId::parse(t).unwrap();
    store.get(&keys::user(&t, id)).await.unwrap().map(|i| i.parse().unwrap())
}

async fn preferences(store: &tidings_embedded::EmbeddedStore, t: &str, id: &str) -> Option<Preferences> {
    let t = TenantId::parse(t).unwrap();
    store.get(&keys::preferences(&t, id)).await.unwrap().map(|i| i.parse().unwrap())
}

async fn devices(store: &tidings_embedded::EmbeddedStore, t: &str, id: &str) -> Vec<Device> {
    let t = TenantId::parse(t).unwrap();
    let page = store
        .query(&keys::user_pk(&t, id), keys::DEVICE_SK_PREFIX, QueryOpts { limit: 100, ..QueryOpts::default() })
        .await
        .unwrap();
    page.items.iter().map(|i| i.parse().unwrap()).collect()
}

#[test]
fn a_missing_store_is_refused_and_not_made() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("users.csv");
    std::fs::write(&csv, "user_id,email\nu1,a@example.com\n").unwrap();
    let missing = dir.path().join("no-such-store");
    let out = tidings(&["import", "users", csv.to_str().unwrap(), "--tenant", "shop"], &missing);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("no Tidings store at") && stderr.contains(&missing.display().to_string()), "{stderr}");
    assert!(stderr.contains("--bootstrap"), "says how to make one: {stderr}");
    assert!(!missing.exists(), "nothing was created at {}", missing.display());
    assert!(out.stdout.is_empty(), "no summary for a refused run");
}

/// 100 users from CSV: each stored as given (phone in E.164, tags, zone), opt-outs as
/// unsubscribes, and the users list; the same file again writes nothing (`updated_at` kept).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_csv_of_100_users_is_imported_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = store(dir.path());
    let csv = dir.path().join("users.csv");
    let mut f = std::fs::File::create(&csv).unwrap();
    writeln!(f, "user_id,email,phone,locale,timezone,tags,marketing_opt_out,first_name").unwrap();
    for i in 0..100 {
        let phone = if i % 2 == 0 { format!("+1 415 555 01{:02}", i % 100) } else { String::new() };
        writeln!(f, "c{i:03},c{i}@example.com,{phone},en,Europe/Berlin,news;g{},{},Name {i}", i % 3, i % 10 == 0)
            .unwrap();
    }
    drop(f);
    let path = csv.to_str().unwrap();
    let (first, stderr) = ok(&["import", "users", path, "--tenant", "shop"], &data);
    assert_eq!(first["format"], "csv");
    assert_eq!(
        (first["records"].clone(), first["users"].clone(), first["users_unchanged"].clone()),
        (json!(100), json!(100), json!(0)),
        "{first}"
    );
    assert_eq!((first["opt_outs"].clone(), first["errors_total"].clone()), (json!(10), json!(0)), "{first}");
    assert_eq!(first["ignored_columns"], json!(["first_name"]));
    assert!(stderr.contains("import: 100 users from users.csv in "), "the closing line: {stderr}");

    let store = open(&data);
    let u = user(&store, "shop", "c042").await.unwrap();
    assert_eq!(
        (u.email.as_deref(), u.phone.as_deref(), u.timezone.as_deref(), u.tags.clone()),
        (
            Some("c42@example.com"),
            Some("+14155550142"),
            Some("Europe/Berlin"),
            vec!["news".to_owned(), "g0".to_owned()]
        )
    );
    let prefs = preferences(&store, "shop", "c010").await.unwrap();
    assert!(!prefs.category_on(Category::Marketing) && prefs.category_on(Category::Transactional));
    assert!(preferences(&store, "shop", "c011").await.is_none(), "no opt-out, no preferences written");
    assert!(user(&store, "other", "c042").await.is_none(), "the tenant's own");
    drop(store);

    let (again, _) = ok(&["import", "users", path, "--tenant", "shop"], &data);
    assert_eq!((again["users"].clone(), again["users_unchanged"].clone()), (json!(100), json!(100)), "{again}");
    assert_eq!((again["opt_outs"].clone(), again["opt_outs_unchanged"].clone()), (json!(0), json!(10)), "{again}");
    let store = open(&data);
    assert_eq!(user(&store, "shop", "c042").await.unwrap().updated_at, u.updated_at, "not written again");
}

#[test]
fn ndjson_users_and_their_errors_by_line() {
    let dir = tempfile::tempdir().unwrap();
    let data = store(dir.path());
    let file = dir.path().join("users.jsonl");
    std::fs::write(
        &file,
        "{\"user_id\":\"n1\",\"email\":\"n1@example.com\",\"tags\":[\"vip\"]}\n\
         {\"user_id\":\"n2\",\"email\":\"not an address\"}\n\
         {\"user_id\":\"n3\",\"timezone\":\"Asia/Shanghai\",\"marketing_opt_out\":true}\n",
    )
    .unwrap();
    let (summary, stderr) = ok(&["import", "users", file.to_str().unwrap(), "--tenant", "shop"], &data);
    assert_eq!(
        (summary["format"].clone(), summary["users"].clone(), summary["opt_outs"].clone()),
        (json!("ndjson"), json!(2), json!(1)),
        "{summary}"
    );
    assert_eq!(summary["errors_total"], 1);
    assert_eq!(summary["errors"][0]["at"], "users.jsonl line 2");
    assert_eq!(summary["errors"][0]["field"], "email");
    assert!(stderr.contains("1 record(s) or address(es) not imported"), "{stderr}");
}

/// A Pinpoint export: two gzip files of endpoint JSON. Each person's endpoints fold into one
/// user (latest active address per channel, devices, the zone), opt-outs leave marketing, what
/// Tidings cannot take is counted or named; the same export again writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinpoint_export_becomes_users_devices_and_opt_outs() {
    use flate2::Compression;
    use flate2::write::GzEncoder;
    let dir = tempfile::tempdir().unwrap();
    let data = store(dir.path());
    let fixture =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/pinpoint-endpoints.jsonl"))
            .unwrap();
    let export = dir.path().join("export").join("a1b2c3d4e5");
    std::fs::create_dir_all(&export).unwrap();
    let lines: Vec<&str> = fixture.lines().collect();
    for (n, part) in lines.chunks(6).enumerate() {
        let mut gz =
            GzEncoder::new(std::fs::File::create(export.join(format!("{n}.gz"))).unwrap(), Compression::default());
        for line in part {
            writeln!(gz, "{line}").unwrap();
        }
        gz.finish().unwrap();
    }
    let path = dir.path().join("export");
    let path = path.to_str().unwrap();
    let (s, stderr) = ok(&["import", "pinpoint", path, "--tenant", "shop"], &data);
    assert_eq!(s["format"], "pinpoint");
    assert_eq!((s["files"].clone(), s["records"].clone()), (json!(2), json!(11)), "{s}");
    assert_eq!(
        (s["users"].clone(), s["devices"].clone(), s["opt_outs"].clone()),
        (json!(4), json!(2), json!(2)),
        "{s}"
    );
    assert_eq!((s["endpoints_without_user"].clone(), s["inactive_endpoints"].clone()), (json!(1), json!(1)), "{s}");
    assert_eq!((s["skipped_channels"].clone(), s["dropped_timezones"].clone()), (json!({"VOICE": 1}), json!(1)), "{s}");
    assert_eq!(s["errors_total"], 1, "{s}");
    assert_eq!(s["errors"][0]["field"], "Address");
    assert!(s["errors"][0]["at"].as_str().unwrap().contains("(endpoint ep-kim-email)"), "{s}");
    assert!(stderr.contains("read: 11 endpoints in 2 files in "), "{stderr}");

    let store = open(&data);
    let ada = user(&store, "shop", "cust-1001").await.unwrap();
    assert_eq!(
        (ada.email.as_deref(), ada.phone.as_deref(), ada.timezone.as_deref(), ada.locale.as_deref()),
        (Some("ada.lovelace@example.com"), Some("+447400123456"), Some("Europe/London"), Some("en_GB"))
    );
    let ada_devices = devices(&store, "shop", "cust-1001").await;
    assert_eq!(ada_devices.len(), 1);
    assert_eq!(ada_devices[0].platform.as_str(), "ios");
    assert!(
        !preferences(&store, "shop", "cust-1001").await.unwrap().category_on(Category::Marketing),
        "opted out by SMS"
    );
    let li = user(&store, "shop", "cust-1002").await.unwrap();
    assert_eq!(
        (li.email.as_deref(), li.timezone.as_deref()),
        (Some("li.wei@example.cn"), Some("Asia/Shanghai")),
        "not the inactive one"
    );
    assert_eq!(devices(&store, "shop", "cust-1002").await[0].platform.as_str(), "android");
    assert!(preferences(&store, "shop", "cust-1002").await.is_none());
    let sam = user(&store, "shop", "cust-1003").await.unwrap();
    assert_eq!(sam.phone.as_deref(), Some("+14155550100"));
    assert!(!preferences(&store, "shop", "cust-1003").await.unwrap().category_on(Category::Marketing));
    let kim = user(&store, "shop", "cust-1004").await.unwrap();
    assert_eq!((kim.email, kim.timezone), (None, None), "imported without the refused address and zone");
    drop(store);

    let (again, _) = ok(&["import", "pinpoint", path, "--tenant", "shop"], &data);
    assert_eq!(
        [
            &again["users_unchanged"],
            &again["devices"],
            &again["devices_unchanged"],
            &again["opt_outs"],
            &again["opt_outs_unchanged"]
        ],
        [&json!(4), &json!(0), &json!(2), &json!(0), &json!(2)],
        "{again}"
    );
}

#[test]
fn the_import_bench_imports_both_sources_and_the_rerun_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (report, stderr) = ok(&["bench", "import", "--users", "300"], dir.path());
    assert_eq!(report["users"], 300);
    for source in ["csv", "pinpoint"] {
        assert_eq!(report[source]["import"]["users"], 300, "{report}");
        assert_eq!(report[source]["import"]["errors"], 0, "{report}");
        assert_eq!(report[source]["again"]["users_unchanged"], 300, "{report}");
        assert!(report[source]["import"]["users_per_s"].as_f64().unwrap() > 0.0, "{report}");
    }
    assert_eq!(report["pinpoint"]["import"]["devices"], 120, "two in five have a device: {report}");
    assert_eq!(report["pinpoint"]["again"]["devices_unchanged"], 120, "{report}");
    assert!(stderr.contains("generate: sources written in "), "{stderr}");
}
