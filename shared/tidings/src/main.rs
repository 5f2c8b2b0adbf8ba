//! `tidings`: the whole system in one process (`serve`), operations (`ops`) and benchmarks.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use tidings_core::config::Settings;

/// mimalloc: a campaign allocates and frees small items (keys, attribute maps, JSON) at a
/// high rate, where glibc's allocator took a tenth of the CPU.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod backend;
mod bench;
mod bench_http;
mod bench_import;
mod bench_peer;
mod bench_reserve;
mod import;
mod keys;
mod progress;
mod runtime;
mod schedules;
mod serve;
mod stream_failures;

#[derive(Parser)]
#[command(name = "tidings", version, about = "Notifications and inventory consistency for online shops")]
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
    Serve(ServeArgs),
    /// Benchmarks on the embedded backend.
    Bench {
        #[command(subcommand)]
        command: BenchCommand,
    },
    /// API keys, straight against the store (`--backend aws`: the stack's table, with the
    /// caller's AWS credentials), so the first operator key needs no running server.
    Keys {
        #[command(subcommand)]
        command: keys::KeysCommand,
        #[command(flatten)]
        backend: BackendArgs,
    },
    /// Imports people from another system: a CSV or NDJSON file of users, or an Amazon
    /// Pinpoint endpoint export (docs/people.md, "Importing users"). Idempotent: run it again
    /// to finish an interrupted import; a second run writes nothing.
    Import {
        #[command(subcommand)]
        command: import::ImportCommand,
        #[command(flatten)]
        backend: BackendArgs,
    },
    /// Prints the OpenAPI document that `GET /openapi.json` serves (the committed
    /// `openapi.json`: `cargo run -q -p tidings -- openapi > openapi.json`).
    Openapi,
    /// Prints the table of every `TIDINGS_*` variable (the README's configuration table).
    Config,
    /// Operations on a running deployment's data.
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
    /// Where the embedded backend keeps its data.
    #[arg(long, default_value = ".tidings", env = "TIDINGS_DATA_DIR", global = true)]
    pub data_dir: PathBuf,
    #[arg(long, value_enum, default_value = "embedded", env = "TIDINGS_BACKEND", global = true)]
    pub backend: BackendKind,
    /// Create the tables and queues that template.yaml declares, where missing (emulators).
    #[arg(long, global = true)]
    pub bootstrap: bool,
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
    Campaign(bench::CampaignArgs),
    /// Concurrent single-unit orders against one SKU (plain or sharded).
    Reserve(bench_reserve::ReserveArgs),
    /// N users imported from a CSV file and from a Pinpoint export (fresh database), then
    /// again: how long each takes, and that the second run writes nothing.
    Import(bench_import::ImportArgs),
}

#[derive(Subcommand)]
enum OpsCommand {
    /// Dead-letter queues.
    Dlq {
        #[command(subcommand)]
        command: DlqCommand,
    },
    /// Stream records the relay did not relay (the stream's on-failure queue).
    StreamFailures {
        #[command(subcommand)]
        command: stream_failures::StreamFailuresCommand,
    },
}

#[derive(Subcommand)]
enum DlqCommand {
    /// Depth of every queue and its DLQ, and the first dead letters of each.
    List,
    /// Moves a queue's dead letters back to it.
    Redrive { queue: String },
}

/// What an operator needs to judge a dead letter: for a channel task, its delivery's status,
/// attempts, last error and first failure time; for a send batch, its status and how many of
/// its entries stand where, with the last error; for a rejected message, the reason it carries.
async fn why_dead(deps: &tidings_core::Deps, body: &str) -> String {
    use tidings_core::notify::model::{ChannelMessage, ChannelTask, Delivery};
    if let Ok(rejected) = serde_json::from_str::<tidings_core::messages::Rejected>(body) {
        return format!(
            "rejected: {} (at {}, received {} times)",
            rejected.rejected, rejected.at, rejected.receive_count
        );
    }
    if let Ok(ChannelMessage::Batch(batch)) = serde_json::from_str::<ChannelMessage>(body) {
        return tidings_core::notify::batch::explain(deps.table.as_ref(), &batch).await.0;
    }
    let Ok(task) = serde_json::from_str::<ChannelTask>(body) else {
        return "not a Tidings message (see its body with the queue's tools)".into();
    };
    let key = tidings_core::keys::delivery(&task.tenant, &task.notification_id, &task.user_id, task.channel);
    match deps.table.get(&key).await.map(|i| i.map(|i| i.parse::<Delivery>())) {
        Ok(Some(Ok(d))) => format!(
            "{} to {} of notification {}: status {}, {} attempt(s), last error {:?}, first failure {}",
            task.channel,
            task.user_id,
            task.notification_id,
            d.status.as_str(),
            d.attempts,
            d.last_error.unwrap_or_default(),
            d.first_failed_at.unwrap_or_else(|| "-".into()),
        ),
        _ => {
            format!("{} to {} of notification {}: no delivery record", task.channel, task.user_id, task.notification_id)
        }
    }
}

/// The process's `TIDINGS_*` variables, checked once when `main` starts.
static SETTINGS: std::sync::OnceLock<Settings> = std::sync::OnceLock::new();

/// The process's checked `TIDINGS_*` variables.
pub fn settings() -> &'static Settings {
    SETTINGS.get_or_init(Settings::default)
}

fn init_tracing(settings: &Settings) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_new(settings.value("TIDINGS_LOG")).unwrap_or_else(|_| EnvFilter::new("info"));
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // A malformed `TIDINGS_*` value stops the start here, naming the variable.
    let settings = Settings::from_vars(std::env::vars())?;
    init_tracing(&settings);
    settings.warn_unknown();
    tidings_core::crash::arm(settings.get("TIDINGS_CRASH_AT"));
    let _ = SETTINGS.set(settings);
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve::serve(args).await,
        Command::Bench { command: BenchCommand::Campaign(args) } => bench::campaign(args).await,
        Command::Bench { command: BenchCommand::Reserve(args) } => bench_reserve::reserve(args).await,
        Command::Bench { command: BenchCommand::Import(args) } => bench_import::import(args).await,
        Command::Keys { command, backend } => keys::run(command, &backend).await,
        Command::Import { command, backend } => import::run(command, &backend).await,
        Command::Openapi => {
            print!("{}", tidings_api::routes::openapi::document_json()?);
            Ok(())
        }
        Command::Config => {
            print!("{}", tidings_core::config::markdown_table());
            Ok(())
        }
        Command::Ops { command: OpsCommand::StreamFailures { command }, backend } => {
            stream_failures::run(command, &backend).await
        }
        Command::Ops { command: OpsCommand::Dlq { command }, backend } => {
            let clock = std::sync::Arc::new(tidings_core::ports::SystemClock);
            let b = backend::Backend::open(&backend, clock).await?;
            match command {
                DlqCommand::List => {
                    for name in &b.queue_names {
                        let stats = b.deps.queues.stats(name).await?;
                        println!("{}", serde_json::to_string(&stats)?);
                        for m in b.deps.queues.peek_dlq(name, 10).await? {
                            println!("  dead letter {} (received {} times)", m.message_id, m.receive_count);
                            println!("    why: {}", why_dead(&b.deps, &m.body).await);
                        }
                    }
                }
                DlqCommand::Redrive { queue } => {
                    if !b.queue_names.contains(&queue) {
                        anyhow::bail!("unknown queue {queue}; known: {}", b.queue_names.join(", "));
                    }
                    let moved = b.deps.queues.redrive(&queue).await?;
                    println!("moved {moved} message(s) from {queue}-dlq back to {queue}");
                }
            }
            Ok(())
        }
    }
}
