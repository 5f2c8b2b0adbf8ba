//! `tidings`: the whole system in one process (`serve`), operations (`ops`) and benchmarks.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use tidings_core::config::Settings;

/// mimalloc: a campaign allocates and frees small items (keys, attribute maps, JSON) at a
/// high rate, where glibc's allocator took a tenth of the CPU.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod backend;
mod bench;
mod bench_digest;
mod bench_http;
mod bench_import;
mod bench_peer;
mod bench_reserve;
mod config;
mod dlq;
mod examples;
mod findings;
mod import;
mod keys;
mod progress;
mod runtime;
mod schedules;
mod serve;
mod stream_failures;

#[derive(Parser)]
#[command(
    name = "tidings",
    version,
    about = "Notifications and inventory consistency for online shops",
    after_help = examples::TIDINGS
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// In-process and durable: SQLite in --data-dir, fake providers.
    Embedded,
    /// DynamoDB, SQS, SES and SNS of the account or emulators in the environment (AWS_ENDPOINT_URL,
    /// and AWS_ENDPOINT_URL_DYNAMODB[_STREAMS] for DynamoDB Local: infra/dynamodb_local.sh).
    Aws,
}

#[derive(Subcommand)]
enum Command {
    /// Runs the API, the relay, the workers and the schedules in one process.
    #[command(after_help = examples::SERVE)]
    Serve(ServeArgs),
    /// Benchmarks on the embedded backend.
    #[command(after_help = examples::BENCH)]
    Bench {
        #[command(subcommand)]
        command: BenchCommand,
    },
    /// API keys, straight against the store (`--backend aws`: the stack's table, with the
    /// caller's AWS credentials), so the first operator key needs no running server.
    #[command(after_help = examples::KEYS)]
    Keys {
        #[command(subcommand)]
        command: keys::KeysCommand,
        #[command(flatten)]
        backend: BackendArgs,
    },
    /// Imports people from another system: a CSV or NDJSON file of users, or an Amazon
    /// Pinpoint endpoint export (docs/people.md, "Importing users"). Idempotent: run it again
    /// to finish an interrupted import; a second run writes nothing.
    #[command(after_help = examples::IMPORT)]
    Import {
        #[command(subcommand)]
        command: import::ImportCommand,
        #[command(flatten)]
        backend: BackendArgs,
    },
    /// Prints the OpenAPI document that `GET /openapi.json` serves (the committed
    /// `openapi.json`: `cargo run -q -p tidings -- openapi > openapi.json`).
    #[command(after_help = examples::OPENAPI)]
    Openapi,
    /// Every `TIDINGS_*` variable in effect, and where its value comes from.
    ///
    /// Its value (secrets masked) and its source: the environment, a flag, the data directory
    /// (the keys `tidings serve` kept there) or the default. `--table` prints docs/configuration.md's
    /// table of every variable instead.
    #[command(after_help = examples::CONFIG)]
    Config(config::ConfigArgs),
    /// Operations on a running deployment's data.
    #[command(after_help = examples::OPS)]
    Ops {
        #[command(subcommand)]
        command: OpsCommand,
        #[command(flatten)]
        backend: BackendArgs,
    },
}

/// Global, so that they may follow the subcommand (`tidings keys create ... --backend aws`).
#[derive(clap::Args, Clone, Debug)]
pub struct BackendArgs {
    /// The embedded backend's data directory: the one `tidings serve` uses (every command but
    /// serve needs the store serve made there).
    #[arg(long, default_value = ".tidings", env = "TIDINGS_DATA_DIR", global = true)]
    pub data_dir: PathBuf,
    /// The embedded store in --data-dir, or the AWS account or emulators of the environment.
    #[arg(long, value_enum, default_value = "embedded", env = "TIDINGS_BACKEND", global = true)]
    pub backend: BackendKind,
    /// Create the tables and queues that template.yaml declares, where missing (emulators); on
    /// the embedded backend, a new store in --data-dir when there is none.
    #[arg(long, global = true)]
    pub bootstrap: bool,
    /// Where `data_dir` came from (the flag, TIDINGS_DATA_DIR or the default), for the message
    /// of a command that finds no store there.
    #[arg(skip)]
    pub data_dir_from: Option<clap::parser::ValueSource>,
}

#[derive(clap::Args, Clone, Debug)]
pub struct ServeArgs {
    #[arg(long, default_value = "127.0.0.1:8080", env = "TIDINGS_ADDR")]
    pub addr: SocketAddr,
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Time moves only by POST /dev/clock/advance.
    #[arg(long)]
    pub manual_clock: bool,
    /// Local development: `/dev/*` answers without an API key when listening on a loopback
    /// address; with `--backend aws`, `/dev/*` (and the fake providers' record) exists only with
    /// it, and only against emulators on this machine.
    #[arg(long)]
    pub dev: bool,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// A campaign to N recipients (fresh database, fake provider without delay): throughput,
    /// peak RSS, transactional latency meanwhile, each recipient delivered exactly once.
    #[command(after_help = examples::BENCH_CAMPAIGN)]
    Campaign(bench::CampaignArgs),
    /// Concurrent single-unit orders against one SKU (plain or sharded).
    #[command(after_help = examples::BENCH_RESERVE)]
    Reserve(bench_reserve::ReserveArgs),
    /// N users imported from a CSV file and from a Pinpoint export (fresh database), then
    /// again: how long each takes, and that the second run writes nothing.
    #[command(after_help = examples::BENCH_IMPORT)]
    Import(bench_import::ImportArgs),
    /// 100,000 triggers into 10,000 users' digests (a workflow `[digest, send email]`, manual
    /// clock): triggers/s into the digests, the flush, exactly one digest per user with its
    /// events, and the store and queue cost per trigger.
    #[command(after_help = examples::BENCH_DIGEST)]
    Digest(bench_digest::DigestArgs),
}

#[derive(Subcommand)]
enum OpsCommand {
    /// Dead-letter queues.
    #[command(after_help = examples::OPS_DLQ)]
    Dlq {
        #[command(subcommand)]
        command: dlq::DlqCommand,
    },
    /// Reconciliation findings: differences between stock counters and the ledger, for a person.
    #[command(after_help = examples::OPS_FINDINGS)]
    Findings {
        #[command(subcommand)]
        command: findings::FindingsCommand,
    },
    /// Stream records the relay did not relay (the stream's on-failure queue).
    #[command(after_help = examples::OPS_STREAM_FAILURES)]
    StreamFailures {
        #[command(subcommand)]
        command: stream_failures::StreamFailuresCommand,
    },
}

/// The process's `TIDINGS_*` variables, checked once when `main` starts.
static SETTINGS: std::sync::OnceLock<Settings> = std::sync::OnceLock::new();

/// The process's checked `TIDINGS_*` variables.
pub fn settings() -> &'static Settings {
    SETTINGS.get_or_init(Settings::default)
}

/// `quiet`: without `TIDINGS_LOG`, warnings and errors only (the benches: their progress and
/// summary on stderr are what is read there, not the system's info lines).
fn init_tracing(settings: &Settings, quiet: bool) {
    use tracing_subscriber::EnvFilter;
    let directives = match settings.get("TIDINGS_LOG") {
        Some(set) => set,
        None if quiet => "warn",
        None => settings.value("TIDINGS_LOG"),
    };
    let filter = EnvFilter::try_new(directives).unwrap_or_else(|_| EnvFilter::new("info"));
    let json = settings.value("TIDINGS_LOG_FORMAT") == "json";
    // One event, one line, whatever a field brought in (an unauthenticated callback's topic):
    // control characters escaped, so no ANSI colours either (docs/operators.md, "Logs").
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(|| tidings_core::log_lines::EscapedLines(std::io::stderr()));
    if json {
        builder.json().init();
    } else {
        builder.compact().init();
    }
}

/// Where `--data-dir` came from, on the subcommand that took it (it is global: any level).
fn data_dir_source(matches: &clap::ArgMatches) -> Option<clap::parser::ValueSource> {
    let mut found = None;
    let mut at = Some(matches);
    while let Some(m) = at {
        // `try_get_raw` errs where the argument is not defined (the top level).
        if m.try_get_raw("data_dir").is_ok() {
            found = m.value_source("data_dir").or(found);
        }
        at = m.subcommand().map(|(_, sub)| sub);
    }
    found
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // A malformed `TIDINGS_*` value stops the start here, naming the variable.
    let settings = Settings::from_vars(std::env::vars())?;
    let matches = Cli::command().get_matches();
    let mut cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    init_tracing(&settings, matches!(cli.command, Command::Bench { .. }));
    settings.warn_unknown();
    for doubt in settings.local_doubts() {
        tracing::warn!("{doubt}");
    }
    tidings_core::crash::arm(settings.get("TIDINGS_CRASH_AT"));
    let _ = SETTINGS.set(settings);
    let data_dir_from = data_dir_source(&matches);
    match &mut cli.command {
        Command::Serve(ServeArgs { backend, .. })
        | Command::Keys { backend, .. }
        | Command::Ops { backend, .. }
        | Command::Import { backend, .. } => backend.data_dir_from = data_dir_from,
        Command::Config(args) => {
            let sub = matches.subcommand_matches("config");
            let source = |id: &str| sub.and_then(|m| m.value_source(id));
            args.sources = (source("data_dir"), source("backend"));
        }
        Command::Bench { .. } | Command::Openapi => {}
    }
    match cli.command {
        Command::Serve(args) => serve::serve(args).await,
        Command::Bench { command: BenchCommand::Campaign(args) } => bench::campaign(args).await,
        Command::Bench { command: BenchCommand::Reserve(args) } => bench_reserve::reserve(args).await,
        Command::Bench { command: BenchCommand::Import(args) } => bench_import::import(args).await,
        Command::Bench { command: BenchCommand::Digest(args) } => bench_digest::digest(args).await,
        Command::Keys { command, backend } => keys::run(command, &backend).await,
        Command::Import { command, backend } => import::run(command, &backend).await,
        Command::Openapi => {
            print!("{}", tidings_api::routes::openapi::document_json()?);
            Ok(())
        }
        Command::Config(args) => config::run(crate::settings(), &args),
        Command::Ops { command: OpsCommand::StreamFailures { command }, backend } => {
            stream_failures::run(command, &backend).await
        }
        Command::Ops { command: OpsCommand::Dlq { command }, backend } => dlq::run(command, &backend).await,
        Command::Ops { command: OpsCommand::Findings { command }, backend } => findings::run(command, &backend).await,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use clap::{CommandFactory, Parser};

    use super::Cli;

    /// An example's words as a shell would split them: quotes kept together, the environment
    /// assignments before `tidings` and a redirection after it left out.
    fn words(example: &str) -> Vec<String> {
        let (mut words, mut word, mut quote, mut any) = (Vec::new(), String::new(), None, false);
        for c in example.chars() {
            match (quote, c) {
                (Some(q), c) if c == q => quote = None,
                (Some(_), c) => word.push(c),
                (None, '\'' | '"') => (quote, any) = (Some(c), true),
                (None, ' ') => {
                    if any || !word.is_empty() {
                        words.push(std::mem::take(&mut word));
                    }
                    any = false;
                }
                (None, c) => word.push(c),
            }
        }
        if any || !word.is_empty() {
            words.push(word);
        }
        let start = words.iter().position(|w| w == "tidings").unwrap_or(0);
        let end = words.iter().position(|w| w == ">" || w == "|").unwrap_or(words.len());
        words[start..end].to_vec()
    }

    /// Every command and subcommand (`tidings` itself too) ends its help with examples; each
    /// example parses as the command line it shows, and at least one is of the command itself.
    #[test]
    fn every_command_has_examples_that_parse() {
        fn walk(cmd: &mut clap::Command, path: &mut Vec<String>, seen: &mut usize) {
            path.push(cmd.get_name().to_owned());
            let help = cmd.render_long_help().to_string();
            let examples = help
                .split_once("Examples:\n")
                .unwrap_or_else(|| panic!("`{}` has no examples:\n{help}", path.join(" ")))
                .1;
            // The block of examples, up to the first blank line (prose may follow).
            let runs: Vec<&str> = examples
                .lines()
                .take_while(|l| !l.trim().is_empty())
                .map(str::trim)
                .filter(|l| !l.starts_with('#'))
                .collect();
            assert!(
                runs.iter().any(|l| words(l).join(" ").starts_with(&path.join(" "))),
                "no example of `{}` itself:\n{examples}",
                path.join(" ")
            );
            for run in runs {
                let words = words(run);
                if let Err(e) = Cli::try_parse_from(&words) {
                    panic!("the example `{run}` of `{}` does not parse ({words:?}): {e}", path.join(" "));
                }
            }
            *seen += 1;
            for sub in cmd.get_subcommands_mut().filter(|s| s.get_name() != "help") {
                walk(sub, path, seen);
            }
            path.pop();
        }
        let mut cmd = Cli::command();
        cmd.build();
        let mut seen = 0;
        walk(&mut cmd, &mut Vec::new(), &mut seen);
        // tidings; serve; bench, campaign, reserve; keys and its 4; openapi; config; ops, dlq and
        // its 2, findings and its 2, stream-failures and its 2.
        assert!(seen >= 21, "{seen} commands walked");
    }

    #[test]
    fn examples_are_split_as_a_shell_would() {
        assert_eq!(
            words("TIDINGS_TABLE=t tidings keys create --name 'ops laptop' > out.json"),
            ["tidings", "keys", "create", "--name", "ops laptop"]
        );
    }
}
