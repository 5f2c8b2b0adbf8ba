//! `tidings config`: every `TIDINGS_*` variable as this command would run with it, its value
//! (secrets masked) and where the value comes from: the environment, a flag (`--data-dir`,
//! `--backend`), the data directory (the local keys a `tidings serve` made), or the default.
//! Built from the one table, `tidings_core::config::VARIABLES` ([`Settings::in_effect`]); there is
//! no `.env` file or other source. `--table` prints that table itself (docs/configuration.md's).

use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use serde_json::json;
use tidings_core::config::{InEffect, Settings, Source};

use crate::BackendKind;
use crate::backend::DATABASE_FILE;

#[derive(clap::Args, Clone, Debug)]
pub struct ConfigArgs {
    /// One JSON document: `{"variables": [...], "unknown": [...]}`.
    #[arg(long, conflicts_with = "table")]
    pub json: bool,
    /// The table of every variable (name, default, meaning) instead of the values in effect:
    /// the table of docs/configuration.md.
    #[arg(long)]
    pub table: bool,
    /// The data directory the other commands would use: what it holds is said.
    #[arg(long, default_value = ".tidings", env = "TIDINGS_DATA_DIR")]
    pub data_dir: PathBuf,
    #[arg(long, value_enum, default_value = "embedded", env = "TIDINGS_BACKEND")]
    pub backend: BackendKind,
    /// Where `data_dir` and `backend` came from.
    #[arg(skip)]
    pub sources: (Option<ValueSource>, Option<ValueSource>),
}

/// The variables in effect for `args`: [`Settings::in_effect`], with the flags' values and the
/// data directory's keys where they stand in for an unset variable.
pub fn in_effect(settings: &Settings, args: &ConfigArgs) -> Vec<InEffect> {
    let mut shown = settings.in_effect();
    let dir = std::path::absolute(&args.data_dir).unwrap_or_else(|_| args.data_dir.clone());
    let embedded = args.backend == BackendKind::Embedded;
    for e in &mut shown {
        match e.name.as_str() {
            "TIDINGS_DATA_DIR" => {
                e.value = Some(dir.display().to_string());
                if args.sources.0 == Some(ValueSource::CommandLine) {
                    e.source = Source::Flag;
                }
                e.note = Some(if dir.join(DATABASE_FILE).is_file() {
                    format!("a Tidings store ({DATABASE_FILE})")
                } else if embedded {
                    "no Tidings store here: `tidings keys` and `tidings ops` will refuse to run \
                     (run in the directory where `tidings serve` runs, or pass --data-dir)"
                        .to_owned()
                } else {
                    "no Tidings store here (the AWS backend keeps only a local signing key here)".to_owned()
                });
            }
            "TIDINGS_BACKEND" if args.sources.1 == Some(ValueSource::CommandLine) => {
                e.value = Some(if embedded { "embedded" } else { "aws" }.to_owned());
                e.source = Source::Flag;
            }
            // Unset, `tidings serve` uses the keys it made and kept in the data directory.
            "TIDINGS_SIGNING_KEYS" if e.source == Source::Unset => kept_in(e, &dir, "signing-key", "local:****"),
            "TIDINGS_API_KEYS" if e.source == Source::Unset && embedded => {
                kept_in(e, &dir, "demo-api-key", "demo:****")
            }
            "TIDINGS_OPERATOR_KEYS" if e.source == Source::Unset && embedded => {
                kept_in(e, &dir, "operator-api-key", "****")
            }
            _ => {}
        }
    }
    shown
}

fn kept_in(e: &mut InEffect, dir: &Path, file: &str, masked: &str) {
    let path = dir.join(file);
    if std::fs::read_to_string(&path).is_ok_and(|k| !k.trim().is_empty()) {
        e.value = Some(masked.to_owned());
        e.source = Source::DataDirectory;
        e.note = Some(format!("kept in {}", path.display()));
    }
}

fn source_word(source: Source) -> &'static str {
    match source {
        Source::Default => "default",
        Source::Environment => "environment",
        Source::Flag => "flag",
        Source::DataDirectory => "data directory",
        Source::Unset => "unset",
    }
}

pub fn run(settings: &Settings, args: &ConfigArgs) -> anyhow::Result<()> {
    if args.table {
        print!("{}", tidings_core::config::markdown_table());
        return Ok(());
    }
    let shown = in_effect(settings, args);
    let unknown: Vec<_> =
        settings.unknown().map(|(name, meant)| json!({"name": name, "did_you_mean": meant})).collect();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&json!({"variables": shown, "unknown": unknown}))?);
        return Ok(());
    }
    let width = shown.iter().map(|e| e.name.len()).max().unwrap_or(0);
    for e in &shown {
        let value = e.value.as_deref().unwrap_or("-");
        let mut line = format!("{:width$}  {value}  ({})", e.name, source_word(e.source));
        if let Some(note) = &e.note {
            line.push_str(&format!(": {note}"));
        }
        println!("{line}");
    }
    for (name, meant) in settings.unknown() {
        match meant {
            Some(meant) => println!("{name:width$}  (unknown: nothing reads it; did you mean {meant}?)"),
            None => println!("{name:width$}  (unknown: nothing reads it)"),
        }
    }
    Ok(())
}
