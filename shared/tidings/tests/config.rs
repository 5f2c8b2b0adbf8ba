//! The configuration is checked when the binary starts: a malformed `TIDINGS_*` value stops it,
//! naming the variable; a misspelt name is named in a warning with the name it was meant to be.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Command, Output};

fn tidings(args: &[&str], vars: &[(&str, &str)]) -> (Output, String) {
    let data_dir = std::env::temp_dir().join(format!("tidings-config-test-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_tidings"))
        .args(args)
        .env("TIDINGS_DATA_DIR", &data_dir)
        .env("TIDINGS_BACKEND", "embedded")
        .env("TIDINGS_LOG", "warn")
        // Port 0: should the start go through, it would not take a port another test uses.
        .env("TIDINGS_ADDR", "127.0.0.1:0")
        .envs(vars.iter().copied())
        .output()
        .expect("the tidings binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stderr)
}

#[test]
fn a_malformed_number_stops_serve_naming_the_variable() {
    let (out, stderr) = tidings(&["serve"], &[("TIDINGS_MAX_RECEIVES", "five")]);
    assert!(!out.status.success(), "serve started with TIDINGS_MAX_RECEIVES=five:\n{stderr}");
    assert!(stderr.contains("TIDINGS_MAX_RECEIVES") && stderr.contains("five"), "{stderr}");
}

#[test]
fn a_misspelt_name_is_named_in_a_warning_with_the_name_meant() {
    let (out, stderr) = tidings(&["config"], &[("TIDINGS_MAX_RECIEVES", "5")]);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("TIDINGS_MAX_RECIEVES") && stderr.contains("did you mean TIDINGS_MAX_RECEIVES"),
        "{stderr}"
    );
}

/// Runs `tidings args` with only the given `TIDINGS_*` variables (and a quiet log).
fn tidings_with(args: &[&str], vars: &[(&str, &str)]) -> (Output, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tidings"));
    for (name, _) in std::env::vars().filter(|(n, _)| n.starts_with("TIDINGS_")) {
        command.env_remove(name);
    }
    let out = command.args(args).env("TIDINGS_LOG", "warn").envs(vars.iter().copied()).output().expect("runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "tidings {args:?} failed:\n{stdout}\n{stderr}");
    (out, stdout, stderr)
}

/// `tidings config --json`: every variable with its value and where it comes from
/// (environment, flag, data directory, default), no secret shown, unknown names listed.
#[test]
fn config_shows_each_value_in_effect_and_where_it_comes_from() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let data_arg = data.to_str().expect("utf-8");
    let vars = [
        ("TIDINGS_MAX_RECEIVES", "7"),
        ("TIDINGS_API_KEYS", "acme:0123456789abcdefgh"),
        ("TIDINGS_OPERATOR_KEYS", "operator-secret-0123456"),
        ("TIDINGS_MAX_RECIEVES", "3"),
    ];
    let (_, stdout, _) = tidings_with(&["config", "--json", "--data-dir", data_arg], &vars);
    let doc: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}:\n{stdout}"));
    let vars_shown = doc["variables"].as_array().expect("variables");
    let of = |name: &str| {
        vars_shown.iter().find(|v| v["name"] == name).unwrap_or_else(|| panic!("{name} missing:\n{stdout}")).clone()
    };
    assert_eq!(
        (of("TIDINGS_MAX_RECEIVES")["value"].clone(), of("TIDINGS_MAX_RECEIVES")["source"].clone()),
        ("7".into(), "environment".into())
    );
    assert_eq!(of("TIDINGS_RETRY_BASE_MS")["source"], "default");
    assert_eq!(of("TIDINGS_RETRY_BASE_MS")["value"], "10000");
    assert_eq!(of("TIDINGS_SNS_TOPIC_ARNS")["source"], "unset");
    assert_eq!(of("TIDINGS_API_KEYS")["value"], "acme:****");
    assert_eq!(of("TIDINGS_OPERATOR_KEYS")["value"], "****");
    assert_eq!(of("TIDINGS_OPERATOR_KEYS")["secret"], true);
    assert!(!stdout.contains("0123456789abcdefgh") && !stdout.contains("operator-secret"), "a secret shown:\n{stdout}");
    let data_dir = of("TIDINGS_DATA_DIR");
    assert_eq!((data_dir["value"].as_str(), data_dir["source"].as_str()), (Some(data_arg), Some("flag")));
    assert!(data_dir["note"].as_str().unwrap_or_default().starts_with("no Tidings store here"), "{data_dir}");
    assert_eq!(
        doc["unknown"],
        serde_json::json!([{"name": "TIDINGS_MAX_RECIEVES", "did_you_mean": "TIDINGS_MAX_RECEIVES"}])
    );
    // Every variable a deployment reads, once.
    for v in tidings_core::config::VARIABLES.iter().filter(|v| v.reader != tidings_core::config::Reader::Tests) {
        if !v.name.contains('<') {
            assert_eq!(vars_shown.iter().filter(|s| s["name"] == v.name).count(), 1, "{}", v.name);
        }
    }

    // Once a store is there, its keys stand in for unset variables, masked.
    tidings_with(&["keys", "list", "--bootstrap", "--data-dir", data_arg], &[]);
    let (_, stdout, _) = tidings_with(&["config", "--json"], &[("TIDINGS_DATA_DIR", data_arg)]);
    let doc: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    let signing =
        doc["variables"].as_array().and_then(|v| v.iter().find(|v| v["name"] == "TIDINGS_SIGNING_KEYS").cloned());
    let signing = signing.expect("TIDINGS_SIGNING_KEYS");
    assert_eq!((signing["value"].as_str(), signing["source"].as_str()), (Some("local:****"), Some("data_directory")));
    let key = std::fs::read_to_string(data.join("signing-key")).expect("the signing key");
    assert!(!stdout.contains(key.trim()), "the signing key shown");
    let data_dir =
        doc["variables"].as_array().and_then(|v| v.iter().find(|v| v["name"] == "TIDINGS_DATA_DIR").cloned());
    let data_dir = data_dir.expect("TIDINGS_DATA_DIR");
    assert_eq!(data_dir["source"], "environment");
    assert_eq!(data_dir["note"], "a Tidings store (tidings.db)");
}

/// Without `--json`, one line per variable (name, value, source); `--table` is docs/configuration.md's.
#[test]
fn config_prints_a_line_per_variable_and_the_readme_table_on_request() {
    let (_, stdout, _) =
        tidings_with(&["config"], &[("TIDINGS_MAX_RECEIVES", "7"), ("TIDINGS_API_KEYS", "acme:0123456789abcdefgh")]);
    let line = |name: &str| {
        stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("{name}:\n{stdout}"))
    };
    assert!(line("TIDINGS_MAX_RECEIVES").ends_with(" 7  (environment)"), "{stdout}");
    assert!(line("TIDINGS_RETRY_CAP_MS").ends_with(" 900000  (default)"), "{stdout}");
    assert!(line("TIDINGS_API_KEYS").contains(" acme:****  (environment)"), "{stdout}");
    assert!(!stdout.contains("0123456789abcdefgh"), "{stdout}");
    let (_, table, _) = tidings_with(&["config", "--table"], &[]);
    assert_eq!(table, tidings_core::config::markdown_table());
}
