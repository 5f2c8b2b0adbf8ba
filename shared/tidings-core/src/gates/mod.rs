//! The gates in front of the providers (docs/gates.md), as `Provider`
//! decorators so that the channel worker does not change:
//!
//! 1. a token bucket per provider, shared by every instance ([`SharedGate`] in the table on
//!    AWS; [`LocalGate`] on the embedded backend, where one process is the whole system);
//! 2. a token bucket per tenant, so one shop cannot take all the capacity;
//! 3. bounded worker concurrency: the runtime's fixed worker pools (Lambda: reserved
//!    concurrency), never grown on 429.
//!
//! A send that would wait longer than `max_wait` at a gate is not held: it is handed back as a
//! transient error with the wait as `retry_after`, and its message comes back then.
//!
//! Then a circuit breaker per provider ([`breaker`]); SMS may fail over to a second provider
//! while the first one's breaker is open ([`Failover`]).

pub mod api;
pub mod breaker;
pub mod token_bucket;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

pub use breaker::{Breaker, BreakerConfig, BreakerState};
pub use token_bucket::{LocalGate, RateGate, SharedGate, TokenBucket};

use crate::metrics::{GATE_WAIT_MS, PROVIDER_CALLS};
use crate::ports::{
    Channel, Clock, OutboundMessage, Provider, ProviderError, ProviderReceipt, Providers, SystemClock, Table,
};

/// Rates and breaker settings ([`crate::config`] parses them):
/// - `TIDINGS_PROVIDER_RATES="email:14,sms:20,push:500,sms-secondary:10"`: sends per second per
///   provider (by channel; the SMS failover provider is `sms-secondary`); absent: unlimited;
/// - `TIDINGS_TENANT_RATES="default:1000,acme:50"`: sends per second per tenant;
/// - `TIDINGS_GATE_MAX_WAIT_MS` (default 2000): the longest a send waits at a gate;
/// - `TIDINGS_BREAKER="window_s=10,min_calls=20,error_ratio=0.5,open_s=30,probes=3"` (or `off`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GateConfig {
    pub provider_rates: BTreeMap<String, f64>,
    pub tenant_rates: BTreeMap<String, f64>,
    pub default_tenant_rate: Option<f64>,
    pub max_wait: Duration,
    pub breaker: BreakerConfig,
}

/// The start of the reason of a send refused by a rate gate before reaching the provider (not
/// the provider's fault: the breaker ignores it).
pub const GATE_REFUSAL: &str = "rate gate";

/// Whether the provider said "too many requests" (429, throttling), as opposed to failing.
pub fn is_rate_limited(e: &ProviderError) -> bool {
    match e {
        ProviderError::Transient { reason, .. } => {
            let r = reason.to_ascii_lowercase();
            r.contains("429") || r.contains("throttl") || r.contains("too many requests")
        }
        ProviderError::Permanent { .. } => false,
    }
}

/// Whether a transient error is the provider saying "too many requests".
pub fn is_throttle(e: &ProviderError) -> bool {
    match e {
        ProviderError::Transient { reason, retry_after } => {
            retry_after.is_some() || reason.contains("429") || reason.to_ascii_lowercase().contains("throttl")
        }
        ProviderError::Permanent { .. } => false,
    }
}

/// How the gates make their gates (local or shared in a table).
#[derive(Clone)]
pub enum GateStore {
    Local,
    Shared(Arc<dyn Table>),
}

impl GateStore {
    fn gate(&self, name: &str, rate: f64, now_ms: i64) -> Arc<dyn RateGate> {
        match self {
            GateStore::Local => Arc::new(LocalGate::new(rate, now_ms)),
            GateStore::Shared(table) => Arc::new(SharedGate::new(table.clone(), name, rate)),
        }
    }
}

/// Per-tenant gates, made on first use.
pub struct TenantGates {
    config: GateConfig,
    store: GateStore,
    gates: Mutex<BTreeMap<String, Arc<dyn RateGate>>>,
}

impl TenantGates {
    pub fn new(config: GateConfig, store: GateStore) -> Self {
        Self { config, store, gates: Mutex::new(BTreeMap::new()) }
    }

    fn gate(&self, tenant: &str, now_ms: i64) -> Option<Arc<dyn RateGate>> {
        let rate = self.config.tenant_rates.get(tenant).copied().or(self.config.default_tenant_rate)?;
        let mut gates = self.gates.lock().unwrap_or_else(|p| p.into_inner());
        Some(
            gates
                .entry(tenant.to_owned())
                .or_insert_with(|| self.store.gate(&format!("tenant#{tenant}"), rate, now_ms))
                .clone(),
        )
    }
}

/// The rate gates in front of one provider.
pub struct Gated {
    inner: Arc<dyn Provider>,
    channel: Channel,
    provider_gate: Option<Arc<dyn RateGate>>,
    tenants: Arc<TenantGates>,
    max_wait: Duration,
    clock: Arc<dyn Clock>,
}

impl Gated {
    pub fn new(
        inner: Arc<dyn Provider>,
        channel: Channel,
        provider_gate: Option<Arc<dyn RateGate>>,
        tenants: Arc<TenantGates>,
        max_wait: Duration,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self { inner, channel, provider_gate, tenants, max_wait, clock }
    }

    /// Waits for a token of `gate` (at most what is left of `max_wait`).
    async fn pass(&self, gate: &dyn RateGate, name: &str, waited: &mut Duration) -> Result<(), ProviderError> {
        loop {
            match gate.try_take(self.clock.now_ms()).await {
                Ok(()) => return Ok(()),
                Err(wait) if *waited + wait <= self.max_wait => {
                    metrics::histogram!(GATE_WAIT_MS, "gate" => name.to_owned()).record(wait.as_secs_f64() * 1000.0);
                    tokio::time::sleep(wait).await;
                    *waited += wait;
                }
                Err(wait) => {
                    return Err(ProviderError::Transient {
                        reason: format!("{GATE_REFUSAL} {name}: over the configured rate"),
                        retry_after: Some(wait.max(Duration::from_millis(100))),
                    });
                }
            }
        }
    }
}

#[async_trait]
impl Provider for Gated {
    fn name(&self) -> &str {
        self.inner.name()
    }

    // Device registration is no send: it passes the gates untouched.
    async fn register_device(&self, platform: crate::ports::Platform, token: &str) -> Result<String, ProviderError> {
        self.inner.register_device(platform, token).await
    }

    async fn unregister_device(&self, address: &str) -> Result<(), ProviderError> {
        self.inner.unregister_device(address).await
    }

    async fn send(&self, message: &OutboundMessage) -> Result<ProviderReceipt, ProviderError> {
        let mut waited = Duration::ZERO;
        if let Some(gate) = self.tenants.gate(&message.tenant, self.clock.now_ms()) {
            self.pass(gate.as_ref(), "tenant", &mut waited).await?;
        }
        if let Some(gate) = &self.provider_gate {
            self.pass(gate.as_ref(), self.channel.as_str(), &mut waited).await?;
        }
        let result = self.inner.send(message).await;
        let outcome = match &result {
            Ok(_) => "ok",
            Err(e) if is_throttle(e) => "throttled",
            Err(ProviderError::Transient { .. }) => "transient",
            Err(ProviderError::Permanent { .. }) => "permanent",
        };
        metrics::counter!(PROVIDER_CALLS, "channel" => self.channel.as_str(), "provider" => self.inner.name().to_owned(), "result" => outcome)
            .increment(1);
        if let Some(gate) = &self.provider_gate {
            match &result {
                Ok(_) => gate.succeeded().await,
                Err(e) if is_throttle(e) => {
                    let retry_after = match e {
                        ProviderError::Transient { retry_after, .. } => *retry_after,
                        ProviderError::Permanent { .. } => None,
                    };
                    gate.throttled(self.clock.now_ms(), retry_after).await;
                }
                Err(_) => {}
            }
        }
        result
    }
}

/// A provider behind its circuit breaker.
pub struct Guarded {
    inner: Arc<dyn Provider>,
    channel: Channel,
    breaker: Mutex<Breaker>,
    clock: Arc<dyn Clock>,
}

/// Records a call that was dropped before it ended (the worker's timeout) as a failure.
struct CallGuard<'a> {
    guarded: &'a Guarded,
    done: bool,
}

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.guarded.record(true);
        }
    }
}

impl Guarded {
    pub fn new(inner: Arc<dyn Provider>, channel: Channel, config: BreakerConfig, clock: Arc<dyn Clock>) -> Self {
        Self { inner, channel, breaker: Mutex::new(Breaker::new(config)), clock }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Breaker> {
        self.breaker.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn record(&self, failed: bool) {
        let now = self.clock.now_ms();
        self.lock().record(now, failed);
    }

    pub fn state(&self) -> BreakerState {
        self.lock().state().clone()
    }

    /// Sends if the breaker lets the call through; `None` when it is open.
    pub async fn try_send(&self, message: &OutboundMessage) -> Option<Result<ProviderReceipt, ProviderError>> {
        let allowed = {
            let now = self.clock.now_ms();
            self.lock().allow(now)
        };
        if !allowed {
            metrics::counter!(PROVIDER_CALLS, "channel" => self.channel.as_str(), "provider" => self.inner.name().to_owned(), "result" => "open")
                .increment(1);
            return None;
        }
        let mut guard = CallGuard { guarded: self, done: false };
        let result = self.inner.send(message).await;
        guard.done = true;
        match &result {
            Err(ProviderError::Transient { reason, .. }) if reason.starts_with(GATE_REFUSAL) => {
                // Not an answer of the provider: give the probe back.
                let now = self.clock.now_ms();
                self.lock().record(now, false);
            }
            // A 429 is a healthy provider asking for less: the rate gate slows down for it;
            // counted as a failure it would open the breaker on a campaign's first burst.
            Err(e) if is_rate_limited(e) => {
                let now = self.clock.now_ms();
                self.lock().record(now, false);
            }
            r => self.record(matches!(r, Err(ProviderError::Transient { .. }))),
        }
        Some(result)
    }
}

#[async_trait]
impl Provider for Guarded {
    fn name(&self) -> &str {
        self.inner.name()
    }

    // Device registration is no send: it passes the gates untouched.
    async fn register_device(&self, platform: crate::ports::Platform, token: &str) -> Result<String, ProviderError> {
        self.inner.register_device(platform, token).await
    }

    async fn unregister_device(&self, address: &str) -> Result<(), ProviderError> {
        self.inner.unregister_device(address).await
    }

    async fn send(&self, message: &OutboundMessage) -> Result<ProviderReceipt, ProviderError> {
        match self.try_send(message).await {
            Some(result) => result,
            None => {
                let wait = self.lock().open_for(self.clock.now_ms());
                Err(ProviderError::Transient {
                    reason: format!("circuit open for provider {}", self.inner.name()),
                    retry_after: Some(wait.max(Duration::from_secs(1))),
                })
            }
        }
    }
}

/// SMS failover: the primary while its breaker lets calls through, else the secondary.
pub struct Failover {
    primary: Arc<Guarded>,
    secondary: Arc<dyn Provider>,
}

impl Failover {
    pub fn new(primary: Arc<Guarded>, secondary: Arc<dyn Provider>) -> Self {
        Self { primary, secondary }
    }
}

#[async_trait]
impl Provider for Failover {
    fn name(&self) -> &str {
        self.primary.name()
    }

    // Device registration is no send: it passes the gates untouched.
    async fn register_device(&self, platform: crate::ports::Platform, token: &str) -> Result<String, ProviderError> {
        self.primary.register_device(platform, token).await
    }

    async fn unregister_device(&self, address: &str) -> Result<(), ProviderError> {
        self.primary.unregister_device(address).await
    }

    async fn send(&self, message: &OutboundMessage) -> Result<ProviderReceipt, ProviderError> {
        match self.primary.try_send(message).await {
            Some(result) => result,
            None => self.secondary.send(message).await,
        }
    }
}

/// Puts the gates in front of the providers: the breaker first (a call it refuses takes no
/// token), then the tenant and provider buckets. `sms_secondary`: the SMS failover provider.
pub fn wrap(
    providers: &Providers,
    sms_secondary: Option<Arc<dyn Provider>>,
    config: &GateConfig,
    store: GateStore,
) -> Providers {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let now = clock.now_ms();
    let tenants = Arc::new(TenantGates::new(config.clone(), store.clone()));
    let gated = |channel: Channel, name: &str, inner: Arc<dyn Provider>| -> Arc<dyn Provider> {
        let gate = config.provider_rates.get(name).map(|rate| store.gate(&format!("provider#{name}"), *rate, now));
        Arc::new(Gated::new(inner, channel, gate, tenants.clone(), config.max_wait, clock.clone()))
    };
    let guarded = |channel: Channel, inner: &Arc<dyn Provider>| {
        Arc::new(Guarded::new(inner.clone(), channel, config.breaker.clone(), clock.clone()))
    };
    let sms: Arc<dyn Provider> = match sms_secondary {
        Some(secondary) => {
            let secondary = gated(Channel::Sms, "sms-secondary", secondary);
            let primary = guarded(Channel::Sms, &gated(Channel::Sms, "sms", providers.sms.clone()));
            Arc::new(Failover::new(primary, secondary))
        }
        None => guarded(Channel::Sms, &gated(Channel::Sms, "sms", providers.sms.clone())),
    };
    Providers {
        email: guarded(Channel::Email, &gated(Channel::Email, "email", providers.email.clone())),
        sms,
        push: guarded(Channel::Push, &gated(Channel::Push, "push", providers.push.clone())),
    }
}
