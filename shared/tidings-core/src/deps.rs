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

/// Tunables of the core: parsed once from the `TIDINGS_*` variables an edge passes
/// ([`crate::config::Settings::core`], where each variable's default and meaning are).
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
    /// The rate gates and breakers around the providers (`TIDINGS_PROVIDER_RATES`,
    /// `TIDINGS_TENANT_RATES`, `TIDINGS_GATE_MAX_WAIT_MS`, `TIDINGS_BREAKER`).
    pub gates: crate::gates::GateConfig,
    /// The API's request rates (`TIDINGS_API_RATES`).
    pub api_rates: crate::gates::api::ApiRates,
    /// Webhook posting (`TIDINGS_WEBHOOK_*`).
    pub webhooks: crate::webhooks::WebhookConfig,
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
            gates: crate::gates::GateConfig { max_wait: Duration::from_millis(2000), ..Default::default() },
            api_rates: crate::gates::api::ApiRates::default(),
            webhooks: crate::webhooks::WebhookConfig::default(),
        }
    }
}

impl CoreConfig {
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
