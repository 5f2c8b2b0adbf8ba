//! `--bootstrap` on the AWS backend (the emulators): one line per table, queue, DLQ and sender,
//! created the first time and found the next, and a closing summary, on stderr (not a
//! terminal here); stdout keeps its JSON. The embedded backend's progress is tested in the
//! `tidings` crate (`shared/tidings/tests/progress.rs`).

use anyhow::{Context, ensure};

async fn keys_list_bootstrap(run: &str) -> anyhow::Result<String> {
    // Its own data directory: the command keeps a local signing key there, which would
    // otherwise land in the test's working directory (the repository).
    let data = tempfile::tempdir()?;
    let out = tokio::process::Command::new(crate::server::binary()?)
        .args(["keys", "list", "--backend", "aws", "--bootstrap", "--data-dir"])
        .arg(data.path())
        .env("TIDINGS_TABLE", format!("{run}-table"))
        .env("TIDINGS_QUEUE_PREFIX", format!("{run}-"))
        .env("TIDINGS_LOG", "warn")
        .output()
        .await
        .context("running tidings keys list")?;
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr).into_owned());
    ensure!(out.status.success(), "tidings keys list --bootstrap failed:\n{stderr}");
    let listed: serde_json::Value = serde_json::from_str(&stdout).context("stdout is one JSON document")?;
    ensure!(listed == serde_json::json!({"keys": []}), "a fresh table lists no keys: {listed}");
    Ok(stderr)
}

pub async fn bootstrap_on_aws_tells_each_resource_created_then_found() -> anyhow::Result<()> {
    crate::server::emulator();
    let run = format!("e2e{:08x}", rand::random::<u32>());
    let queues: Vec<&str> = tidings_core::messages::ALL_QUEUES
        .iter()
        .copied()
        .chain([tidings_core::notify::relay::STREAM_FAILURES_QUEUE])
        .collect();
    for (pass, word) in [(1, "created"), (2, "found")] {
        let stderr = keys_list_bootstrap(&run).await?;
        ensure!(stderr.contains(&format!("bootstrap: table {run}-table: {word}\n")), "pass {pass}, table:\n{stderr}");
        for q in &queues {
            ensure!(
                stderr.contains(&format!("bootstrap: queue {run}-{q}: {word}\n")),
                "pass {pass}, queue {q}:\n{stderr}"
            );
            if tidings_core::messages::has_dlq(q) {
                ensure!(
                    stderr.contains(&format!("bootstrap: dlq {run}-{q}-dlq: {word}\n")),
                    "pass {pass}, dlq {q}:\n{stderr}"
                );
            }
        }
        ensure!(stderr.contains("bootstrap: sender "), "pass {pass}, sender:\n{stderr}");
        let dlqs = queues.iter().filter(|q| tidings_core::messages::has_dlq(q)).count();
        // The table, the queues and their DLQs; the sender is found or created by the emulator's
        // SES, shared by every run.
        let resources = 1 + queues.len() + dlqs;
        let summary = stderr.lines().find(|l| l.starts_with("bootstrap: ") && l.contains(" created, ")).unwrap_or("");
        let created: usize = summary
            .trim_start_matches("bootstrap: ")
            .split(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("no summary line:\n{stderr}"))?;
        if pass == 1 {
            ensure!(created >= resources, "pass 1 created {created} of {resources}:\n{stderr}");
        } else {
            // Only the sender may be "created" again: moto's SES does not say it exists.
            ensure!(created <= 1, "pass 2 created {created}:\n{stderr}");
            let again: Vec<&str> =
                stderr.lines().filter(|l| l.ends_with(": created") && !l.starts_with("bootstrap: sender ")).collect();
            ensure!(again.is_empty(), "pass 2 created {again:?}");
        }
        ensure!(stderr.contains("keys: listed 0 key(s) in "), "pass {pass}, keys summary:\n{stderr}");
    }
    Ok(())
}
