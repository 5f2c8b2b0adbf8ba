//! `tidings serve`: the API, the relay, the workers and the schedules in one process.

use std::sync::Arc;

use anyhow::Context;
use async_trait::async_trait;
use tidings_api::{AppState, DevControl};
use tidings_core::dev::DevProviders;
use tidings_core::ports::{Clock, ManualClock, SystemClock};
use tidings_core::{Deps, TenantId, roles, tenants};
use tokio::sync::watch;
use tracing::info;

use crate::ServeArgs;
use crate::backend::Backend;

struct Dev {
    providers: DevProviders,
    clock_moved: Arc<tokio::sync::Notify>,
    manual: Option<Arc<ManualClock>>,
    deps: Deps,
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
}

/// Registers the API keys of `TIDINGS_API_KEYS="tenant_a:key_a,tenant_b:key_b"`, or, without
/// it, the `demo` tenant's key (made once, kept in the data directory). Returns what to print.
async fn api_keys(deps: &Deps, args: &ServeArgs) -> anyhow::Result<Option<String>> {
    if let Ok(spec) = std::env::var("TIDINGS_API_KEYS")
        && !spec.trim().is_empty()
    {
        for pair in spec.split(',') {
            let (tenant, key) = pair.trim().split_once(':').context("TIDINGS_API_KEYS entries are tenant:key")?;
            let tenant = TenantId::parse(tenant).map_err(|e| anyhow::anyhow!("TIDINGS_API_KEYS: {e}"))?;
            tenants::register_key(deps, &tenant, key).await?;
        }
        return Ok(None);
    }
    let path = args.backend.data_dir.join("demo-api-key");
    let key = match std::fs::read_to_string(&path) {
        Ok(k) if !k.trim().is_empty() => k.trim().to_owned(),
        _ => {
            std::fs::create_dir_all(&args.backend.data_dir)?;
            let k = tenants::generate_key();
            crate::backend::write_private(&path, &k)?;
            k
        }
    };
    let demo = TenantId::parse("demo").map_err(|e| anyhow::anyhow!("{e}"))?;
    tenants::register_key(deps, &demo, &key).await?;
    Ok(Some(key))
}

pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let manual = args.manual_clock.then(|| Arc::new(ManualClock::new(chrono::Utc::now())));
    let clock: Arc<dyn Clock> = match &manual {
        Some(m) => m.clone(),
        None => Arc::new(SystemClock),
    };
    let backend = roles::acting_as(roles::STARTUP, Backend::open(&args.backend, clock)).await?;
    let demo_key = roles::acting_as(roles::STARTUP, api_keys(&backend.deps, &args)).await?;

    let (stop_tx, stop_rx) = watch::channel(false);
    let hub = Arc::new(tidings_api::routes::live::LocalHub::default());
    tidings_core::metrics::install();
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

    let dev = Dev { providers: backend.dev.clone(), clock_moved, manual, deps: backend.deps.clone() };
    let state = AppState {
        deps: backend.deps.clone(),
        queue_names: Arc::new(backend.queue_names.clone()),
        dev: Some(Arc::new(dev)),
        live: Some(hub),
    };
    let listener = tokio::net::TcpListener::bind(args.addr).await.with_context(|| format!("binding {}", args.addr))?;
    let addr = listener.local_addr()?;
    println!("Tidings is listening on http://{addr} (backend: {:?})", args.backend.backend);
    if let Some(key) = demo_key {
        println!("API key for tenant demo: {key}");
        println!("  try: curl -H 'Authorization: Bearer {key}' http://{addr}/v1/ops/queues");
    }
    info!(%addr, "serving");
    // Every request is the API function's (the WebSocket route says it is `ws-connections`).
    let app = tidings_api::app(state)
        .layer(axum::middleware::from_fn(|req, next: axum::middleware::Next| roles::acting_as("api", next.run(req))));
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    let _ = stop_tx.send(true);
    workers.shutdown().await;
    Ok(())
}
