//! Spawns `tidings serve` as a real process (so a test can `kill -9` it) on either backend.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Embedded,
    Aws,
}

/// The `tidings` binary: `TIDINGS_BIN`, else the workspace's debug build (built with
/// `--features aws` by `make test`).
pub fn binary() -> anyhow::Result<PathBuf> {
    if let Ok(p) = std::env::var("TIDINGS_BIN") {
        return Ok(PathBuf::from(p));
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let p = root.join("target/debug/tidings");
    if !p.exists() {
        bail!("{} is missing: run `cargo build -p tidings --features aws` first (make test does)", p.display());
    }
    Ok(p)
}

/// Where the AWS backend's emulators are: moto (`AWS_ENDPOINT_URL`: SQS, SNS, SES) and DynamoDB
/// Local (`AWS_ENDPOINT_URL_DYNAMODB`, `AWS_ENDPOINT_URL_DYNAMODB_STREAMS`). Fails loudly when
/// they are not configured: a test that needs the emulators never skips.
pub fn emulator() -> String {
    let how = "start the emulators (make test does: infra/moto.sh start; infra/dynamodb_local.sh start) \
               and export their env lines";
    for var in ["AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL_DYNAMODB_STREAMS"] {
        match std::env::var(var) {
            Ok(url) if !url.is_empty() => {}
            _ => panic!("{var} is not set: {how}"),
        }
    }
    std::env::var("AWS_ENDPOINT_URL").unwrap_or_default()
}

/// Deletes a finished test's table and its queues and DLQs (the queues named with `prefix`)
/// from the emulators. Left behind, a whole run's thousands of queues and hundred tables made
/// every later test several times slower on moto and DynamoDB Local (a cancel test took 118 s
/// beside 2,500 stale queues, 39 s without them). Best effort, on a thread of its own: a test's
/// end (a `Drop`) cannot await.
pub fn remove_from_emulators(table: String, prefix: String) {
    let cleaning = std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
        rt.block_on(async move {
            let sdk = tidings_aws::sdk_defaults().load().await;
            let dynamo = aws_sdk_dynamodb::Client::new(&sdk);
            let _ = dynamo.delete_table().table_name(&table).send().await;
            let sqs = aws_sdk_sqs::Client::new(&sdk);
            if let Ok(out) = sqs.list_queues().queue_name_prefix(&prefix).max_results(100).send().await {
                for url in out.queue_urls.unwrap_or_default() {
                    let _ = sqs.delete_queue().queue_url(url).send().await;
                }
            }
        });
    });
    let _ = cleaning.join();
}

pub struct Server {
    pub base: String,
    /// Tenant acme's key.
    pub key: String,
    /// An operator's key (`/v1/ops/*`, `/v1/admin/*`).
    pub ops_key: String,
    child: Option<Child>,
    pub backend: Backend,
    data_dir: PathBuf,
    _tmp: std::sync::Arc<tempfile::TempDir>,
    env: Vec<(String, String)>,
    dev: bool,
    /// `serve --manual-clock`, on every start of this server (restarts included).
    manual_clock: bool,
    /// Every answer this server gave the test: (method, path without its query, status), for
    /// [`Server::undocumented`].
    answers: std::sync::Mutex<Vec<(String, String, u16)>>,
    pub http: reqwest::Client,
}

pub struct Options {
    pub env: Vec<(&'static str, String)>,
    pub manual_clock: bool,
    /// `serve --dev`: the `/dev` routes without a key (loopback), and on the AWS backend at all
    /// (the emulators are on this machine). Every test but the ones about `/dev` itself uses it.
    pub dev: bool,
}

impl Default for Options {
    fn default() -> Self {
        // Short retries, leases and visibility, so that crash recovery shows within a test's
        // patience (production defaults: 10 s base, 60 s lease, 60 s visibility, 10 min marketing
        // lease; the marketing lease asked for here is raised to its floor, 8 × (5 s + 2 s)).
        Self {
            env: vec![
                ("TIDINGS_RETRY_BASE_MS", "200".into()),
                ("TIDINGS_RETRY_CAP_MS", "1000".into()),
                ("TIDINGS_VISIBILITY_S", "8".into()),
                ("TIDINGS_DELIVERY_LEASE_MS", "6000".into()),
                ("TIDINGS_MARKETING_LEASE_MS", "1".into()),
                ("TIDINGS_PROVIDER_TIMEOUT_MS", "5000".into()),
                // Rate limits far above what a test sends (the limits' own tests set theirs):
                // the buckets are taken all the same.
                (
                    "TIDINGS_API_RATES",
                    "send:5000,recipients:100000,orders:5000,write:5000,read:5000,public:5000,callback:5000,auth:5000"
                        .into(),
                ),
            ],
            manual_clock: false,
            dev: true,
        }
    }
}

/// How long a scheduled job run through `/dev/schedules/{name}/run` may take to answer.
const SCHEDULED_RUN_PATIENCE: Duration = Duration::from_secs(120);

impl Options {
    /// On the emulators a provider call is a call to moto and a write to DynamoDB Local (the
    /// dev provider's record), which a loaded run has held past the default 5 s: there the
    /// provider gets 20 s, and the messages a visibility of 30 s to hold such a call. A test that
    /// expects every send to go uses it, and one that lets a message die after few receives.
    pub fn patient_provider(&mut self, backend: Backend) {
        if backend == Backend::Aws {
            self.env.retain(|(k, _)| !matches!(*k, "TIDINGS_PROVIDER_TIMEOUT_MS" | "TIDINGS_VISIBILITY_S"));
            self.env.push(("TIDINGS_PROVIDER_TIMEOUT_MS", "20000".into()));
            self.env.push(("TIDINGS_VISIBILITY_S", "30".into()));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.backend == Backend::Aws {
            self.clean_up_emulators();
        }
    }
}

impl Server {
    pub async fn start(backend: Backend, opts: Options) -> anyhow::Result<Self> {
        let tmp = std::sync::Arc::new(tempfile::tempdir()?);
        let run = format!("e2e{:08x}", rand::random::<u32>());
        let mut env: Vec<(String, String)> = opts.env.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect();
        env.push(("TIDINGS_API_KEYS".into(), format!("acme:key-acme-{run},globex:key-globex-{run}")));
        env.push(("TIDINGS_OPERATOR_KEYS".into(), format!("key-ops-{run}")));
        if backend == Backend::Aws {
            emulator();
            env.push(("TIDINGS_TABLE".into(), format!("{run}-table")));
            env.push(("TIDINGS_QUEUE_PREFIX".into(), format!("{run}-")));
            env.push(("TIDINGS_REDRIVE_MODE".into(), "receive-and-resend".into()));
        }
        let mut s = Self {
            base: String::new(),
            key: format!("key-acme-{run}"),
            ops_key: format!("key-ops-{run}"),
            child: None,
            backend,
            data_dir: tmp.path().join("data"),
            _tmp: tmp,
            env,
            dev: opts.dev,
            manual_clock: opts.manual_clock,
            answers: Default::default(),
            http: reqwest::Client::builder().timeout(Duration::from_secs(30)).build()?,
        };
        s.spawn().await?;
        Ok(s)
    }

    /// The variable `name` as this server was started with it (its table, its queues' prefix),
    /// for a command run beside it against the same backend.
    pub fn env_of(&self, name: &str) -> Option<(String, String)> {
        self.env.iter().find(|(k, _)| k == name).cloned()
    }

    pub fn other_tenant_key(&self) -> String {
        self.key.replace("key-acme-", "key-globex-")
    }

    async fn spawn(&mut self) -> anyhow::Result<()> {
        let mut cmd = Command::new(binary()?);
        cmd.arg("serve").arg("--addr").arg("127.0.0.1:0").arg("--data-dir").arg(&self.data_dir);
        cmd.arg("--backend").arg(match self.backend {
            Backend::Embedded => "embedded",
            Backend::Aws => "aws",
        });
        if self.backend == Backend::Aws {
            cmd.arg("--bootstrap");
        }
        if self.manual_clock {
            cmd.arg("--manual-clock");
        }
        if self.dev {
            cmd.arg("--dev");
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        cmd.env("TIDINGS_LOG", std::env::var("TIDINGS_LOG").unwrap_or_else(|_| "warn".into()));
        cmd.stdout(Stdio::piped()).stderr(Stdio::inherit()).kill_on_drop(true);
        let mut child = cmd.spawn().context("spawning tidings serve")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let deadline = Instant::now() + Duration::from_secs(120);
        let crash_test = self.env.iter().any(|(k, _)| k == "TIDINGS_CRASH_AT");
        let base = loop {
            let line = tokio::time::timeout_at(deadline.into(), lines.next_line())
                .await
                .context("tidings serve did not start in time")??;
            let Some(line) = line else {
                if crash_test {
                    // A crash point fired while the runtime caught up, before the API listened.
                    self.child = Some(child);
                    return Ok(());
                }
                bail!("tidings serve exited before listening");
            };
            if let Some(rest) = line.split("listening on ").nth(1) {
                break rest.split_whitespace().next().unwrap_or_default().to_owned();
            }
        };
        // Keep draining stdout so the child never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        self.base = base;
        self.child = Some(child);
        self.wait_healthy().await
    }

    async fn wait_healthy(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            // A crash point may end the process before it ever answers: the test checks that.
            if self.env.iter().any(|(k, _)| k == "TIDINGS_CRASH_AT")
                && let Some(child) = self.child.as_mut()
                && child.try_wait()?.is_some()
            {
                return Ok(());
            }
            if let Ok(r) = self.http.get(format!("{}/healthz", self.base)).send().await
                && r.status().is_success()
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("server not healthy")
    }

    /// Waits for the process to end by itself (a crash point aborted it); false if it is still
    /// running after `within`.
    pub async fn exited_within(&mut self, within: Duration) -> anyhow::Result<bool> {
        let Some(child) = self.child.as_mut() else { return Ok(true) };
        match tokio::time::timeout(within, child.wait()).await {
            Ok(status) => {
                status?;
                self.child = None;
                Ok(true)
            }
            Err(_) => Ok(false),
        }
    }

    /// Starts again on the same data (killing the process first if it still runs), with
    /// `TIDINGS_CRASH_AT` set to `crash_at` or removed.
    pub async fn restart_with_crash_at(&mut self, crash_at: Option<&str>) -> anyhow::Result<()> {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            child.wait().await?;
        }
        self.env.retain(|(k, _)| k != "TIDINGS_CRASH_AT");
        if let Some(point) = crash_at {
            self.env.push(("TIDINGS_CRASH_AT".into(), point.into()));
        }
        self.spawn().await
    }

    /// Stops the server, applies `updates` to the item at `key` in its store directly (behind
    /// the API's back, as a lost write or a bug would), and starts it again on the same data
    /// (a start runs the scheduled jobs, reconciliation among them).
    pub async fn write_behind_its_back(
        &mut self,
        key: tidings_core::ports::Key,
        updates: Vec<tidings_core::ports::Update>,
    ) -> anyhow::Result<()> {
        use tidings_core::ports::{Cond, SystemClock, Table};
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            child.wait().await?;
        }
        match self.backend {
            Backend::Embedded => {
                let path = self.data_dir.join("tidings.db");
                let store = tidings_embedded::EmbeddedStore::open_existing_with_clock(&path, Arc::new(SystemClock))?;
                store.update(&key, updates, Cond::Exists).await?;
            }
            Backend::Aws => {
                let table = self.env.iter().find(|(k, _)| k == "TIDINGS_TABLE").map(|(_, v)| v.clone());
                let config = tidings_aws::AwsConfig { table: table.context("no table")?, ..Default::default() };
                tidings_aws::AwsBackend::from_config(config).await.table().update(&key, updates, Cond::Exists).await?;
            }
        }
        self.spawn().await
    }

    /// The emulators' resources of this run go away once the test is over
    /// ([`remove_from_emulators`]).
    fn clean_up_emulators(&mut self) {
        let (Some((_, table)), Some((_, prefix))) = (self.env_of("TIDINGS_TABLE"), self.env_of("TIDINGS_QUEUE_PREFIX"))
        else {
            return;
        };
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
        }
        remove_from_emulators(table, prefix);
    }

    /// Stops the server (SIGKILL) and leaves it stopped: a client sees its connections refused.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        if let Some(mut child) = self.child.take() {
            child.start_kill()?;
            child.wait().await?;
        }
        Ok(())
    }

    /// `kill -9`, then start again on the same data.
    pub async fn kill9_and_restart(&mut self) -> anyhow::Result<()> {
        if let Some(mut child) = self.child.take() {
            child.start_kill()?; // SIGKILL
            child.wait().await?;
        }
        self.spawn().await
    }

    pub async fn call(&self, method: &str, path: &str, body: Option<Value>) -> anyhow::Result<(u16, Value)> {
        self.call_as(&self.key, method, path, body).await
    }

    /// `call` with the operator's key.
    pub async fn ops(&self, method: &str, path: &str, body: Option<Value>) -> anyhow::Result<(u16, Value)> {
        self.call_as(&self.ops_key, method, path, body).await
    }

    pub async fn call_as(
        &self,
        key: &str,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<(u16, Value)> {
        let url = format!("{}{}", self.base, path);
        let mut req = self.http.request(method.parse()?, url).header("authorization", format!("Bearer {key}"));
        if path.starts_with("/dev/schedules/") {
            // A scheduled job run by hand answers when it has run, as its function would: on
            // the emulators of a loaded run the tick (every hold, sweep and timer it finds) has
            // taken past the client's 30 s.
            req = req.timeout(SCHEDULED_RUN_PATIENCE);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let res = req.send().await?;
        let status = res.status().as_u16();
        self.answered(method, path, status);
        let text = res.text().await?;
        let value =
            if text.is_empty() { Value::Null } else { serde_json::from_str(&text).unwrap_or(Value::String(text)) };
        Ok((status, value))
    }

    /// `call`, with the response's headers.
    pub async fn call_with_headers(
        &self,
        method: &str,
        path: &str,
        body: Value,
    ) -> anyhow::Result<(u16, reqwest::header::HeaderMap, Value)> {
        let url = format!("{}{}", self.base, path);
        let res = self
            .http
            .request(method.parse()?, url)
            .header("authorization", format!("Bearer {}", self.key))
            .json(&body)
            .send()
            .await?;
        let (status, headers) = (res.status().as_u16(), res.headers().clone());
        self.answered(method, path, status);
        Ok((status, headers, res.json().await.unwrap_or(Value::Null)))
    }

    /// `POST /v1/orders`, sent again when the server answered 409 `write_conflict` or the call
    /// timed out (the order id makes a repeat safe): after `Retry-After` plus up to a second
    /// spread by the order id, so that a crowd of buyers who conflicted together does not come
    /// back together. Up to 20 tries.
    pub async fn place_order(&self, body: Value) -> anyhow::Result<(u16, Value)> {
        let spread = body["order_id"].as_str().unwrap_or_default().bytes().fold(0u64, |h, b| h * 31 + u64::from(b));
        for attempt in 0..20u64 {
            let (st, headers, v) = match self.call_with_headers("POST", "/v1/orders", body.clone()).await {
                Ok(answer) => answer,
                Err(e) if e.downcast_ref::<reqwest::Error>().is_some_and(reqwest::Error::is_timeout) => continue,
                Err(e) => return Err(e),
            };
            if st == 409 && v["code"] == "write_conflict" {
                let secs = headers.get("retry-after").and_then(|h| h.to_str().ok()).and_then(|h| h.parse().ok());
                let jitter = Duration::from_millis(spread.wrapping_add(attempt * 7919) % 1000);
                tokio::time::sleep(Duration::from_secs(secs.unwrap_or(1)) + jitter).await;
                continue;
            }
            return Ok((st, v));
        }
        anyhow::bail!("order {} met write conflicts or timeouts twenty times", body["order_id"])
    }

    pub async fn raw(
        &self,
        method: &str,
        path: &str,
        body: &str,
        key: Option<&str>,
    ) -> anyhow::Result<(u16, String, String)> {
        let mut req = self.http.request(method.parse()?, format!("{}{}", self.base, path)).body(body.to_owned());
        if let Some(k) = key {
            req = req.header("authorization", format!("Bearer {k}"));
        }
        req = req.header("content-type", "application/json");
        let res = req.send().await?;
        let status = res.status().as_u16();
        self.answered(method, path, status);
        let ct = res.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
        Ok((status, ct, res.text().await?))
    }

    fn answered(&self, method: &str, path: &str, status: u16) {
        let path = path.split('?').next().unwrap_or_default().to_owned();
        self.answers.lock().unwrap_or_else(|p| p.into_inner()).push((method.to_ascii_uppercase(), path, status));
    }

    /// The answers this server gave that the OpenAPI document (`openapi.json`, generated from the
    /// routes) does not list for their operation: `"METHOD /path → status"`, one per
    /// (operation, status). An answer to a path no operation has must be a 404 or 405.
    pub fn undocumented(&self) -> Vec<String> {
        undocumented(&self.answers())
    }

    /// Every answer so far: (method, path without its query, status).
    pub fn answers(&self) -> Vec<(String, String, u16)> {
        self.answers.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Accepted sends for this tenant's notification, as the fake providers recorded them.
    pub async fn sends(&self, notification_id: &str) -> anyhow::Result<Vec<Value>> {
        let (_, v) = self.call("GET", "/dev/deliveries", None).await?;
        Ok(v.as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|s| s["notification_id"] == notification_id)
            .collect())
    }

    /// Moves the manual clock (`--manual-clock`) and runs the tick: the timer buckets due by then
    /// fire.
    pub async fn advance_and_tick(&self, seconds: i64) -> anyhow::Result<()> {
        let (st, v) = self.call("POST", "/dev/clock/advance", Some(serde_json::json!({"seconds": seconds}))).await?;
        assert_eq!(st, 200, "{v}");
        let (st, v) = self.call("POST", "/dev/schedules/tick/run", None).await?;
        assert_eq!(st, 200, "{v}");
        Ok(())
    }

    /// Every accepted send of the fake providers.
    pub async fn sends_all(&self) -> anyhow::Result<Vec<Value>> {
        let (_, v) = self.call("GET", "/dev/deliveries", None).await?;
        Ok(v.as_array().cloned().unwrap_or_default())
    }

    /// Polls until `check` returns Some, or fails after `within`.
    pub async fn eventually<T, F, Fut>(&self, within: Duration, what: &str, mut check: F) -> anyhow::Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<Option<T>>>,
    {
        let deadline = Instant::now() + within;
        loop {
            if let Some(v) = check().await? {
                return Ok(v);
            }
            if Instant::now() > deadline {
                bail!("timed out waiting for: {what}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// An operation of the OpenAPI document: method, path template split at '/', documented statuses.
type Operation = (String, Vec<String>, Vec<String>);

/// The OpenAPI document's operations.
fn operations() -> Vec<Operation> {
    static OPS: std::sync::OnceLock<Vec<Operation>> = std::sync::OnceLock::new();
    OPS.get_or_init(|| {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../openapi.json");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let doc: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut ops = Vec::new();
        for (template, item) in doc["paths"].as_object().into_iter().flatten() {
            for (method, op) in item.as_object().into_iter().flatten() {
                let statuses = op["responses"].as_object().map(|r| r.keys().cloned().collect()).unwrap_or_default();
                let segments = template.split('/').map(str::to_owned).collect();
                ops.push((method.to_ascii_uppercase(), segments, statuses));
            }
        }
        ops
    })
    .clone()
}

/// How well a template matches a path: `None` when it does not, else the number of literal
/// segments (the most literal template wins: `/v1/users/batch` over `/v1/users/{user_id}`).
fn matching(template: &[String], path: &str) -> Option<usize> {
    let segments: Vec<&str> = path.split('/').collect();
    if segments.len() != template.len() {
        return None;
    }
    let mut literal = 0;
    for (t, s) in template.iter().zip(segments) {
        if t.starts_with('{') && t.ends_with('}') {
            if s.is_empty() {
                return None;
            }
        } else if t == s {
            literal += 1;
        } else {
            return None;
        }
    }
    Some(literal)
}

/// [`Server::undocumented`] of a list of answers.
pub fn undocumented(answers: &[(String, String, u16)]) -> Vec<String> {
    let ops = operations();
    let mut out = std::collections::BTreeSet::new();
    for (method, path, status) in answers {
        let best = ops
            .iter()
            .filter(|(m, _, _)| m == method)
            .filter_map(|op| matching(&op.1, path).map(|score| (score, op)))
            .max_by_key(|(score, _)| *score);
        match best {
            Some((_, (_, template, statuses))) => {
                if !statuses.iter().any(|s| s == &status.to_string() || s == "default") {
                    out.insert(format!(
                        "{method} {} → {status} (documented: {})",
                        template.join("/"),
                        statuses.join(", ")
                    ));
                }
            }
            // No such operation: only "not found" or "method not allowed" are right.
            None if matches!(status, 404 | 405) => {}
            None => {
                out.insert(format!("{method} {path} → {status} (no operation in the OpenAPI document)"));
            }
        }
    }
    out.into_iter().collect()
}
