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
//! transient error whose reason starts with [`GATE_REFUSAL`], with the wait as `retry_after`;
//! the channel worker puts its message back on its queue for that long, without counting an
//! attempt (the provider never saw it).
//!
//! Time at the gates is not time with the provider: [`within`] bounds a send by the provider
//! timeout counted outside the gates only, so a send that waited its turn is never taken for a
//! provider call that may have reached the provider (`outcome_unknown`).
//!
//! A 429 with `Retry-After` holds the provider for its tenant ([`TenantGates::hold`]): no send
//! of that tenant reaches that provider before it has passed, with or without configured rates;
//! other tenants are not held.
//!
//! Then a circuit breaker per provider ([`breaker`]); SMS may fail over to a second provider
//! while the first one's breaker is open ([`Failover`]).

pub mod api;
pub mod breaker;
pub mod token_bucket;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;

pub use breaker::{Breaker, BreakerConfig, BreakerState};
pub use token_bucket::{LocalGate, RateGate, SharedGate, TokenBucket};

use crate::metrics::{GATE_WAIT_MS, PROVIDER_CALLS};
use crate::ports::{
    Channel, Clock, Cond, Item, Key, OutboundMessage, Provider, ProviderError, ProviderReceipt, Providers, StoreError,
    SystemClock, Table,
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

fn is_throttle_result(r: &Result<ProviderReceipt, ProviderError>) -> bool {
    matches!(r, Err(e) if is_throttle(e))
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

/// Time spent at the gates by the send being bounded by [`within`].
#[derive(Default)]
struct GateTime {
    /// Time at the gates, passes that ended.
    waited: Duration,
    /// When the pass under way began.
    since: Option<Instant>,
}

tokio::task_local! {
    static GATE_TIME: Arc<Mutex<GateTime>>;
}

fn lock_time(t: &Mutex<GateTime>) -> std::sync::MutexGuard<'_, GateTime> {
    t.lock().unwrap_or_else(|p| p.into_inner())
}

/// Marks the time until it is dropped as time at a gate (for [`within`]; nothing outside it).
/// [`Gated`] holds one while it waits its turn.
pub struct AtGate;

impl AtGate {
    pub fn enter() -> Self {
        let _ = GATE_TIME.try_with(|t| {
            lock_time(t).since.get_or_insert_with(Instant::now);
        });
        AtGate
    }
}

impl Drop for AtGate {
    fn drop(&mut self) {
        let _ = GATE_TIME.try_with(|t| {
            let mut t = lock_time(t);
            if let Some(since) = t.since.take() {
                t.waited += since.elapsed();
            }
        });
    }
}

/// Why [`within`] gave up on a send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elapsed {
    /// The provider timeout ran out outside the gates: the provider may have the message.
    InCall,
    /// Still at a gate past `gate_limit`: the provider never saw the message.
    AtGate,
}

/// Runs `send` (a provider call behind its gates) with `timeout` counted only outside the gates:
/// time waiting for a token or a provider's `Retry-After` is not the provider's. The gates bound
/// their own waits (`max_wait`); `gate_limit` bounds the whole as a last resort (a gate's store
/// that does not answer), and past it a send still at a gate is [`Elapsed::AtGate`].
pub async fn within<F: std::future::Future>(
    timeout: Duration,
    gate_limit: Duration,
    send: F,
) -> Result<F::Output, Elapsed> {
    let time = Arc::new(Mutex::new(GateTime::default()));
    let send = GATE_TIME.scope(time.clone(), send);
    tokio::pin!(send);
    let start = Instant::now();
    loop {
        let (at_gate, in_gate) = {
            let t = lock_time(&time);
            (t.waited + t.since.map(|s| s.elapsed()).unwrap_or_default(), t.since.is_some())
        };
        let elapsed = start.elapsed();
        let outside = elapsed.saturating_sub(at_gate);
        if outside >= timeout {
            return Err(Elapsed::InCall);
        }
        if elapsed >= timeout + gate_limit {
            return Err(if in_gate { Elapsed::AtGate } else { Elapsed::InCall });
        }
        let next = (timeout - outside).min(timeout + gate_limit - elapsed).max(Duration::from_millis(1));
        tokio::select! {
            done = &mut send => return Ok(done),
            () = tokio::time::sleep(next) => {}
        }
    }
}

/// Whether a send was refused by a gate before reaching the provider.
pub fn gate_refusal(e: &ProviderError) -> Option<Duration> {
    match e {
        ProviderError::Transient { reason, retry_after } if reason.starts_with(GATE_REFUSAL) => {
            Some(retry_after.unwrap_or(Duration::from_secs(1)))
        }
        _ => None,
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

/// Per-tenant gates, made on first use, and the holds a provider's `Retry-After` put on a
/// tenant's sends to it.
pub struct TenantGates {
    config: GateConfig,
    store: GateStore,
    gates: Mutex<BTreeMap<String, Arc<dyn RateGate>>>,
    /// (provider gate, tenant) → held until (ms), and when this instance last read it from a
    /// shared store.
    holds: Mutex<BTreeMap<(String, String), Known>>,
}

#[derive(Clone, Copy)]
struct Known {
    until_ms: i64,
    read_at: Option<Instant>,
}

/// How often an instance reads a tenant's hold on a provider from a shared store (another
/// instance's 429); its own 429s it knows at once.
pub const HOLD_READ_EVERY: Duration = Duration::from_millis(250);

impl TenantGates {
    pub fn new(config: GateConfig, store: GateStore) -> Self {
        Self { config, store, gates: Mutex::new(BTreeMap::new()), holds: Mutex::new(BTreeMap::new()) }
    }

    fn hold_key(provider: &str, tenant: &str) -> Key {
        Key::new(format!("RATE#hold#{provider}#{tenant}"), "HOLD")
    }

    /// The provider answered a send of `tenant` 429 with `Retry-After`: none of that tenant's
    /// sends to it pass before `now_ms + retry_after` (other tenants are not held).
    pub async fn hold(&self, provider: &str, tenant: &str, now_ms: i64, retry_after: Duration) {
        let until_ms = now_ms.saturating_add(i64::try_from(retry_after.as_millis()).unwrap_or(i64::MAX));
        {
            let mut holds = self.holds.lock().unwrap_or_else(|p| p.into_inner());
            let known =
                holds.entry((provider.to_owned(), tenant.to_owned())).or_insert(Known { until_ms, read_at: None });
            known.until_ms = known.until_ms.max(until_ms);
        }
        if let GateStore::Shared(table) = &self.store {
            let key = Self::hold_key(provider, tenant);
            let mut attrs = crate::ports::Attrs::new();
            attrs.insert("until_ms".into(), until_ms.into());
            attrs.insert("ttl".into(), (until_ms / 1000 + 3600).into());
            // The longest hold wins: a shorter one written later changes nothing.
            let cond = Cond::Or(vec![Cond::NotExists, Cond::lt("until_ms", until_ms)]);
            match table.put(Item::new(key, attrs), cond).await {
                Ok(()) | Err(StoreError::ConditionFailed { .. }) => {}
                Err(e) => tracing::warn!(error = %e, provider, tenant, "a provider's hold not shared"),
            }
        }
    }

    /// How long `tenant`'s sends to `provider` are still held (none: not held).
    pub async fn held(&self, provider: &str, tenant: &str, now_ms: i64) -> Option<Duration> {
        let id = (provider.to_owned(), tenant.to_owned());
        let known = self.holds.lock().unwrap_or_else(|p| p.into_inner()).get(&id).copied();
        let mut until_ms = known.map_or(0, |k| k.until_ms);
        if let GateStore::Shared(table) = &self.store
            && known.is_none_or(|k| k.read_at.is_none_or(|at| at.elapsed() >= HOLD_READ_EVERY))
        {
            match table.get(&Self::hold_key(provider, tenant)).await {
                Ok(item) => {
                    until_ms = until_ms.max(item.and_then(|i| i.i64("until_ms")).unwrap_or(0));
                    let mut holds = self.holds.lock().unwrap_or_else(|p| p.into_inner());
                    let k = holds.entry(id).or_insert(Known { until_ms, read_at: None });
                    k.until_ms = k.until_ms.max(until_ms);
                    k.read_at = Some(Instant::now());
                }
                Err(e) => tracing::warn!(error = %e, provider, tenant, "a provider's hold could not be read"),
            }
        }
        (until_ms > now_ms).then(|| Duration::from_millis(u64::try_from(until_ms - now_ms).unwrap_or(0)))
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
    /// The provider's gate name (`email`, `sms`, `sms-secondary`, `push`): what a hold names.
    name: String,
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
        Self { inner, channel, name: channel.as_str().to_owned(), provider_gate, tenants, max_wait, clock }
    }

    /// The same, under another gate name (the SMS failover provider's `sms-secondary`).
    pub fn named(mut self, name: &str) -> Self {
        self.name = name.to_owned();
        self
    }

    /// Waits out the tenant's hold on this provider (a `Retry-After`), if it ends within what is
    /// left of `max_wait`; else refuses.
    async fn wait_hold(&self, tenant: &str, waited: &mut Duration) -> Result<(), ProviderError> {
        while let Some(wait) = self.tenants.held(&self.name, tenant, self.clock.now_ms()).await {
            if *waited + wait > self.max_wait {
                return Err(ProviderError::Transient {
                    reason: format!("{GATE_REFUSAL} {}: held by the provider's Retry-After", self.name),
                    retry_after: Some(wait.max(Duration::from_millis(100))),
                });
            }
            metrics::histogram!(GATE_WAIT_MS, "gate" => "hold").record(wait.as_secs_f64() * 1000.0);
            tokio::time::sleep(wait).await;
            *waited += wait;
        }
        Ok(())
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
        {
            // Time here is the gates', not the provider's (`within`).
            let _at_gate = AtGate::enter();
            let mut waited = Duration::ZERO;
            self.wait_hold(&message.tenant, &mut waited).await?;
            if let Some(gate) = self.tenants.gate(&message.tenant, self.clock.now_ms()) {
                self.pass(gate.as_ref(), "tenant", &mut waited).await?;
            }
            if let Some(gate) = &self.provider_gate {
                self.pass(gate.as_ref(), self.channel.as_str(), &mut waited).await?;
            }
            // A 429 may have come while this send waited for its tokens.
            self.wait_hold(&message.tenant, &mut waited).await?;
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
        if let Err(ProviderError::Transient { retry_after: Some(retry_after), .. }) = &result
            && is_throttle_result(&result)
        {
            // The whole provider, for this tenant: no other send of it goes before then.
            self.tenants.hold(&self.name, &message.tenant, self.clock.now_ms(), *retry_after).await;
        }
        if let Some(gate) = &self.provider_gate {
            match &result {
                Ok(_) => gate.succeeded().await,
                // The shared bucket slows down (AIMD); the pause is the tenant's hold above,
                // so one tenant's 429 does not stop the others' sends.
                Err(e) if is_throttle(e) => gate.throttled(self.clock.now_ms(), None).await,
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
        Arc::new(Gated::new(inner, channel, gate, tenants.clone(), config.max_wait, clock.clone()).named(name))
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
