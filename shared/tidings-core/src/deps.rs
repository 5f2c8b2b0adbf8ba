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
    /// Lease of a marketing claim: after it, a delivery still `sending` is closed as `failed`
    /// (`outcome_unknown`), never sent again. Long enough for a whole batch of sends (at least
    /// 8 × (provider timeout + 2 s): a batch of 100 sends 16 at a time, each within the gate's
    /// wait and the provider timeout), so no live worker's claim is closed under it.
    pub marketing_lease: Duration,
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
    /// Back-in-stock tunables (`TIDINGS_RESTOCK_*`).
    pub restock: crate::restock::RestockConfig,
    /// Recipients per campaign page task (`TIDINGS_CAMPAIGN_PAGE_SIZE`, default 1,000).
    pub campaign_page_size: usize,
    /// Marketing sends per user, channel and day (`TIDINGS_FREQUENCY_CAP`, default 3).
    pub frequency_cap: u32,
    /// Per-tenant caps (`TIDINGS_FREQUENCY_CAPS="acme:5,globex:2"`).
    pub frequency_caps: std::collections::BTreeMap<String, u32>,
    /// The abuse guard: SMS countries and per-number limits, per-requester limits
    /// (see [`crate::notify::abuse`]).
    pub abuse: crate::notify::abuse::AbuseGuard,
    /// A PEM certificate trusted for every SNS message instead of the one at `SigningCertURL`
    /// (`TIDINGS_SNS_TRUSTED_CERT_PEM`, a PEM text or a path to one). Tests and emulators only.
    pub sns_trusted_cert_pem: Option<String>,
    /// The SNS topics whose messages the callbacks accept (`TIDINGS_SNS_TOPIC_ARNS`, comma
    /// separated; the template sets its own topics'). None: every SNS message is refused.
    pub sns_topic_arns: Vec<String>,
    /// How old a notification still `accepted` must be before the tick's sweep queues it again
    /// (`TIDINGS_RELAY_SWEEP_AFTER_S`; see [`crate::notify::sweep`]).
    pub relay_sweep_after: Duration,
}

impl Default for CoreConfig {
    fn default() -> Self {
        Self {
            retry_base: Duration::from_secs(10),
            retry_cap: Duration::from_secs(15 * 60),
            max_receives: 5,
            delivery_lease: Duration::from_secs(60),
            marketing_lease: Duration::from_secs(600),
            provider_timeout: Duration::from_secs(10),
            visibility: Duration::from_secs(60),
            signer: crate::signing::Signer::default(),
            public_url: "http://127.0.0.1:8080".into(),
            hold_times: crate::inventory::HoldTimes::default(),
            restock: crate::restock::RestockConfig::default(),
            campaign_page_size: 1000,
            frequency_cap: 3,
            frequency_caps: std::collections::BTreeMap::new(),
            abuse: crate::notify::abuse::AbuseGuard::default(),
            sns_trusted_cert_pem: None,
            sns_topic_arns: Vec::new(),
            relay_sweep_after: Duration::from_secs(300),
        }
    }
}

impl CoreConfig {
    /// Reads overrides from `TIDINGS_RETRY_BASE_MS`, `TIDINGS_RETRY_CAP_MS`,
    /// `TIDINGS_MAX_RECEIVES`, `TIDINGS_DELIVERY_LEASE_MS`, `TIDINGS_MARKETING_LEASE_MS`, `TIDINGS_PROVIDER_TIMEOUT_MS`,
    /// `TIDINGS_VISIBILITY_S`, `TIDINGS_SIGNING_KEYS` (`kid:secret,...`), `TIDINGS_PUBLIC_URL`,
    /// and the abuse guard's settings. A malformed guard setting is an error naming it: a
    /// process refuses to start rather than run unguarded.
    pub fn from_env() -> Result<Self, String> {
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
        if let Some(v) = ms("TIDINGS_MARKETING_LEASE_MS") {
            c.marketing_lease = Duration::from_millis(v);
        }
        if let Some(v) = ms("TIDINGS_PROVIDER_TIMEOUT_MS") {
            c.provider_timeout = Duration::from_millis(v);
        }
        if let Some(v) = ms("TIDINGS_VISIBILITY_S") {
            c.visibility = Duration::from_secs(v.max(1));
        }
        // A lease shorter than a provider call would let a second worker send while the first
        // is still waiting for the provider: a duplicate without any crash.
        c.delivery_lease = c.delivery_lease.max(c.provider_timeout + Duration::from_secs(1));
        c.marketing_lease = c.marketing_lease.max((c.provider_timeout + Duration::from_secs(2)) * 8);
        if let Ok(v) = std::env::var("TIDINGS_SIGNING_KEYS") {
            c.signer = crate::signing::Signer::parse(&v);
        }
        if let Ok(v) = std::env::var("TIDINGS_PUBLIC_URL") {
            c.public_url = v;
        }
        c.hold_times = crate::inventory::HoldTimes::from_env();
        c.restock = crate::restock::RestockConfig::from_env();
        if let Some(v) = ms("TIDINGS_RELAY_SWEEP_AFTER_S") {
            c.relay_sweep_after = Duration::from_secs(v);
        }
        if let Some(v) = ms("TIDINGS_CAMPAIGN_PAGE_SIZE") {
            c.campaign_page_size = v.clamp(1, 1000) as usize;
        }
        if let Some(v) = ms("TIDINGS_FREQUENCY_CAP") {
            c.frequency_cap = v.min(10_000) as u32;
        }
        if let Ok(spec) = std::env::var("TIDINGS_FREQUENCY_CAPS") {
            for pair in spec.split(',').filter(|p| !p.trim().is_empty()) {
                match pair.trim().split_once(':').and_then(|(t, n)| Some((t, n.trim().parse::<u32>().ok()?))) {
                    Some((tenant, n)) => {
                        c.frequency_caps.insert(tenant.trim().to_owned(), n.min(10_000));
                    }
                    None => tracing::warn!(entry = pair, "TIDINGS_FREQUENCY_CAPS: expected tenant:number; ignored"),
                }
            }
        }
        c.abuse = crate::notify::abuse::AbuseGuard::from_env()?;
        if let Ok(v) = std::env::var("TIDINGS_SNS_TRUSTED_CERT_PEM")
            && !v.trim().is_empty()
        {
            c.sns_trusted_cert_pem =
                if v.contains("-----BEGIN") { Some(v) } else { std::fs::read_to_string(v.trim()).ok() };
        }
        if let Ok(v) = std::env::var("TIDINGS_SNS_TOPIC_ARNS") {
            c.sns_topic_arns = v.split(',').map(str::trim).filter(|a| !a.is_empty()).map(str::to_owned).collect();
        }
        Ok(c)
    }

    /// The marketing frequency cap of a tenant.
    pub fn frequency_cap_of(&self, tenant: &str) -> u32 {
        self.frequency_caps.get(tenant).copied().unwrap_or(self.frequency_cap)
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

impl Deps {
    /// The one place `Deps` is assembled: by the wiring of each backend and by the tests' world
    /// alike. `config` is a `CoreConfig` or an `Arc` of one already shared.
    pub fn new(
        table: Arc<dyn Table>,
        queues: Arc<dyn Queues>,
        clock: Arc<dyn Clock>,
        providers: Providers,
        config: impl Into<Arc<CoreConfig>>,
    ) -> Self {
        Self { table, queues, clock, providers, config: config.into() }
    }
}
