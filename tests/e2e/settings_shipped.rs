//! A setting an operator got wrong, through the function binaries (the template's environment
//! plus one variable): a malformed `TIDINGS_*` value stops the function's start, naming the
//! variable, instead of leaving its setting on a default; a misspelt name is named in a warning
//! at start, with the name it was probably meant to be.

use serde_json::Value;

use crate::lambda::{Options, Stack};

/// `TIDINGS_MAX_RECEIVES=five` stops `tick` at init (Lambda reports an init error: the process
/// exits before it asks for an invocation), naming the variable; `TIDINGS_MAX_RECIEVES=5` lets
/// `tick` start and run, and its log names the misspelling and `TIDINGS_MAX_RECEIVES`.
pub async fn a_malformed_setting_stops_a_function_and_a_misspelt_one_is_named() -> anyhow::Result<()> {
    let opts =
        Options { env: vec![("tick", "TIDINGS_MAX_RECEIVES", "five".into())], warm: false, ..Options::default() };
    let s = Stack::start(opts).await?;
    let fired = s.fire("tick").await;
    assert!(fired.is_err(), "tick ran with TIDINGS_MAX_RECEIVES=five: {fired:?}");
    let failures = s.stats()["tick"].init_failures.join("\n");
    assert!(failures.contains("stopped during init"), "{failures}");
    assert!(failures.contains("TIDINGS_MAX_RECEIVES") && failures.contains("five"), "{failures}");
    assert_eq!(s.stats()["tick"].cold_starts, 0, "tick asked for an invocation: {failures}");
    drop(s);

    let opts = Options { env: vec![("tick", "TIDINGS_MAX_RECIEVES", "5".into())], ..Options::default() };
    let s = Stack::start(opts).await?;
    let report = s.fire("tick").await?;
    assert!(s.stats()["tick"].init_failures.is_empty(), "{:?}", s.stats()["tick"].init_failures);
    let logs = s.functions["tick"].logs();
    let warning = logs
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| l["fields"]["variable"] == "TIDINGS_MAX_RECIEVES")
        .unwrap_or_else(|| panic!("tick's log names no TIDINGS_MAX_RECIEVES (fired: {report}): {logs}"));
    assert_eq!(warning["level"], "WARN", "{warning}");
    assert_eq!(warning["fields"]["did_you_mean"], "TIDINGS_MAX_RECEIVES", "{warning}");
    Ok(())
}
