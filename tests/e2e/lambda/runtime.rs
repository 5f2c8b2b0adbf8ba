//! Each function's built binary as its own process under a Lambda Runtime API of the harness's
//! own: one process per execution environment, one invocation at a time, the deadline header
//! from the function's timeout, killed (and its invocation failed) when it overruns it, started
//! again on the next invocation (a cold start, timed from spawn to its first `next`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::Value;
use tokio::process::{Child, Command};
use tokio::sync::{Semaphore, mpsc, oneshot};

use super::template::{ACCOUNT, FunctionSpec, REGION};

/// How a function's binary is found and started.
#[derive(Clone, Debug)]
pub enum Binaries {
    /// `.aws-sam/build/<LogicalId>/bootstrap`, as `sam build` leaves them; arm64 ones run under
    /// `qemu-aarch64` on another architecture.
    Sam(PathBuf),
    /// `<dir>/<binary>` built for this machine (`cargo build -p <fn>`).
    Native(PathBuf),
}

impl Binaries {
    pub fn from_env() -> Self {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        match std::env::var("TIDINGS_LAMBDA_BINARIES").as_deref() {
            Ok("native") => Binaries::Native(root.join("target/debug")),
            Ok(dir) if !dir.is_empty() && dir != "sam" => Binaries::Native(PathBuf::from(dir)),
            _ => Binaries::Sam(root.join(".aws-sam/build")),
        }
    }

    /// How much longer than on Lambda an invocation may take here: an arm64 binary emulated by
    /// qemu on a two-core machine shared with the emulators runs several times slower than on
    /// Lambda, so its timeout (and the deadline it is told) are stretched by this factor
    /// (`TIDINGS_LAMBDA_TIME_SCALE`; 4 under emulation, 1 native).
    pub fn time_scale(&self) -> u64 {
        let emulated = matches!(self, Binaries::Sam(_)) && std::env::consts::ARCH != "aarch64";
        std::env::var("TIDINGS_LAMBDA_TIME_SCALE")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(if emulated { 4 } else { 1 })
            .max(1)
    }

    pub fn path(&self, f: &FunctionSpec) -> PathBuf {
        match self {
            Binaries::Sam(dir) => dir.join(&f.logical_id).join("bootstrap"),
            Binaries::Native(dir) => dir.join(&f.binary),
        }
    }

    fn command(&self, f: &FunctionSpec) -> anyhow::Result<Command> {
        let path = self.path(f);
        anyhow::ensure!(
            path.exists(),
            "{} is missing: run `sam build` first (make test does), or set TIDINGS_LAMBDA_BINARIES=native after `cargo build -p {}`",
            path.display(),
            f.binary
        );
        let foreign_arm = matches!(self, Binaries::Sam(_)) && std::env::consts::ARCH != "aarch64";
        Ok(if foreign_arm {
            let mut c = Command::new("qemu-aarch64");
            c.arg("-L").arg("/usr/aarch64-linux-gnu").arg(path);
            c
        } else {
            Command::new(path)
        })
    }
}

type Answer = Result<Bytes, String>;

struct Invocation {
    id: String,
    payload: Bytes,
    deadline_ms: u64,
    answer: oneshot::Sender<Answer>,
}

/// One execution environment: the process and its Runtime API.
struct Environment {
    child: Child,
    /// Invocations for this environment's `next`.
    tx: mpsc::Sender<Invocation>,
    pending: Arc<Mutex<BTreeMap<String, oneshot::Sender<Answer>>>>,
}

#[derive(Clone)]
struct Api {
    rx: Arc<tokio::sync::Mutex<mpsc::Receiver<Invocation>>>,
    pending: Arc<Mutex<BTreeMap<String, oneshot::Sender<Answer>>>>,
    first_next: Arc<Mutex<Option<oneshot::Sender<()>>>>,
    function_arn: String,
    init_error: Arc<Mutex<Option<String>>>,
}

async fn next(State(api): State<Api>) -> Response {
    if let Some(tx) = api.first_next.lock().unwrap_or_else(|e| e.into_inner()).take() {
        let _ = tx.send(());
    }
    let Some(inv) = api.rx.lock().await.recv().await else {
        return StatusCode::GONE.into_response();
    };
    api.pending.lock().unwrap_or_else(|e| e.into_inner()).insert(inv.id.clone(), inv.answer);
    (
        [
            ("lambda-runtime-aws-request-id", inv.id.clone()),
            ("lambda-runtime-deadline-ms", inv.deadline_ms.to_string()),
            ("lambda-runtime-invoked-function-arn", api.function_arn.clone()),
            (
                "lambda-runtime-trace-id",
                format!("Root=1-{:08x}-{}", now_ms() / 1000, inv.id.replace('-', "")[..24].to_owned()),
            ),
            ("content-type", "application/json".to_owned()),
        ],
        inv.payload,
    )
        .into_response()
}

async fn respond(State(api): State<Api>, Path(id): Path<String>, body: Bytes) -> StatusCode {
    if let Some(tx) = api.pending.lock().unwrap_or_else(|e| e.into_inner()).remove(&id) {
        let _ = tx.send(Ok(body));
    }
    StatusCode::ACCEPTED
}

async fn error(State(api): State<Api>, Path(id): Path<String>, body: Bytes) -> StatusCode {
    if let Some(tx) = api.pending.lock().unwrap_or_else(|e| e.into_inner()).remove(&id) {
        let _ = tx.send(Err(String::from_utf8_lossy(&body).into_owned()));
    }
    StatusCode::ACCEPTED
}

async fn report_init_error(State(api): State<Api>, body: Bytes) -> StatusCode {
    *api.init_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(String::from_utf8_lossy(&body).into_owned());
    StatusCode::ACCEPTED
}

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// A function: its spec, how to start it, its idle environments and its figures.
pub struct Function {
    pub spec: FunctionSpec,
    env: BTreeMap<String, String>,
    binaries: Binaries,
    idle: Mutex<Vec<Environment>>,
    /// Concurrent environments at most.
    slots: Semaphore,
    stats_handle: Arc<Mutex<Stats>>,
    log_dir: PathBuf,
    /// Lambda freezes an environment once it has answered and may never thaw it: with this
    /// set, every environment is stopped as soon as it answers (work left for after the answer
    /// is lost, as it can be on Lambda), and each invocation starts a new one.
    never_thawed: std::sync::atomic::AtomicBool,
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Stats {
    pub cold_starts: u32,
    /// Spawn → first `next`, per cold start.
    pub init_ms: Vec<u64>,
    pub invocations: u64,
    pub errors: u64,
    pub timeouts: u64,
    /// Start-up failures (the process stopped before asking for an invocation).
    pub init_failures: Vec<String>,
    /// Highest resident memory seen of one environment (under qemu, the emulator's own
    /// included), and environments stopped for going over the function's `MemorySize`.
    pub peak_rss_mb: u64,
    pub out_of_memory: u32,
}

/// Resident memory of a process in MiB, from /proc.
fn rss_mb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: u64 = status.lines().find(|l| l.starts_with("VmRSS:"))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024)
}

pub struct Invoked {
    pub payload: Answer,
    pub timed_out: bool,
}

impl Function {
    pub fn new(
        spec: FunctionSpec,
        env: BTreeMap<String, String>,
        binaries: Binaries,
        concurrency: usize,
        log_dir: PathBuf,
    ) -> Self {
        Self {
            spec,
            env,
            binaries,
            idle: Mutex::new(Vec::new()),
            slots: Semaphore::new(concurrency.max(1)),
            stats_handle: Arc::new(Mutex::new(Stats::default())),
            log_dir,
            never_thawed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Stops every environment of this function as soon as it answers (see `never_thawed`).
    pub fn never_thaw(&self) {
        self.never_thawed.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    fn stats(&self) -> std::sync::MutexGuard<'_, Stats> {
        self.stats_handle.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn stats_now(&self) -> Stats {
        self.stats().clone()
    }

    /// Starts an environment and waits until it asks for its first invocation.
    async fn cold_start(&self) -> anyhow::Result<Environment> {
        let (tx, rx) = mpsc::channel(1);
        let pending = Arc::new(Mutex::new(BTreeMap::new()));
        let (first_tx, first_rx) = oneshot::channel();
        let init_error = Arc::new(Mutex::new(None));
        let name = format!("{}-{}", self.env.get("HARNESS_STACK").cloned().unwrap_or_default(), self.spec.logical_id);
        let api = Api {
            rx: Arc::new(tokio::sync::Mutex::new(rx)),
            pending: pending.clone(),
            first_next: Arc::new(Mutex::new(Some(first_tx))),
            function_arn: format!("arn:aws:lambda:{REGION}:{ACCOUNT}:function:{name}"),
            init_error: init_error.clone(),
        };
        let app = Router::new()
            .route("/2018-06-01/runtime/invocation/next", get(next))
            .route("/2018-06-01/runtime/invocation/{id}/response", post(respond))
            .route("/2018-06-01/runtime/invocation/{id}/error", post(error))
            .route("/2018-06-01/runtime/init/error", post(report_init_error))
            .with_state(api);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let mut cmd = self.binaries.command(&self.spec)?;
        cmd.env_clear();
        cmd.envs(self.env.iter().filter(|(k, _)| !k.starts_with("HARNESS_")));
        cmd.env("AWS_LAMBDA_RUNTIME_API", addr.to_string());
        cmd.env("AWS_LAMBDA_FUNCTION_NAME", &name);
        cmd.env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", self.spec.memory_mb.to_string());
        cmd.env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST");
        cmd.env("AWS_LAMBDA_LOG_GROUP_NAME", format!("/aws/lambda/{name}"));
        cmd.env("AWS_LAMBDA_LOG_STREAM_NAME", format!("harness/{}", addr.port()));
        cmd.env("_HANDLER", "bootstrap");
        cmd.env("TZ", ":UTC");
        cmd.env("LANG", "en_US.UTF-8");
        cmd.env("PATH", "/usr/local/bin:/usr/bin:/bin");
        std::fs::create_dir_all(&self.log_dir)?;
        let log_path = self.log_dir.join(format!("{}-{}.log", self.spec.binary, addr.port()));
        let log = std::fs::File::create(&log_path)?;
        cmd.stdout(log.try_clone()?).stderr(log).kill_on_drop(true);
        let spawned = Instant::now();
        let mut child = cmd.spawn().with_context(|| format!("starting {}", self.spec.binary))?;
        let init_limit = Duration::from_secs(10 * 6); // Lambda's 10 s init, with room for emulation
        tokio::select! {
            first = first_rx => {
                first.context("runtime API gone")?;
                let mut stats = self.stats();
                stats.cold_starts += 1;
                stats.init_ms.push(spawned.elapsed().as_millis() as u64);
            }
            status = child.wait() => {
                let why = init_error.lock().unwrap_or_else(|e| e.into_inner()).clone().unwrap_or_default();
                // What CloudWatch would show of the INIT phase: the end of its log.
                let logged = std::fs::read_to_string(&log_path).unwrap_or_default();
                let tail: String = logged.chars().rev().take(2000).collect::<Vec<_>>().into_iter().rev().collect();
                let text = format!("{} stopped during init ({:?}) {why}; log {}: {tail}", self.spec.binary, status.ok(), log_path.display());
                self.stats().init_failures.push(text.clone());
                bail!(text);
            }
            _ = tokio::time::sleep(init_limit) => {
                let _ = child.start_kill();
                bail!("{} did not ask for an invocation within {init_limit:?}", self.spec.binary);
            }
        }
        if let Some(pid) = child.id() {
            self.watch_memory(pid);
        }
        Ok(Environment { child, tx, pending })
    }

    /// As Lambda: an environment over its `MemorySize` is stopped (its invocation fails).
    fn watch_memory(&self, pid: u32) {
        let limit = self.spec.memory_mb;
        let stats = self.stats_handle.clone();
        tokio::spawn(async move {
            while let Some(mb) = rss_mb(pid) {
                let over = {
                    let mut st = stats.lock().unwrap_or_else(|e| e.into_inner());
                    st.peak_rss_mb = st.peak_rss_mb.max(mb);
                    if mb > limit {
                        st.out_of_memory += 1;
                    }
                    mb > limit
                };
                if over {
                    let _ = std::process::Command::new("kill").arg("-9").arg(pid.to_string()).status();
                    return;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
    }

    /// Invokes the function with `payload` (synchronously, as an event source mapping or API
    /// Gateway does): an idle environment takes it, or a new one is started, up to the
    /// function's concurrency; over the timeout the environment is killed.
    pub async fn invoke(&self, payload: Bytes) -> anyhow::Result<Invoked> {
        let _slot = self.slots.acquire().await?;
        let env = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut env = match env {
            Some(mut e) => match e.child.try_wait() {
                Ok(None) => e,
                _ => self.cold_start().await?,
            },
            None => self.cold_start().await?,
        };
        let timeout = Duration::from_secs(self.spec.timeout_s * self.binaries.time_scale());
        let id = uuid::Uuid::new_v4().to_string();
        let (answer, rx) = oneshot::channel();
        let deadline_ms = now_ms() + timeout.as_millis() as u64;
        self.stats().invocations += 1;
        if env.tx.send(Invocation { id: id.clone(), payload, deadline_ms, answer }).await.is_err() {
            bail!("{}: the environment went away", self.spec.binary);
        }
        tokio::select! {
            answer = rx => {
                let payload = answer.unwrap_or_else(|_| Err("the environment went away".into()));
                if payload.is_err() {
                    self.stats().errors += 1;
                }
                if self.never_thawed.load(std::sync::atomic::Ordering::SeqCst) {
                    let _ = env.child.start_kill();
                } else if env.child.try_wait().ok().flatten().is_none() {
                    self.idle.lock().unwrap_or_else(|e| e.into_inner()).push(env);
                }
                Ok(Invoked { payload, timed_out: false })
            }
            status = env.child.wait() => {
                env.pending.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
                self.stats().errors += 1;
                Ok(Invoked { payload: Err(format!("Runtime.ExitError: the process exited ({:?})", status.ok())), timed_out: false })
            }
            _ = tokio::time::sleep(timeout) => {
                // As Lambda: the environment is stopped; the next invocation starts a new one.
                let _ = env.child.start_kill();
                let _ = env.child.wait().await;
                self.stats().timeouts += 1;
                Ok(Invoked { payload: Err(format!("Task timed out after {} seconds", self.spec.timeout_s)), timed_out: true })
            }
        }
    }

    /// Starts one environment ahead of the first invocation (its init time is measured).
    pub async fn warm(&self) -> anyhow::Result<()> {
        let env = self.cold_start().await?;
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).push(env);
        Ok(())
    }

    /// What this function's environments have logged so far (stdout and stderr, every
    /// environment's in turn), as CloudWatch would show its log group.
    pub fn logs(&self) -> String {
        let prefix = format!("{}-", self.spec.binary);
        let mut files: Vec<PathBuf> = std::fs::read_dir(&self.log_dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_prefix(&prefix)).is_some_and(|port| {
                    port.strip_suffix(".log").is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
                })
            })
            .collect();
        files.sort();
        files.iter().filter_map(|p| std::fs::read_to_string(p).ok()).collect::<Vec<_>>().join("\n")
    }

    /// The size of the binary this function runs.
    pub fn binary_size(&self) -> u64 {
        std::fs::metadata(self.binaries.path(&self.spec)).map(|m| m.len()).unwrap_or(0)
    }

    pub fn stop(&self) {
        for mut env in self.idle.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            let _ = env.child.start_kill();
        }
    }

    pub fn json(payload: &Value) -> Bytes {
        Bytes::from(payload.to_string())
    }
}
