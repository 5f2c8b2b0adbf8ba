//! The `tidings` command cannot mislead: a command other than `serve` finds the store `serve`
//! made or fails saying where it looked (it never makes a new, empty one that answers as if the
//! system had nothing); every command's help has examples; a command that prints JSON prints
//! nothing else on stdout.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Command, Output};

/// Runs `tidings args` in `cwd`, with no `TIDINGS_*` variable but a quiet log.
fn tidings_in(cwd: &Path, args: &[&str]) -> (Output, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tidings"));
    for (name, _) in std::env::vars().filter(|(n, _)| n.starts_with("TIDINGS_")) {
        command.env_remove(name);
    }
    let out = command
        .args(args)
        .current_dir(cwd)
        .env("TIDINGS_LOG", "warn")
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .output()
        .expect("the tidings binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stdout, stderr)
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

#[test]
fn a_command_finds_no_store_in_a_missing_data_dir_and_says_where_it_looked() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nonexistent");
    let (out, stdout, stderr) = tidings_in(dir.path(), &["keys", "list", "--data-dir", missing.to_str().unwrap()]);
    assert!(!out.status.success(), "keys list succeeded without a store:\n{stdout}");
    assert!(stdout.is_empty(), "something on stdout: {stdout}");
    assert!(
        stderr.contains(&format!("no Tidings store at {}", missing.display()))
            && stderr.contains("because --data-dir names it")
            && stderr.contains("--data-dir"),
        "{stderr}"
    );
    assert!(!missing.exists(), "the data directory was made");
}

/// The new user's case: `keys create` and `ops dlq list` run in a directory where no server
/// runs. Each fails naming `./.tidings` and why it looked there, and nothing is made.
#[test]
fn commands_run_where_no_server_runs_make_nothing() {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        &["keys", "create", "--role", "operator"][..],
        &["keys", "list"],
        &["ops", "dlq", "list"],
        &["ops", "dlq", "redrive", "email-low"],
        &["ops", "findings", "list"],
        &["ops", "findings", "settle", "f1", "--kind", "accepted", "--reason", "r"],
        &["ops", "stream-failures", "list"],
    ] {
        let (out, stdout, stderr) = tidings_in(dir.path(), args);
        assert!(!out.status.success(), "{args:?} succeeded without a store:\n{stdout}");
        assert!(stdout.is_empty(), "{args:?}: something on stdout: {stdout}");
        let expected = format!("no Tidings store at {}", dir.path().join(".tidings").display());
        assert!(
            stderr.contains(&expected) && stderr.contains("because --data-dir defaults to ./.tidings"),
            "{args:?}:\n{stderr}"
        );
        assert!(stderr.contains("where `tidings serve` runs"), "{args:?}: no way out given:\n{stderr}");
        assert_eq!(entries(dir.path()), Vec::<String>::new(), "{args:?} made something");
    }
    // TIDINGS_DATA_DIR is named when it is where the command looked.
    let elsewhere = dir.path().join("elsewhere");
    let mut command = Command::new(env!("CARGO_BIN_EXE_tidings"));
    let out = command
        .args(["keys", "list"])
        .current_dir(dir.path())
        .env("TIDINGS_DATA_DIR", &elsewhere)
        .env("TIDINGS_LOG", "warn")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains(&format!("because TIDINGS_DATA_DIR is {}", elsewhere.display())), "{stderr}");
    assert_eq!(entries(dir.path()), Vec::<String>::new());
}

/// What `serve` made, the other commands use; a file that is not a store is refused untouched.
#[test]
fn a_store_that_is_there_is_used_and_a_file_that_is_not_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // `--bootstrap` is the explicit way to make one (as `serve` does at its first start).
    let (out, _, stderr) = tidings_in(dir.path(), &["keys", "list", "--bootstrap"]);
    assert!(out.status.success(), "{stderr}");
    let (out, stdout, stderr) = tidings_in(dir.path(), &["keys", "create", "--role", "operator", "--name", "laptop"]);
    assert!(out.status.success(), "{stderr}");
    let made: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let (out, stdout, stderr) = tidings_in(dir.path(), &["keys", "list"]);
    assert!(out.status.success(), "{stderr}");
    let listed: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert!(listed["keys"].as_array().unwrap().iter().any(|k| k["id"] == made["id"]), "{listed} lacks {made}");

    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("tidings.db"), "not a database").unwrap();
    let (out, _, stderr) = tidings_in(dir.path(), &["keys", "list", "--data-dir", "other"]);
    assert!(!out.status.success());
    assert!(stderr.contains("not a Tidings store"), "{stderr}");
    assert_eq!(std::fs::read_to_string(other.join("tidings.db")).unwrap(), "not a database");
    assert_eq!(entries(&other), ["tidings.db"]);
}

/// stdout of `tidings args` in `cwd`, which must succeed and be one JSON document and nothing else.
fn json_of(cwd: &Path, args: &[&str]) -> serde_json::Value {
    let (out, stdout, stderr) = tidings_in(cwd, args);
    assert!(out.status.success(), "tidings {args:?} failed:\n{stdout}\n{stderr}");
    serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("tidings {args:?}: stdout is not one JSON document ({e}):\n{stdout}"))
}

/// Every command that prints JSON prints that and nothing else on stdout (its summary and
/// progress go to stderr): each one's stdout parses whole.
#[tokio::test]
async fn json_commands_print_json_alone_on_stdout() {
    use tidings_core::ports::Queues;
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path();
    assert_eq!(json_of(cwd, &["keys", "list", "--bootstrap"]), serde_json::json!({"keys": []}));
    let made = json_of(cwd, &["keys", "create", "--role", "tenant", "--tenant", "acme", "--name", "checkout"]);
    let id = made["id"].as_str().unwrap_or_else(|| panic!("no id: {made}")).to_owned();
    assert!(made["key"].is_string(), "{made}");
    assert_eq!(json_of(cwd, &["keys", "list", "--tenant", "acme"])["keys"].as_array().map(Vec::len), Some(1));
    let rotated = json_of(cwd, &["keys", "rotate", &id, "--grace-seconds", "60"]);
    assert!(rotated["new"]["key"].is_string() && rotated["previous"]["id"] == id.as_str(), "{rotated}");
    json_of(cwd, &["keys", "revoke", &id]);

    // A dead letter on email-low's DLQ, put there as a worker would.
    {
        let store = tidings_embedded::EmbeddedStore::open(&cwd.join(".tidings").join("tidings.db")).unwrap();
        store.send_to_dlq("email-low", "not a tidings message".into()).await.unwrap();
    }
    let listed = json_of(cwd, &["ops", "dlq", "list"]);
    let queues = listed["queues"].as_array().unwrap_or_else(|| panic!("{listed}"));
    assert_eq!(queues.len(), tidings_core::messages::ALL_QUEUES.len(), "{listed}");
    let email_low = queues.iter().find(|q| q["name"] == "email-low").unwrap_or_else(|| panic!("{listed}"));
    assert_eq!(email_low["dlq_depth"], 1, "{email_low}");
    assert_eq!(email_low["dead_letters"][0]["kind"], "unknown", "{email_low}");
    assert!(email_low["dead_letters"][0]["reason"].is_string(), "{email_low}");
    assert!(queues.iter().filter(|q| q["name"] != "email-low").all(|q| q["dead_letters"] == serde_json::json!([])));
    assert_eq!(
        json_of(cwd, &["ops", "dlq", "redrive", "email-low"]),
        serde_json::json!({"queue": "email-low", "moved": 1})
    );

    assert_eq!(
        json_of(cwd, &["ops", "findings", "list", "--status", "settled"]),
        serde_json::json!({"items": [], "next_cursor": null})
    );
    let (out, stdout, stderr) =
        tidings_in(cwd, &["ops", "findings", "settle", "f1", "--kind", "accepted", "--reason", "counted"]);
    assert!(!out.status.success() && stdout.is_empty(), "settled a finding that is not there: {stdout}");
    assert!(stderr.contains("finding not found"), "{stderr}");
    assert_eq!(json_of(cwd, &["ops", "stream-failures", "list"]), serde_json::json!({"stream_failures": []}));
    assert_eq!(json_of(cwd, &["ops", "stream-failures", "replay"]), serde_json::json!({"replayed": [], "kept": []}));
    assert!(json_of(cwd, &["config", "--json"])["variables"].is_array());
    assert!(json_of(cwd, &["openapi"])["paths"].is_object());
    let report = json_of(cwd, &["bench", "campaign", "--recipients", "50", "--otp-every-ms", "50", "--no-peer"]);
    assert_eq!(report["delivered_once"], 50, "{report}");
}

/// `tidings --help` and every subcommand's `--help`, as the binary prints them, end with
/// examples; the subcommands are found in each help's `Commands:` list, so a new one is
/// checked too. (That each example parses: the binary's `every_command_has_examples_that_parse`.)
#[test]
fn every_commands_help_has_examples() {
    let dir = tempfile::tempdir().unwrap();
    let mut paths: Vec<Vec<String>> = vec![Vec::new()];
    let mut checked = Vec::new();
    while let Some(path) = paths.pop() {
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        args.push("--help");
        let (out, help, stderr) = tidings_in(dir.path(), &args);
        assert!(out.status.success(), "tidings {args:?}: {stderr}");
        let examples = help.split_once("\nExamples:\n").map(|(_, e)| e).unwrap_or_default();
        assert!(
            examples.lines().next().is_some_and(|l| l.starts_with("  ")),
            "`tidings {}` --help has no examples:\n{help}",
            path.join(" ")
        );
        if let Some((_, commands)) = help.split_once("\nCommands:\n") {
            for line in commands.lines().take_while(|l| l.starts_with("  ")) {
                let name = line.split_whitespace().next().unwrap_or_default();
                if name != "help" {
                    paths.push([path.clone(), vec![name.to_owned()]].concat());
                }
            }
        }
        checked.push(path.join(" "));
    }
    assert_eq!(entries(dir.path()), Vec::<String>::new(), "--help made something");
    for expected in
        ["", "serve", "keys create", "ops dlq list", "ops stream-failures replay", "bench campaign", "config"]
    {
        assert!(checked.iter().any(|c| c == expected), "`{expected}` not checked: {checked:?}");
    }
}
