//! Builds the ports of the chosen backend: the embedded one (SQLite, fake providers) or, with
//! the `aws` feature, DynamoDB / SQS / SES / SNS of the environment's account or emulator.

use std::sync::Arc;

use anyhow::Context;
use tidings_core::dev::{DevProvider, DevProviders, FakeSecondarySms, NullProvider};
use tidings_core::gates::{self, GateStore};
use tidings_core::ports::{ChangeFeed, Channel, Clock, Provider, Queues, Table};
use tidings_core::{CoreConfig, Deps, Providers};

use crate::progress::Progress;
use crate::{BackendArgs, BackendKind};

/// Every queue of the system.
pub fn all_queues() -> Vec<String> {
    tidings_core::messages::ALL_QUEUES.iter().map(|q| (*q).to_owned()).collect()
}

pub struct Backend {
    pub deps: Deps,
    pub feed: Arc<dyn ChangeFeed>,
    /// The fake providers' controls (`/dev/providers`, the record `/dev/deliveries` lists):
    /// always on the embedded backend (its providers are fakes); on AWS only when asked for
    /// (`serve --dev`, emulators only), since they record every body sent into the table.
    pub dev: Option<DevProviders>,
    pub queue_names: Vec<String>,
    /// The ARN-like source name of a queue, for the SQS events the runtime builds.
    pub queue_arn_prefix: String,
    /// Whether this is a local run: the embedded backend, or AWS emulators on this machine
    /// (`tidings_aws::wiring::endpoints_are_local`). Keys from the environment need it.
    pub local: bool,
}

fn dev_providers(inner: [Arc<dyn Provider>; 3], table: &Arc<dyn Table>, clock: &Arc<dyn Clock>) -> DevProviders {
    let [email, sms, push] = inner;
    let wrap = |c, p| Arc::new(DevProvider::new(c, p, table.clone(), clock.clone()));
    DevProviders { email: wrap(Channel::Email, email), sms: wrap(Channel::Sms, sms), push: wrap(Channel::Push, push) }
}

/// Whether a command may make the store it opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreUse {
    /// `serve`, and the benches on stores of their own: the data directory, its database and
    /// the local signing key are made when missing.
    MakeWhenMissing,
    /// Every other command reads or changes the data of a system `tidings serve` runs: only a
    /// store that is there (`--bootstrap` asks for one to be made). A new, empty one in the
    /// wrong directory would answer as if that system had no keys and no dead letters, and a
    /// key made there would be refused by the server (docs/operators.md, "The `tidings` command").
    Existing,
}

/// The data directory the embedded backend reads, `tidings.db` in it.
pub const DATABASE_FILE: &str = "tidings.db";

/// The error of a command that finds no store: where it looked, why there, and how to point
/// it at the right one.
pub fn no_store_at(args: &BackendArgs) -> anyhow::Error {
    let dir = std::path::absolute(&args.data_dir).unwrap_or_else(|_| args.data_dir.clone());
    let why = match args.data_dir_from {
        Some(clap::parser::ValueSource::CommandLine) => "because --data-dir names it".to_owned(),
        Some(clap::parser::ValueSource::EnvVariable) => {
            format!("because TIDINGS_DATA_DIR is {}", args.data_dir.display())
        }
        _ => "because --data-dir defaults to ./.tidings".to_owned(),
    };
    anyhow::anyhow!(
        "no Tidings store at {} (looked there {why}); run this in the directory where `tidings serve` runs, \
         or pass --data-dir with the data directory `tidings serve` prints (--bootstrap makes a new, empty store \
         there instead)",
        dir.display()
    )
}

impl Backend {
    /// The backend of a command other than `serve`: on the embedded backend, the store that is
    /// in `--data-dir` and never a new one ([`StoreUse::Existing`]), unless `--bootstrap`.
    pub async fn open(args: &BackendArgs, clock: Arc<dyn Clock>) -> anyhow::Result<Self> {
        let store = if args.bootstrap { StoreUse::MakeWhenMissing } else { StoreUse::Existing };
        Self::open_for(args, clock, false, store, None).await
    }

    /// `open`; `dev`: on the AWS backend, the providers are wrapped in the dev ones (fault
    /// injection and a record of sends), which only emulators on this machine may have.
    /// `public_url`: the base of the links it signs, when the caller knows better than the
    /// configuration (`tidings serve`: its own address when `TIDINGS_PUBLIC_URL` is unset).
    pub async fn open_for(
        args: &BackendArgs,
        clock: Arc<dyn Clock>,
        dev: bool,
        store: StoreUse,
        public_url: Option<String>,
    ) -> anyhow::Result<Self> {
        // Checked before anything is written (the signing key below included).
        if store == StoreUse::Existing
            && args.backend == BackendKind::Embedded
            && !args.data_dir.join(DATABASE_FILE).is_file()
        {
            return Err(no_store_at(args));
        }
        let mut config = crate::settings().core();
        if let Some(url) = public_url {
            config.public_url = url;
        }
        // This process outlives its requests: an order's expiry message may go after its answer.
        config.detached_expiry_messages = true;
        if !config.signer.is_configured() {
            config.signer = local_signing_key(&args.data_dir, store)?;
        }
        let config = Arc::new(config);
        match args.backend {
            BackendKind::Embedded => Self::embedded(args, clock, config, store),
            BackendKind::Aws => Self::aws(args, clock, config, dev).await,
        }
    }

    fn embedded(
        args: &BackendArgs,
        clock: Arc<dyn Clock>,
        config: Arc<CoreConfig>,
        store_use: StoreUse,
    ) -> anyhow::Result<Self> {
        let path = args.data_dir.join(DATABASE_FILE);
        let progress = args.bootstrap.then(|| Progress::spinner("bootstrap"));
        let existed = path.exists();
        let store = match store_use {
            StoreUse::MakeWhenMissing => {
                tidings_embedded::create_private_dir(&args.data_dir)
                    .with_context(|| format!("creating {}", args.data_dir.display()))?;
                tidings_embedded::EmbeddedStore::open_with_clock(&path, clock.clone())
            }
            StoreUse::Existing => tidings_embedded::EmbeddedStore::open_existing_with_clock(&path, clock.clone()),
        }
        .with_context(|| format!("opening {}", path.display()))?;
        // What the relay reads, as the event source mapping filters it on AWS.
        store.set_stream_filter(tidings_core::notify::relay::streamed_change);
        if let Some(p) = &progress {
            p.step(format!("database {}: {}", path.display(), if existed { "found" } else { "created" }));
        }
        let queue_names = all_queues();
        for q in &queue_names {
            store.declare_queue(tidings_embedded::QueueConfig::new(q.clone(), config.max_receives))?;
            if let Some(p) = &progress {
                p.step(format!("queue {q}: declared"));
            }
        }
        // Read by operators only: nothing there is ever dead-lettered for being read.
        store.declare_queue(tidings_embedded::QueueConfig::new(
            tidings_core::notify::relay::STREAM_FAILURES_QUEUE,
            1000,
        ))?;
        if let Some(p) = progress {
            p.step(format!("queue {}: declared", tidings_core::notify::relay::STREAM_FAILURES_QUEUE));
            p.finish(format!(
                "database {} and {} queues ready in {:.1} s",
                if existed { "found" } else { "created" },
                queue_names.len() + 1,
                p.elapsed_s()
            ));
        }
        let feed: Arc<dyn ChangeFeed> = Arc::new(store.change_feed("relay"));
        let table: Arc<dyn Table> = Arc::new(store.clone());
        let queues: Arc<dyn Queues> = Arc::new(store);
        let null = || -> Arc<dyn Provider> { Arc::new(NullProvider) };
        let dev = dev_providers([null(), null(), null()], &table, &clock);
        let providers = Providers { email: dev.email.clone(), sms: dev.sms.clone(), push: dev.push.clone() };
        // `TIDINGS_SMS_SECONDARY=fake`: a second fake SMS provider to fail over to.
        let secondary = (crate::settings().get("TIDINGS_SMS_SECONDARY") == Some("fake")).then(|| {
            Arc::new(DevProvider::new(Channel::Sms, Arc::new(FakeSecondarySms), table.clone(), clock.clone()))
                as Arc<dyn Provider>
        });
        let providers = gates::wrap(&providers, secondary, &config.gates, GateStore::Local);
        Ok(Self {
            deps: Deps::new(table, queues, clock, providers, config),
            feed,
            dev: Some(dev),
            queue_names,
            queue_arn_prefix: "arn:tidings:embedded:local:0:".into(),
            local: true,
        })
    }

    #[cfg(not(feature = "aws"))]
    async fn aws(
        _args: &BackendArgs,
        _clock: Arc<dyn Clock>,
        _config: Arc<CoreConfig>,
        _dev: bool,
    ) -> anyhow::Result<Self> {
        anyhow::bail!(
            "this build has no AWS backend: build with `--features aws` (cargo run --release --features aws --bin tidings -- serve --backend aws)"
        )
    }

    #[cfg(feature = "aws")]
    async fn aws(
        args: &BackendArgs,
        clock: Arc<dyn Clock>,
        config: Arc<CoreConfig>,
        dev: bool,
    ) -> anyhow::Result<Self> {
        if dev && !tidings_aws::wiring::endpoints_are_local() {
            anyhow::bail!(
                "--dev with --backend aws is for emulators on this machine only: AWS_ENDPOINT_URL and every \
                 AWS_ENDPOINT_URL_* must name a loopback address (the /dev routes would fail real sends and \
                 record every body sent, OTP codes included, in the table)"
            );
        }
        if args.bootstrap {
            bootstrap_aws().await?;
        }
        // The signer is the one `open` chose (the configured keys, else a local key file): no
        // `signing` step.
        let b = tidings_aws::wiring::AwsPorts::connect(crate::settings()).await?;
        let real = tidings_aws::wiring::AwsProviders::new(&b.backend);
        let table = b.table.clone();
        // The fake providers' record is test support: its writes are not counted as the
        // system's AWS requests.
        let record: Arc<dyn Table> = Arc::new(b.backend.uncounted_table());
        let raw = &real.channels;
        let dev = dev.then(|| dev_providers([raw.email.clone(), raw.sms.clone(), raw.push.clone()], &record, &clock));
        let providers = match &dev {
            Some(d) => Providers { email: d.email.clone(), sms: d.sms.clone(), push: d.push.clone() },
            None => raw.clone(),
        };
        // The SMS failover provider (`TIDINGS_SMS_SECONDARY`); with `--dev` its sends are
        // recorded too (under its own name), while faults are injected into the primary only.
        let secondary = real.sms_secondary.clone().map(|s| match &dev {
            Some(_) => Arc::new(DevProvider::new(Channel::Sms, s, record.clone(), clock.clone())) as Arc<dyn Provider>,
            None => s,
        });
        // The rate buckets live in the table: shared by every instance, as on Lambda.
        let providers = gates::wrap(&providers, secondary, &config.gates, GateStore::Shared(table.clone()));
        Ok(Self {
            deps: Deps::new(table, b.queues.clone(), clock, providers, config),
            feed: b.change_feed(),
            dev,
            queue_names: all_queues(),
            queue_arn_prefix: b.queue_arn_prefix.clone(),
            local: tidings_aws::wiring::endpoints_are_local(),
        })
    }
}

/// `--bootstrap` on AWS: the table, every queue with the stream's on-failure queue (as
/// `template.yaml` has them) and the sender, one line each as it is created or found.
#[cfg(feature = "aws")]
async fn bootstrap_aws() -> anyhow::Result<()> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let names = [all_queues(), vec![tidings_core::notify::relay::STREAM_FAILURES_QUEUE.to_owned()]].concat();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let progress = Progress::spinner("bootstrap");
    let (created, found) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let report = |kind: &str, name: &str, done: tidings_aws::Bootstrapped| {
        match done {
            tidings_aws::Bootstrapped::Created => created.fetch_add(1, Ordering::Relaxed),
            _ => found.fetch_add(1, Ordering::Relaxed),
        };
        progress.step(format!("{kind} {name}: {}", done.as_str()));
    };
    let backend = tidings_aws::AwsBackend::from_config(tidings_aws::AwsConfig::from_settings(crate::settings())?).await;
    tidings_aws::bootstrap_reporting(&backend, &names, &report).await?;
    progress.finish(format!(
        "{} created, {} found (table, {} queues and DLQs, sender) in {:.1} s",
        created.load(Ordering::Relaxed),
        found.load(Ordering::Relaxed),
        names.len(),
        progress.elapsed_s()
    ));
    Ok(())
}

/// Without `TIDINGS_SIGNING_KEYS`, the local runtime makes a random key once and keeps it in the
/// data directory (readable by the owner only), so links stay valid across restarts. A command
/// that makes no store makes no key either: without one it has no signer (it signs nothing).
fn local_signing_key(dir: &std::path::Path, store: StoreUse) -> anyhow::Result<tidings_core::signing::Signer> {
    let path = dir.join("signing-key");
    let secret = match std::fs::read_to_string(&path) {
        Ok(s) if !s.trim().is_empty() => s.trim().to_owned(),
        _ if store == StoreUse::Existing => return Ok(tidings_core::signing::Signer::default()),
        _ => {
            tidings_embedded::create_private_dir(dir)?;
            let secret = tidings_core::ops::tenants::generate_key();
            write_private(&path, &secret)?;
            secret
        }
    };
    Ok(tidings_core::signing::Signer::new(vec![("local".into(), secret.into_bytes())]))
}

/// Writes a file only its owner can read.
pub fn write_private(path: &std::path::Path, contents: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut f = options.open(path).with_context(|| format!("writing {}", path.display()))?;
    f.write_all(contents.as_bytes())?;
    Ok(())
}
