//! What a use-case needs from the world, assembled once by the wiring (a Lambda `main` or the
//! local runtime).

use std::sync::Arc;
use std::time::Duration;

use crate::ports::{Channel, Clock, Provider, Queues, Table};

/// The channel providers.
#[derive(Clone)]
pub struct Providers {
    pub email: Arc<dyn Provider>,
    pub sms: Arc<dyn Provider>,
    pub push: Arc<dyn Provider>,
}

impl Providers {
    pub fn for_channel(&self, channel: Channel) -> Option<&Arc<dyn Provider>> {
        match channel {
            Channel::Email => Some(&self.email),
            Channel::Sms => Some(&self.sms),
            Channel::Push => Some(&self.push),
            Channel::Inapp => None,
        }
    }
}

/// Tunables of the core, read once from the environment by the wiring.
#[derive(Clone, Debug)]
pub struct CoreConfig {
    /// First retry delay; doubles per attempt, with jitter.
    pub retry_base: Duration,
    /// Longest retry delay.
    pub retry_cap: Duration,
    /// Receives before a message goes to its DLQ (the queues' redrive policy says the same).
    pub max_receives: u32,
    /// Lease of a transactional delivery while the provider is called.
    pub delivery_lease: Duration,
    /// Time a provider call may take before it counts as a timeout.
    pub provider_timeout: Duration,
    /// Visibility timeout the runtime uses when it receives.
    pub visibility: Duration,
    /// Keys for signed links and tokens (the first signs; all verify).
    pub signer: crate::signing::Signer,
    /// Public base URL for links in messages.
    pub public_url: String,
    /// How long unpaid orders hold stock, per category (`TIDINGS_HOLD_TIMES`).
    pub hold_times: crate::inventory::HoldTimes,
}

impl Default for CoreConfig {
    fn default() -> Self {
        Self {
            retry_base: Duration::from_secs(10),
            retry_cap: Duration::from_secs(15 * 60),
            max_receives: 5,
            delivery_lease: Duration::from_secs(60),
            provider_timeout: Duration::from_secs(10),
            visibility: Duration::from_secs(60),
            signer: crate::signing::Signer::default(),
            public_url: "http://127.0.0.1:8080".into(),
            hold_times: crate::inventory::HoldTimes::default(),
        }
    }
}

impl CoreConfig {
    /// Reads overrides from `TIDINGS_RETRY_BASE_MS`, `TIDINGS_RETRY_CAP_MS`,
    /// `TIDINGS_MAX_RECEIVES`, `TIDINGS_DELIVERY_LEASE_MS`, `TIDINGS_PROVIDER_TIMEOUT_MS`,
    /// `TIDINGS_VISIBILITY_S`, `TIDINGS_SIGNING_KEYS` (`kid:secret,...`), `TIDINGS_PUBLIC_URL`.
    pub fn from_env() -> Self {
        let mut c = Self::default();
        let ms = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
        if let Some(v) = ms("TIDINGS_RETRY_BASE_MS") {
            c.retry_base = Duration::from_millis(v);
        }
        if let Some(v) = ms("TIDINGS_RETRY_CAP_MS") {
            c.retry_cap = Duration::from_millis(v);
        }
        if let Some(v) = ms("TIDINGS_MAX_RECEIVES") {
            c.max_receives = v.clamp(1, 1000) as u32;
        }
        if let Some(v) = ms("TIDINGS_DELIVERY_LEASE_MS") {
            c.delivery_lease = Duration::from_millis(v);
        }
        if let Some(v) = ms("TIDINGS_PROVIDER_TIMEOUT_MS") {
            c.provider_timeout = Duration::from_millis(v);
        }
        if let Some(v) = ms("TIDINGS_VISIBILITY_S") {
            c.visibility = Duration::from_secs(v.max(1));
        }
        if let Ok(v) = std::env::var("TIDINGS_SIGNING_KEYS") {
            c.signer = crate::signing::Signer::parse(&v);
        }
        if let Ok(v) = std::env::var("TIDINGS_PUBLIC_URL") {
            c.public_url = v;
        }
        c.hold_times = crate::inventory::HoldTimes::from_env();
        c
    }
}

/// Everything the core uses.
#[derive(Clone)]
pub struct Deps {
    pub table: Arc<dyn Table>,
    pub queues: Arc<dyn Queues>,
    pub clock: Arc<dyn Clock>,
    pub providers: Providers,
    pub config: Arc<CoreConfig>,
}
