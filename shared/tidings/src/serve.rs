//! `tidings serve`: the API, the relay, the workers and the schedules in one process.

use std::sync::Arc;

use anyhow::Context;
use async_trait::async_trait;
use tidings_api::{AppState, DevControl};
use tidings_core::dev::DevProviders;
use tidings_core::gates::GateStore;
use tidings_core::gates::api::ApiLimits;
use tidings_core::ops::tenants::{KeySpec, Role};
use tidings_core::ports::{Clock, ManualClock, SystemClock};
use tidings_core::{Deps, TenantId, ops::tenants, roles};
use tokio::sync::watch;
use tracing::info;

use crate::ServeArgs;
use crate::backend::{Backend, StoreUse};

struct Dev {
    providers: DevProviders,
    clock_moved: Arc<tokio::sync::Notify>,
    manual: Option<Arc<ManualClock>>,
    deps: Deps,
    keyless: bool,
}

#[async_trait]
impl DevControl for Dev {
    fn providers(&self) -> &DevProviders {
        &self.providers
    }
    fn manual_clock(&self) -> Option<&ManualClock> {
        self.manual.as_deref()
    }
    async fn run_schedule(&self, name: &str) -> Result<Option<serde_json::Value>, String> {
        crate::schedules::run(&self.deps, name).await
    }
    fn clock_moved(&self) {
        self.clock_moved.notify_waiters();
    }
    fn keyless(&self) -> bool {
        self.keyless
    }
}

/// Where this server is reached: `TIDINGS_PUBLIC_URL` when set (a proxy or tunnel in front),
/// else the address it listens on, a wildcard address as loopback. Tracking and unsubscribe
/// links and the console's link start with it (docs/tracking.md, "Signed links").
fn base_url(addr: std::net::SocketAddr, public_url: Option<&str>) -> String {
    if let Some(url) = public_url.map(|u| u.trim_end_matches('/')).filter(|u| !u.is_empty()) {
        return url.to_owned();
    }
    let mut addr = addr;
    if addr.ip().is_unspecified() {
        addr.set_ip(if addr.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    format!("http://{addr}")
}

/// The console's link. The keys ride in the URL's fragment, which a browser never sends (so
/// no server or proxy logs them); the page moves them to its session storage and takes them
/// off the address bar. Without a printed operator key (keys from the environment) the link
/// has none and the page asks for it.
fn console_url(base: &str, operator: Option<&str>, tenant: Option<&str>) -> String {
    // Generated keys are URL-safe base64; a key that is not is left out rather than mangled.
    let url_safe = |k: &&str| k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    let mut fragment = Vec::new();
    if let Some(key) = operator.filter(url_safe) {
        fragment.push(format!("key={key}"));
        if let Some(tenant) = tenant.filter(url_safe) {
            fragment.push(format!("tenant_key={tenant}"));
        }
    }
    if fragment.is_empty() { format!("{base}/") } else { format!("{base}/#{}", fragment.join("&")) }
}

/// The keys a local run prints.
struct LocalKeys {
    tenant: Option<String>,
    operator: Option<String>,
}

/// A key made once and kept in the data directory (readable by its owner only).
fn key_file(args: &ServeArgs, name: &str) -> anyhow::Result<String> {
    let path = args.backend.data_dir.join(name);
    match std::fs::read_to_string(&path) {
        Ok(k) if !k.trim().is_empty() => Ok(k.trim().to_owned()),
        _ => {
            std::fs::create_dir_all(&args.backend.data_dir)?;
            let k = tenants::generate_key();
            crate::backend::write_private(&path, &k)?;
            Ok(k)
        }
    }
}

/// The keys of a local run: tenants' from `TIDINGS_API_KEYS="tenant_a:key_a,tenant_b:key_b"`,
/// operators' from `TIDINGS_OPERATOR_KEYS="key_1,key_2"`. On the embedded backend, without them,
/// a `demo` tenant key and an operator key, made once and kept in the data directory. Keys an
/// earlier start registered and the environment no longer lists are revoked.
///
/// A deployed stack's keys are made with `tidings keys` or `/v1/admin/keys`: against AWS (any
/// endpoint that is not on this machine) the environment's keys are refused and none is made.
async fn api_keys(backend: &Backend, args: &ServeArgs) -> anyhow::Result<LocalKeys> {
    let deps = &backend.deps;
    let tenant_spec = crate::settings().get("TIDINGS_API_KEYS").map(str::to_owned);
    let operator_spec = crate::settings().get("TIDINGS_OPERATOR_KEYS").map(str::to_owned);
    if !backend.local {
        if tenant_spec.is_some() || operator_spec.is_some() {
            anyhow::bail!(
                "TIDINGS_API_KEYS and TIDINGS_OPERATOR_KEYS are for local runs: against AWS, make keys with \
                 `tidings keys create --backend aws` (or POST /v1/admin/keys)"
            );
        }
        return Ok(LocalKeys { tenant: None, operator: None });
    }
    let embedded = args.backend.backend == crate::BackendKind::Embedded;
    // Short keys, and one key given to two holders, refuse the start (config::env_keys).
    let given = crate::settings().env_keys()?;
    let mut kept: Vec<String> = Vec::new();
    let mut printed = LocalKeys { tenant: None, operator: None };
    let operator = KeySpec { role: Role::Operator, ..Default::default() };
    for k in &given {
        match &k.tenant {
            Some(tenant) => tenants::register_key(deps, tenant, &k.key).await?,
            None => tenants::register(deps, &k.key, operator.clone()).await?,
        }
        kept.push(k.key.clone());
    }
    if tenant_spec.is_none() && embedded {
        let key = key_file(args, "demo-api-key")?;
        let demo = TenantId::parse("demo").map_err(|e| anyhow::anyhow!("{e}"))?;
        tenants::register_key(deps, &demo, &key).await?;
        kept.push(key.clone());
        printed.tenant = Some(key);
    }
    if operator_spec.is_none() && embedded {
        let key = key_file(args, "operator-api-key")?;
        tenants::register(deps, &key, operator).await?;
        kept.push(key.clone());
        printed.operator = Some(key);
    }
    let kept: Vec<&str> = kept.iter().map(String::as_str).collect();
    let revoked = tenants::revoke_env_keys_except(deps, &kept).await?;
    if revoked > 0 {
        info!(revoked, "revoked keys the environment no longer lists");
    }
    Ok(printed)
}

pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let manual = args.manual_clock.then(|| Arc::new(ManualClock::new(chrono::Utc::now())));
    let clock: Arc<dyn Clock> = match &manual {
        Some(m) => m.clone(),
        None => Arc::new(SystemClock),
    };
    let aws = args.backend.backend == crate::BackendKind::Aws;
    if aws && args.manual_clock && !args.dev {
        anyhow::bail!("--manual-clock moves only by POST /dev/clock/advance: with --backend aws it needs --dev");
    }
    // Bound first: with `--addr 127.0.0.1:0` the port is known only now, and the links the
    // backend signs start with it.
    let listener = tokio::net::TcpListener::bind(args.addr).await.with_context(|| format!("binding {}", args.addr))?;
    let addr = listener.local_addr()?;
    let base = base_url(addr, crate::settings().get("TIDINGS_PUBLIC_URL"));
    let backend = roles::acting_as(
        roles::STARTUP,
        Backend::open_for(&args.backend, clock, args.dev, StoreUse::MakeWhenMissing, Some(base.clone())),
    )
    .await?;
    let keys = roles::acting_as(roles::STARTUP, api_keys(&backend, &args)).await?;
    if let Some(m) = &manual {
        // The manual clock resumes where it stood on this data, before any worker reads it.
        let table = backend.deps.table.as_ref();
        match roles::acting_as(roles::STARTUP, tidings_core::dev::stored_manual_clock(table)).await? {
            Some(stored) => {
                m.set(stored);
                info!(now = %stored, "manual clock resumed");
            }
            None => roles::acting_as(roles::STARTUP, tidings_core::dev::store_manual_clock(table, m.now())).await?,
        }
    }

    let (stop_tx, stop_rx) = watch::channel(false);
    let hub = Arc::new(tidings_api::routes::live::LocalHub::default());
    // Every metric also to Prometheus, whose text `GET /metrics` renders (no listener of its own).
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let scrape = prometheus.handle();
    tidings_core::metrics::install_with(Some(Box::new(prometheus)));
    let render = scrape.clone();
    tidings_core::metrics::set_exposition(Box::new(move || render.render()));
    // The summaries' windows move on only when kept (an exporter's listener would do it).
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            scrape.run_upkeep();
        }
    });
    let mut workers = crate::runtime::start(
        backend.deps.clone(),
        hub.clone(),
        backend.feed.clone(),
        backend.queue_names.clone(),
        backend.queue_arn_prefix.clone(),
        stop_rx.clone(),
    );
    let clock_moved = Arc::new(tokio::sync::Notify::new());
    crate::schedules::start(&mut workers, backend.deps.clone(), clock_moved.clone(), stop_rx);

    // `/dev/*` without a key: asked for, and reachable from this machine only.
    let keyless = args.dev && args.addr.ip().is_loopback();
    let dev = backend.dev.clone().map(|providers| -> Arc<dyn DevControl> {
        Arc::new(Dev { providers, clock_moved, manual, deps: backend.deps.clone(), keyless })
    });
    let state = AppState::new(tidings_api::AppParts {
        deps: backend.deps.clone(),
        queue_names: Arc::new(backend.queue_names.clone()),
        dev,
        live: Some(hub),
    });
    // The API's rate buckets: in the table on AWS (shared with every other instance), in this
    // process on the embedded backend.
    let store = if aws { GateStore::Shared(backend.deps.table.clone()) } else { GateStore::Local };
    let limits = Arc::new(ApiLimits::new(backend.deps.config.api_rates.clone(), store));
    let console = console_url(&base, keys.operator.as_deref(), keys.tenant.as_deref());
    match args.backend.backend {
        // Where the other commands (`tidings keys`, `tidings ops`) must look: `--data-dir`.
        crate::BackendKind::Embedded => {
            let data = std::path::absolute(&args.backend.data_dir).unwrap_or_else(|_| args.backend.data_dir.clone());
            println!("Tidings is listening on http://{addr} (backend: embedded, data: {})", data.display());
        }
        crate::BackendKind::Aws => println!("Tidings is listening on http://{addr} (backend: aws)"),
    }
    // Ready to paste: the README's quickstart and client snippets read these three.
    println!("Paste into your shell (the README's quickstart uses them):");
    println!("  export TIDINGS_URL={base}");
    if let Some(key) = keys.tenant {
        println!("  export TIDINGS_API_KEY={key}        # tenant demo: its /v1 data");
    }
    if let Some(key) = keys.operator {
        println!("  export TIDINGS_OPERATOR_KEY={key}   # operator: the console, /v1/ops, /v1/admin, /dev");
    }
    // The console is served with the `/dev` routes.
    if state.dev.is_some() {
        println!("Console: {console}");
    }
    info!(%addr, "serving");
    // Every request is the API function's (the WebSocket route says it is `ws-connections`).
    let app = tidings_api::app_with_limits(state, limits)
        .layer(axum::middleware::from_fn(|req, next: axum::middleware::Next| roles::acting_as("api", next.run(req))));
    // The peer's address: the public routes' rate limits are per client address.
    axum::serve(listener, app.into_make_service_with_connect_info::<std::net::SocketAddr>())
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    let _ = stop_tx.send(true);
    workers.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::{base_url, console_url};

    /// The link `serve` prints: keys in the fragment only (never the path or query, which reach
    /// the server), loopback for a wildcard address, no key that would need escaping.
    #[test]
    fn the_console_link_carries_the_keys_in_its_fragment() {
        let at = |a: &str| base_url(a.parse::<std::net::SocketAddr>().unwrap_or_else(|e| panic!("{a}: {e}")), None);
        assert_eq!(
            console_url(&at("127.0.0.1:8080"), Some("tk_op-1"), Some("tk_demo_2")),
            "http://127.0.0.1:8080/#key=tk_op-1&tenant_key=tk_demo_2"
        );
        assert_eq!(console_url(&at("0.0.0.0:8080"), Some("tk_op"), None), "http://127.0.0.1:8080/#key=tk_op");
        assert_eq!(console_url(&at("[::]:8080"), None, Some("tk_demo")), "http://[::1]:8080/", "no operator key: none");
        assert_eq!(console_url(&at("127.0.0.1:1"), Some("a&b=c"), Some("tk")), "http://127.0.0.1:1/");
    }

    /// Links start with the listening address, whatever it is, unless `TIDINGS_PUBLIC_URL` says
    /// where the server is reached from outside.
    #[test]
    fn links_start_with_the_listening_address_unless_a_public_url_is_set() {
        let addr = |a: &str| a.parse::<std::net::SocketAddr>().unwrap_or_else(|e| panic!("{a}: {e}"));
        assert_eq!(base_url(addr("127.0.0.1:9300"), None), "http://127.0.0.1:9300");
        assert_eq!(base_url(addr("192.0.2.10:8081"), None), "http://192.0.2.10:8081");
        assert_eq!(base_url(addr("0.0.0.0:9300"), None), "http://127.0.0.1:9300");
        assert_eq!(
            base_url(addr("0.0.0.0:9300"), Some("https://shop.example/tidings/")),
            "https://shop.example/tidings"
        );
        assert_eq!(
            console_url(&base_url(addr("0.0.0.0:1"), Some("https://t.example")), None, None),
            "https://t.example/"
        );
    }
}
