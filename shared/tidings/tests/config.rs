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
