//! Every `TIDINGS_*` variable, in one table ([`VARIABLES`]): its name, the kind of value it
//! takes, its default and its meaning, and the typed values built from it ([`CoreConfig`],
//! [`GateConfig`], [`ApiRates`], ...).
//!
//! It lives in the core because every crate that starts a process (the Lambda functions through
//! `tidings-functions` and `tidings-aws`, the `tidings` CLI, the tests) already depends on the
//! core, so the one table is in reach of every edge without a crate of its own. The core still
//! reads no environment: an edge passes its variables once ([`Settings::from_vars`] with
//! `std::env::vars()`), and everything below it takes the parsed values. The table names the
//! AWS backend's and the local runtime's variables too, as text: a misspelt name is found only
//! against the whole list, and the configuration table of docs/configuration.md is this table printed
//! ([`markdown_table`]; a test compares the two).
//!
//! A malformed value is a [`ConfigError`] naming the variable, and the process refuses to start:
//! a typo in a limit must not leave a deployment unguarded or silently on its default. An empty
//! value counts as unset (a template parameter left empty). An unknown `TIDINGS_*` name is
//! named in a warning, with the closest known name ([`Settings::warn_unknown`]).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::gates::GateConfig;
use crate::gates::api::ApiRates;
use crate::ids::TenantId;
use crate::inventory::HoldTimes;
use crate::notify::abuse::AbuseGuard;
use crate::restock::RestockConfig;
use crate::signing::Signer;

/// Tunables of the core: parsed once from the `TIDINGS_*` variables an edge passes
/// ([`Settings::core`], where each variable's default and meaning are).
#[derive(Clone, Debug)]
pub struct CoreConfig {
    /// First retry delay; doubles per attempt, with jitter.
    pub retry_base: Duration,
    /// Longest retry delay.
    pub retry_cap: Duration,
    /// Receives before a message goes to its DLQ (the queues' redrive policy says the same).
    pub max_receives: u32,
    /// Ends of the process a redelivered message may be handled through, alone, before it is set
    /// aside (docs/delivery.md, "A message that ends the process").
    pub set_aside_after_crashes: u32,
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
    /// Whether an order's expiry message (`inventory::orders`) is sent after the order is
    /// answered instead of before. Only a process that outlives its requests may (`tidings
    /// serve`: its backends set it); a Lambda function is frozen once it answers. Either way the
    /// durable timer written with the order expires it if the message never goes.
    pub detached_expiry_messages: bool,
    /// Keys for signed links and tokens (the first signs; all verify).
    pub signer: Signer,
    /// Public base URL for links in messages.
    pub public_url: String,
    /// How long unpaid orders hold stock, per category (`TIDINGS_HOLD_TIMES`).
    pub hold_times: HoldTimes,
    /// Back-in-stock tunables (`TIDINGS_RESTOCK_*`).
    pub restock: RestockConfig,
    /// Recipients per campaign page task (`TIDINGS_CAMPAIGN_PAGE_SIZE`, default 1,000).
    pub campaign_page_size: usize,
    /// Marketing sends per user, channel and day (`TIDINGS_FREQUENCY_CAP`, default 3).
    pub frequency_cap: u32,
    /// Per-tenant caps (`TIDINGS_FREQUENCY_CAPS="acme:5,globex:2"`).
    pub frequency_caps: BTreeMap<String, u32>,
    /// The abuse guard: SMS countries and per-number limits, per-requester limits
    /// (see [`crate::notify::abuse`]).
    pub abuse: AbuseGuard,
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
    pub gates: GateConfig,
    /// The API's request rates (`TIDINGS_API_RATES`).
    pub api_rates: ApiRates,
    /// Webhook posting (`TIDINGS_WEBHOOK_*`).
    pub webhooks: WebhookConfig,
}

impl Default for CoreConfig {
    fn default() -> Self {
        Self {
            retry_base: Duration::from_secs(10),
            retry_cap: Duration::from_secs(15 * 60),
            max_receives: 5,
            set_aside_after_crashes: 1,
            delivery_lease: Duration::from_secs(60),
            marketing_lease: Duration::from_secs(600),
            provider_timeout: Duration::from_secs(10),
            visibility: Duration::from_secs(60),
            detached_expiry_messages: false,
            signer: Signer::default(),
            public_url: "http://127.0.0.1:8080".into(),
            hold_times: HoldTimes::default(),
            restock: RestockConfig::default(),
            campaign_page_size: 1000,
            frequency_cap: 3,
            frequency_caps: BTreeMap::new(),
            abuse: AbuseGuard::default(),
            sns_trusted_cert_pem: None,
            sns_topic_arns: Vec::new(),
            relay_sweep_after: Duration::from_secs(300),
            gates: GateConfig { max_wait: Duration::from_millis(2000), ..Default::default() },
            api_rates: ApiRates::default(),
            webhooks: WebhookConfig::default(),
        }
    }
}

impl CoreConfig {
    /// The marketing frequency cap of a tenant.
    pub fn frequency_cap_of(&self, tenant: &str) -> u32 {
        self.frequency_caps.get(tenant).copied().unwrap_or(self.frequency_cap)
    }
}

/// What the server allows as a webhook target ([`crate::webhooks::check_url`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UrlPolicy {
    /// `http://` and loopback, private and link-local addresses (dev and tests only).
    pub allow_private: bool,
}

/// Webhook posting (`TIDINGS_WEBHOOK_*`).
#[derive(Clone, Debug)]
pub struct WebhookConfig {
    /// `TIDINGS_WEBHOOK_ALLOW_PRIVATE=true`: see [`UrlPolicy`]. Never set by `template.yaml`.
    pub policy: UrlPolicy,
    /// How long a rotated-out secret still signs (`TIDINGS_WEBHOOK_ROTATION_GRACE_S`, default 24 h).
    pub rotation_grace: Duration,
    /// Connect and total timeouts of a post (5 s, 15 s).
    pub connect_timeout: Duration,
    pub timeout: Duration,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        Self {
            policy: UrlPolicy { allow_private: false },
            rotation_grace: Duration::from_secs(86_400),
            connect_timeout: Duration::from_secs(5),
            timeout: Duration::from_secs(15),
        }
    }
}

/// A variable with a value it cannot take.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{var}: {reason}")]
pub struct ConfigError {
    pub var: String,
    pub reason: String,
}

impl ConfigError {
    fn new(var: &str, reason: impl Into<String>) -> Self {
        Self { var: var.to_owned(), reason: reason.into() }
    }
}

/// What a variable's value may be; checked when the variables are read.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    /// Any text.
    Text,
    /// A whole number from `min` to `max`.
    Number { min: u64, max: u64 },
    /// `true`/`false` (`1`/`0`, `yes`/`no`).
    Flag,
    /// One of these words.
    OneOf(&'static [&'static str]),
    /// A list with a grammar of its own, checked by its parser.
    Spec(fn(&str) -> Result<(), String>),
}

/// Which part of the system reads a variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reader {
    /// The core, on both backends.
    Core,
    /// The AWS backend (Lambda functions, `tidings serve --backend aws`).
    Aws,
    /// The `tidings` CLI and its local runtime.
    Local,
    /// Tests and their harness only.
    Tests,
}

/// One `TIDINGS_*` variable.
#[derive(Clone, Copy, Debug)]
pub struct Variable {
    pub name: &'static str,
    pub kind: Kind,
    /// The value an unset variable has; empty: none.
    pub default: &'static str,
    pub meaning: &'static str,
    pub reader: Reader,
    /// Whether its value holds secrets, and which part of it may be shown.
    pub secret: Secret,
}

/// What of a variable's value may be shown (`tidings config`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Secret {
    /// All of it.
    No,
    /// Nothing but how many comma-separated entries it has.
    Whole,
    /// Of each `name:secret` entry, the name (a tenant, a key id).
    AfterName,
}

impl Variable {
    const fn secret(mut self, secret: Secret) -> Self {
        self.secret = secret;
        self
    }

    /// `value` as it may be shown: each secret replaced by `****`.
    pub fn shown(&self, value: &str) -> String {
        let hide = |entry: &str| match self.secret {
            Secret::No => entry.to_owned(),
            Secret::Whole => "****".to_owned(),
            Secret::AfterName => match entry.split_once(':') {
                Some((name, _)) => format!("{}:****", name.trim()),
                None => "****".to_owned(),
            },
        };
        match self.secret {
            Secret::No => value.to_owned(),
            _ => entries(value).map(hide).collect::<Vec<_>>().join(","),
        }
    }
}

const ANY: Kind = Kind::Number { min: 0, max: u64::MAX };
const POSITIVE: Kind = Kind::Number { min: 1, max: u64::MAX };

const fn var(name: &'static str, kind: Kind, default: &'static str, meaning: &'static str) -> Variable {
    Variable { name, kind, default, meaning, reader: Reader::Core, secret: Secret::No }
}

const fn aws(name: &'static str, kind: Kind, default: &'static str, meaning: &'static str) -> Variable {
    Variable { name, kind, default, meaning, reader: Reader::Aws, secret: Secret::No }
}

const fn local(name: &'static str, kind: Kind, default: &'static str, meaning: &'static str) -> Variable {
    Variable { name, kind, default, meaning, reader: Reader::Local, secret: Secret::No }
}

const fn test(name: &'static str, meaning: &'static str) -> Variable {
    Variable { name, kind: Kind::Text, default: "", meaning, reader: Reader::Tests, secret: Secret::No }
}

/// The explicit URL of a logical queue: `TIDINGS_QUEUE_URL_<NAME>` (upper case, `-` as `_`;
/// `..._DLQ` for its DLQ). The one family of names in [`VARIABLES`].
pub const QUEUE_URL_PREFIX: &str = "TIDINGS_QUEUE_URL_";

/// Every `TIDINGS_*` variable.
pub static VARIABLES: &[Variable] = &[
    // The core, on both backends.
    var("TIDINGS_RETRY_BASE_MS", ANY, "10000", "first retry delay; doubles per attempt, with jitter"),
    var("TIDINGS_RETRY_CAP_MS", ANY, "900000", "longest retry delay"),
    var(
        "TIDINGS_MAX_RECEIVES",
        Kind::Number { min: 1, max: 1000 },
        "5",
        "receives before the DLQ (the redrive policies say the same)",
    ),
    var(
        "TIDINGS_SET_ASIDE_AFTER_CRASHES",
        Kind::Number { min: 1, max: 1000 },
        "1",
        "a redelivered message whose handling ended the process this many times, alone, goes to its DLQ",
    ),
    var(
        "TIDINGS_RELAY_SWEEP_AFTER_S",
        ANY,
        "300",
        "age after which the tick queues again a notification still `accepted` (its stream record lost)",
    ),
    var(
        "TIDINGS_DELIVERY_LEASE_MS",
        ANY,
        "60000",
        "lease of a transactional send; never below the provider timeout + 1 s",
    ),
    var(
        "TIDINGS_MARKETING_LEASE_MS",
        ANY,
        "600000",
        "lease of a marketing claim, after which a delivery still `sending` is closed as `failed` \
         (`outcome_unknown`); never below 8 × (provider timeout + 2 s), the longest a batch of 100 can take",
    ),
    var("TIDINGS_VISIBILITY_S", ANY, "60", "visibility timeout of a received message"),
    var(
        "TIDINGS_PROVIDER_TIMEOUT_MS",
        ANY,
        "10000",
        "a provider call longer than this has an unknown outcome: a transactional send is tried again, a marketing one is closed as `failed` (`outcome_unknown`); the call alone counts, not the wait at Tidings' own rate gates",
    ),
    var(
        "TIDINGS_HOLD_TIMES",
        Kind::Spec(check_hold_times),
        "default=1800,promotion=900",
        "order hold seconds per category",
    ),
    var("TIDINGS_CAMPAIGN_PAGE_SIZE", ANY, "1000", "users per campaign page task (1 to 1000)"),
    var("TIDINGS_FREQUENCY_CAP", ANY, "3", "marketing sends per user, channel and day (in the user's zone)"),
    var("TIDINGS_FREQUENCY_CAPS", Kind::Spec(check_frequency_caps), "", "per-tenant frequency caps, `acme:5,globex:2`"),
    var(
        "TIDINGS_SMS_COUNTRIES",
        Kind::Spec(check_abuse::<0>),
        "",
        "where SMS may go: E.164 prefixes or ISO countries (derived from the number), `+86,US,CA`; \
         others are suppressed `country_not_allowed`. Unset: all",
    ),
    var(
        "TIDINGS_SMS_NUMBER_LIMITS",
        Kind::Spec(check_abuse::<1>),
        "",
        "transactional SMS per destination number and window (`s`, `m`, `h`, `d`), `5/1h,10/1d` \
         (the template's); beyond: `number_rate_limited`",
    ),
    var(
        "TIDINGS_REQUESTER_IP_LIMITS",
        Kind::Spec(check_abuse::<2>),
        "",
        "notifications accepted per `requester.ip` (IPv6 by /64) and window, `20/1h` (the template's); \
         beyond: 429 `rate_limited`",
    ),
    var(
        "TIDINGS_REQUESTER_DEVICE_LIMITS",
        Kind::Spec(check_abuse::<3>),
        "",
        "notifications accepted per `requester.device_id` and window, `10/1h` (the template's); \
         beyond: 429 `rate_limited`",
    ),
    var(
        "TIDINGS_SNS_TRUSTED_CERT_PEM",
        Kind::Text,
        "",
        "tests and emulators only: a PEM certificate (or a path to one) trusted for SNS callbacks \
         instead of the one at `SigningCertURL`",
    ),
    var(
        "TIDINGS_SNS_TOPIC_ARNS",
        Kind::Text,
        "",
        "comma separated: the only SNS topics `/v1/callbacks/*` believe (the template: its \
         `SesEventsTopic` and `PushEventsTopic`); any other topic's message is 403 `topic_not_allowed`. \
         Unset: every SNS message is refused",
    ),
    var(
        "TIDINGS_SIGNING_KEYS",
        Kind::Spec(check_signing_keys),
        "",
        "`kid:secret,kid:secret`: the first signs links and tokens, all verify (rotation). Local: \
         generated and kept in the data dir when unset",
    )
    .secret(Secret::AfterName),
    var(
        "TIDINGS_PUBLIC_URL",
        Kind::Text,
        "http://127.0.0.1:8080",
        "base of tracking, unsubscribe and console links; `tidings serve` without it: the address it \
         listens on",
    ),
    var(
        "TIDINGS_PROVIDER_RATES",
        Kind::Spec(check_rates),
        "",
        "sends per second per provider, `email:14,sms:20,push:500,sms-secondary:10` (`sms-secondary`: \
         the failover SMS provider); unset: unlimited",
    ),
    var("TIDINGS_TENANT_RATES", Kind::Spec(check_rates), "", "sends per second per tenant, `default:1000,acme:50`"),
    var("TIDINGS_GATE_MAX_WAIT_MS", ANY, "2000", "a send that would wait longer at a gate goes back to its queue"),
    var(
        "TIDINGS_BREAKER",
        Kind::Spec(check_breaker),
        "window_s=10,min_calls=20,error_ratio=0.5,open_s=30,probes=3",
        "circuit breaker per provider, or `off`",
    ),
    var(
        "TIDINGS_API_RATES",
        Kind::Spec(check_api_rates),
        "send:50,recipients:1000,orders:1500:3000,write:100,read:200,public:20,callback:100,auth:1:10",
        "API limits, units per second and (after a second `:`) the burst: per tenant by class (`recipients` \
         counts a notification's users, `orders` the order routes), per client address on the public \
         routes and for failed authentications (`auth`); `acme/send:200` overrides one tenant's, \
         `class:off` or `off` lifts limits (sizing: docs/gates.md)",
    ),
    var(
        "TIDINGS_WEBHOOK_ALLOW_PRIVATE",
        Kind::Flag,
        "false",
        "webhook endpoints may be special-purpose addresses (loopback, private, ...: tests and emulators)",
    ),
    var("TIDINGS_WEBHOOK_ROTATION_GRACE_S", ANY, "86400", "how long a rotated-out webhook secret still signs"),
    var("TIDINGS_RESTOCK_BATCH_SIZE", ANY, "100", "back-in-stock: subscriptions per batch (1 to 1000)"),
    var("TIDINGS_RESTOCK_BATCH_PAUSE_MS", ANY, "500", "back-in-stock: pause between batches"),
    var(
        "TIDINGS_RESTOCK_MERGE_WINDOW_MS",
        ANY,
        "60000",
        "back-in-stock: stock events of one SKU within it make one round",
    ),
    var("TIDINGS_RESTOCK_WAVE_FACTOR", ANY, "3", "back-in-stock: subscribers notified per unit in stock"),
    var("TIDINGS_RESTOCK_WAVE_INTERVAL_MS", ANY, "600000", "back-in-stock: time between waves"),
    var(
        "TIDINGS_RESTOCK_RETRY_DELAYS_MS",
        Kind::Spec(check_millis_list),
        "60000,300000,1800000",
        "back-in-stock: delays of the retries after a failed send; after the last, MANUAL",
    ),
    var(
        "TIDINGS_RESTOCK_MAX_AGE_S",
        ANY,
        "7776000",
        "back-in-stock: WAITING subscriptions older than this (90 days) expire in the scan",
    ),
    // The AWS backend.
    aws("TIDINGS_TABLE", Kind::Text, "tidings", "AWS: the DynamoDB table"),
    aws(
        "TIDINGS_QUEUE_PREFIX",
        Kind::Text,
        "tidings-",
        "AWS: logical queue `q` is `{prefix}q`, its DLQ `{prefix}q-dlq`",
    ),
    aws(
        "TIDINGS_QUEUE_URL_<NAME>",
        Kind::Text,
        "",
        "AWS: explicit URL of logical queue `<name>` (upper case, `-` as `_`; `..._DLQ` for its DLQ)",
    ),
    aws("TIDINGS_EMAIL_FROM", Kind::Text, "no-reply@tidings.local", "SES sender"),
    aws(
        "TIDINGS_SES_CONFIGURATION_SET",
        Kind::Text,
        "",
        "AWS: the SES configuration set every `SendEmail` names, so SES publishes the mail's events \
         (the template: `SesConfigurationSet`)",
    ),
    aws(
        "TIDINGS_REDRIVE_MODE",
        Kind::OneOf(&["message-move-task", "receive-and-resend"]),
        "message-move-task",
        "AWS: `StartMessageMoveTask`, or `receive-and-resend` for emulators without it (moto)",
    ),
    aws(
        "TIDINGS_SNS_APNS_ARN",
        Kind::Text,
        "",
        "AWS: the SNS platform application iOS device tokens become endpoints of (APNs)",
    ),
    aws(
        "TIDINGS_SNS_FCM_ARN",
        Kind::Text,
        "",
        "AWS: the SNS platform application Android device tokens become endpoints of (FCM)",
    ),
    aws(
        "TIDINGS_SMS_PRIMARY",
        Kind::OneOf(&["sns", "end-user-messaging"]),
        "sns",
        "AWS: the SMS provider, `sns` or `end-user-messaging`",
    ),
    aws(
        "TIDINGS_SMS_SECONDARY",
        Kind::OneOf(&["sns", "end-user-messaging", "none", "fake"]),
        "",
        "the SMS provider to fail over to while the primary's breaker is open (AWS: the other one, \
         or `none`; the template: `end-user-messaging`); embedded: `fake`",
    ),
    aws(
        "TIDINGS_SMS_ORIGINATION_IDENTITY",
        Kind::Text,
        "",
        "AWS End User Messaging: the origination identity (phone number, sender ID or pool)",
    ),
    aws(
        "TIDINGS_SMS_CONFIGURATION_SET",
        Kind::Text,
        "",
        "AWS End User Messaging: the configuration set every `SendTextMessage` names",
    ),
    aws(
        "TIDINGS_SIGNING_KEY_PARAM",
        Kind::Text,
        "",
        "AWS: the SSM SecureString holding the signing keys, when `TIDINGS_SIGNING_KEYS` is unset",
    ),
    aws(
        "TIDINGS_WS_ENDPOINT",
        Kind::Text,
        "",
        "AWS: the WebSocket API's management endpoint, for live pushes; unset: none",
    ),
    // The `tidings` CLI and its local runtime.
    local(
        "TIDINGS_BACKEND",
        Kind::OneOf(&["embedded", "aws"]),
        "embedded",
        "`--backend`: or `aws` (build with `--features aws`)",
    ),
    local("TIDINGS_DATA_DIR", Kind::Text, ".tidings", "`--data-dir`: the embedded backend's SQLite file"),
    local("TIDINGS_ADDR", Kind::Text, "127.0.0.1:8080", "`--addr` of `tidings serve`"),
    local(
        "TIDINGS_API_KEYS",
        Kind::Spec(check_api_keys),
        "",
        "`tenant_a:key_a,tenant_b:key_b`, stored only as SHA-256 hashes; each key at least 16 \
         characters and one tenant's only; unset on the embedded backend: tenant `demo` with a \
         generated key",
    )
    .secret(Secret::AfterName),
    local(
        "TIDINGS_OPERATOR_KEYS",
        Kind::Spec(check_operator_keys),
        "",
        "operator keys, comma separated, each at least 16 characters and no tenant's",
    )
    .secret(Secret::Whole),
    local("TIDINGS_WORKERS_HIGH", POSITIVE, "2", "local runtime: workers per high-priority queue (1 to 256)"),
    local("TIDINGS_WORKERS_LOW", POSITIVE, "2", "local runtime: workers per other queue (1 to 256)"),
    local("TIDINGS_HIGH_THREADS", POSITIVE, "2", "local runtime: the high-priority pool's own threads (1 to 256)"),
    local(
        "TIDINGS_BATCH_LOW",
        POSITIVE,
        "100",
        "local runtime: batch size on the low-priority channel queues (the event source mappings' \
         `BatchSize` in `template.yaml`); other queues take 10",
    ),
    local("TIDINGS_LOG", Kind::Text, "info", "log filter (`tracing` directives)"),
    local(
        "TIDINGS_LOG_FORMAT",
        Kind::OneOf(&["text", "json"]),
        "text",
        "`json` for JSON lines (always JSON in Lambda)",
    ),
    local(
        "TIDINGS_BENCH_PEERS",
        Kind::Text,
        "",
        "`--peer-dir` of `tidings bench`: the peer scripts it runs beside its own figure (unset: \
         `../shared/bench` beside the repository, when there)",
    ),
    // Tests and their harness.
    test("TIDINGS_CRASH_AT", "tests: abort at a named crash point, `name[:n]` (a `crash-points` build only)"),
    test("TIDINGS_BIN", "tests: the `tidings` binary the end-to-end tests start"),
    // What `tidings serve` prints to paste into a shell: read by the README's quickstart and
    // snippets and the generated clients' tests, never by the server.
    test(
        "TIDINGS_URL",
        "clients: the base URL `tidings serve` prints to paste (the README's quickstart and snippets use it)",
    ),
    test("TIDINGS_API_KEY", "clients: the `demo` tenant's key `tidings serve` prints to paste").secret(Secret::Whole),
    test("TIDINGS_OPERATOR_KEY", "clients: the operator key `tidings serve` prints to paste").secret(Secret::Whole),
    test("TIDINGS_LAMBDA_BINARIES", "tests: `native` runs target/debug/<function> instead of `sam build`'s"),
    test("TIDINGS_LAMBDA_TIME_SCALE", "tests: how much slower the Lambda binaries run (4 under emulation)"),
    test("TIDINGS_TEST_PYTHON", "tests: the Python of infra/.venv"),
    test("TIDINGS_E2E_CAMPAIGN_MEMBERS", "tests: members of the shipped campaign test (200)"),
    test("TIDINGS_KILL_TEST_DB", "tests: the database a kill test's child process writes"),
];

/// The variable called `name`, if there is one (a `TIDINGS_QUEUE_URL_*` name is the family's).
pub fn variable(name: &str) -> Option<&'static Variable> {
    if name.starts_with(QUEUE_URL_PREFIX) && name.len() > QUEUE_URL_PREFIX.len() {
        return VARIABLES.iter().find(|v| v.name.starts_with(QUEUE_URL_PREFIX));
    }
    VARIABLES.iter().find(|v| v.name == name)
}

/// The known name closest to a misspelt one, if one is close enough to be meant.
pub fn closest(name: &str) -> Option<&'static str> {
    VARIABLES
        .iter()
        .map(|v| (strsim::damerau_levenshtein(name, v.name), v.name))
        .filter(|(d, _)| *d <= 3)
        .min_by_key(|(d, _)| *d)
        .map(|(_, n)| n)
}

/// A process's `TIDINGS_*` variables, each known one checked against its [`Kind`].
#[derive(Clone, Debug, Default)]
pub struct Settings {
    values: BTreeMap<String, String>,
    unknown: Vec<String>,
}

impl Settings {
    /// Keeps the `TIDINGS_*` variables of `vars` (an edge passes `std::env::vars()`); a known
    /// variable with a value of the wrong kind is an error naming it.
    pub fn from_vars<I, K, V>(vars: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut settings = Settings::default();
        for (k, v) in vars {
            let (name, value) = (k.as_ref(), v.as_ref());
            if !name.starts_with("TIDINGS_") {
                continue;
            }
            match variable(name) {
                Some(known) if !value.trim().is_empty() => check(known, name, value)?,
                Some(_) => {}
                None => settings.unknown.push(name.to_owned()),
            }
            settings.values.insert(name.to_owned(), value.to_owned());
        }
        settings.unknown.sort();
        Ok(settings)
    }

    /// The `TIDINGS_*` names no part of the system reads, each with the known name it is
    /// closest to.
    pub fn unknown(&self) -> impl Iterator<Item = (&str, Option<&'static str>)> {
        self.unknown.iter().map(|n| (n.as_str(), closest(n)))
    }

    /// Names every unknown variable in a warning (a misspelling would otherwise leave its
    /// setting on the default without a word).
    pub fn warn_unknown(&self) {
        for (name, closest) in self.unknown() {
            match closest {
                Some(meant) => tracing::warn!(
                    variable = name,
                    did_you_mean = meant,
                    "unknown variable {name}: did you mean {meant}?"
                ),
                None => tracing::warn!(variable = name, "unknown variable {name}: nothing reads it"),
            }
        }
    }

    /// Settings each valid alone that work against each other where this process runs the
    /// queues itself (`tidings serve`; on Lambda the function's timeout bounds a batch, not the
    /// visibility): a provider timeout not below the visibility lets a batch start no more than
    /// its first sends (each must end before the batch's messages show again) and hands the rest
    /// back to the queue, so a campaign crawls.
    pub fn local_doubts(&self) -> Vec<String> {
        // The two settings alone: `core()` would also parse the signing keys.
        let (provider_timeout, visibility) = (self.provider_timeout(), self.visibility());
        let mut doubts = Vec::new();
        if provider_timeout >= visibility {
            doubts.push(format!(
                "TIDINGS_PROVIDER_TIMEOUT_MS ({} ms) is not below TIDINGS_VISIBILITY_S ({} s): a batch \
                 starts only its first sends and hands the rest back to their queue; raise the visibility \
                 above the timeout",
                provider_timeout.as_millis(),
                visibility.as_secs()
            ));
        }
        doubts
    }

    /// The value `name` is set to, untrimmed, even when empty.
    pub fn raw(&self, name: &str) -> Option<&str> {
        debug_assert!(variable(name).is_some(), "{name} is not in config::VARIABLES");
        self.values.get(name).map(String::as_str)
    }

    /// The value `name` is set to; an empty value is unset.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.raw(name).map(str::trim).filter(|v| !v.is_empty())
    }

    /// The value of `name`, else its default.
    pub fn value(&self, name: &str) -> &str {
        self.get(name).unwrap_or_else(|| variable(name).map_or("", |v| v.default))
    }

    /// A [`Kind::Number`] variable's value, else its default (0 when it has none).
    pub fn number(&self, name: &str) -> u64 {
        self.value(name).parse().unwrap_or(0)
    }

    /// A [`Kind::Number`] variable's value, if it is set.
    pub fn number_if_set(&self, name: &str) -> Option<u64> {
        self.get(name).and_then(|v| v.parse().ok())
    }

    /// A [`Kind::Flag`] variable's value.
    pub fn flag(&self, name: &str) -> bool {
        flag(self.value(name)) == Some(true)
    }

    /// The `TIDINGS_QUEUE_URL_<NAME>` variables that are set: `(<NAME>, url)`.
    pub fn queue_urls(&self) -> impl Iterator<Item = (&str, &str)> {
        self.values
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix(QUEUE_URL_PREFIX)?, v.as_str())))
            .filter(|(name, url)| !name.is_empty() && !url.is_empty())
    }

    /// The keys a local run's environment gives ([`env_keys`]: both variables checked together).
    pub fn env_keys(&self) -> Result<Vec<EnvKey>, ConfigError> {
        env_keys(self.get("TIDINGS_API_KEYS"), self.get("TIDINGS_OPERATOR_KEYS"))
    }

    /// Every variable as it stands in this process (`tidings config`): its value, secrets
    /// masked ([`Variable::shown`]), and where the value comes from. Every variable of the table
    /// but the tests' (those only when set), each `TIDINGS_QUEUE_URL_<NAME>` that is set, and a
    /// note where the value in effect is not the one given (a lease raised to its floor).
    pub fn in_effect(&self) -> Vec<InEffect> {
        let mut shown = Vec::new();
        for v in VARIABLES {
            if v.name.starts_with(QUEUE_URL_PREFIX) {
                for (name, url) in self.queue_urls() {
                    shown.push(InEffect::of(v, &format!("{QUEUE_URL_PREFIX}{name}"), Some(url), Source::Environment));
                }
                continue;
            }
            let (value, source) = match self.get(v.name) {
                Some(value) => (Some(value), Source::Environment),
                None if v.reader == Reader::Tests => continue,
                None if !v.default.is_empty() => (Some(v.default), Source::Default),
                None => (None, Source::Unset),
            };
            shown.push(InEffect::of(v, v.name, value, source));
        }
        let core = self.core();
        let millis = |d: Duration| d.as_millis().to_string();
        for (name, in_effect, why) in [
            ("TIDINGS_DELIVERY_LEASE_MS", millis(core.delivery_lease), "never below the provider timeout + 1 s"),
            ("TIDINGS_MARKETING_LEASE_MS", millis(core.marketing_lease), "never below 8 × (provider timeout + 2 s)"),
            ("TIDINGS_CAMPAIGN_PAGE_SIZE", core.campaign_page_size.to_string(), "1 to 1000"),
            ("TIDINGS_RESTOCK_BATCH_SIZE", core.restock.batch_size.to_string(), "1 to 1000"),
            ("TIDINGS_FREQUENCY_CAP", core.frequency_cap.to_string(), "at most 10000"),
        ] {
            if let Some(e) = shown.iter_mut().find(|e| e.name == name)
                && e.value.as_deref() != Some(in_effect.as_str())
            {
                e.note = Some(format!("{in_effect} in effect ({why})"));
            }
        }
        shown
    }

    /// How long a provider call may take (`TIDINGS_PROVIDER_TIMEOUT_MS`).
    fn provider_timeout(&self) -> Duration {
        Duration::from_millis(self.number("TIDINGS_PROVIDER_TIMEOUT_MS"))
    }

    /// A received message's visibility timeout (`TIDINGS_VISIBILITY_S`), at least a second.
    fn visibility(&self) -> Duration {
        Duration::from_secs(self.number("TIDINGS_VISIBILITY_S").max(1))
    }

    /// The core's configuration.
    pub fn core(&self) -> CoreConfig {
        let ms = |name| Duration::from_millis(self.number(name));
        let mut c = CoreConfig {
            retry_base: ms("TIDINGS_RETRY_BASE_MS"),
            retry_cap: ms("TIDINGS_RETRY_CAP_MS"),
            max_receives: self.number("TIDINGS_MAX_RECEIVES") as u32,
            set_aside_after_crashes: self.number("TIDINGS_SET_ASIDE_AFTER_CRASHES") as u32,
            delivery_lease: ms("TIDINGS_DELIVERY_LEASE_MS"),
            marketing_lease: ms("TIDINGS_MARKETING_LEASE_MS"),
            provider_timeout: self.provider_timeout(),
            visibility: self.visibility(),
            // Set by the process, not by a setting (see the field).
            detached_expiry_messages: false,
            signer: self.get("TIDINGS_SIGNING_KEYS").map(Signer::parse).unwrap_or_default(),
            public_url: self.value("TIDINGS_PUBLIC_URL").to_owned(),
            hold_times: HoldTimes::parse(self.value("TIDINGS_HOLD_TIMES")).unwrap_or_default(),
            restock: self.restock(),
            campaign_page_size: self.number("TIDINGS_CAMPAIGN_PAGE_SIZE").clamp(1, 1000) as usize,
            frequency_cap: self.number("TIDINGS_FREQUENCY_CAP").min(10_000) as u32,
            frequency_caps: frequency_caps(self.value("TIDINGS_FREQUENCY_CAPS")).unwrap_or_default(),
            abuse: AbuseGuard::from_settings(|name| self.get(name).map(str::to_owned)).unwrap_or_default(),
            sns_trusted_cert_pem: self.get("TIDINGS_SNS_TRUSTED_CERT_PEM").and_then(|v| {
                if v.contains("-----BEGIN") { Some(v.to_owned()) } else { std::fs::read_to_string(v).ok() }
            }),
            sns_topic_arns: self
                .value("TIDINGS_SNS_TOPIC_ARNS")
                .split(',')
                .map(str::trim)
                .filter(|a| !a.is_empty())
                .map(str::to_owned)
                .collect(),
            relay_sweep_after: Duration::from_secs(self.number("TIDINGS_RELAY_SWEEP_AFTER_S")),
            gates: self.gates(),
            api_rates: ApiRates::parse(self.value("TIDINGS_API_RATES")).unwrap_or_default(),
            webhooks: self.webhooks(),
        };
        // A lease shorter than a provider call would let a second worker send while the first
        // is still waiting for the provider: a duplicate without any crash.
        c.delivery_lease = c.delivery_lease.max(c.provider_timeout + Duration::from_secs(1));
        c.marketing_lease = c.marketing_lease.max((c.provider_timeout + Duration::from_secs(2)) * 8);
        c
    }

    /// The rate gates' and breakers' configuration.
    pub fn gates(&self) -> GateConfig {
        let mut tenant_rates = rates(self.value("TIDINGS_TENANT_RATES")).unwrap_or_default();
        GateConfig {
            provider_rates: rates(self.value("TIDINGS_PROVIDER_RATES")).unwrap_or_default(),
            default_tenant_rate: tenant_rates.remove("default"),
            tenant_rates,
            max_wait: Duration::from_millis(self.number("TIDINGS_GATE_MAX_WAIT_MS")),
            breaker: breaker(self.value("TIDINGS_BREAKER")).unwrap_or_default(),
        }
    }

    fn restock(&self) -> RestockConfig {
        let ms = |name| Duration::from_millis(self.number(name));
        RestockConfig {
            batch_size: (self.number("TIDINGS_RESTOCK_BATCH_SIZE") as usize).clamp(1, 1000),
            batch_pause: ms("TIDINGS_RESTOCK_BATCH_PAUSE_MS"),
            merge_window: ms("TIDINGS_RESTOCK_MERGE_WINDOW_MS"),
            wave_factor: i64::try_from(self.number("TIDINGS_RESTOCK_WAVE_FACTOR")).unwrap_or(3),
            wave_interval: ms("TIDINGS_RESTOCK_WAVE_INTERVAL_MS"),
            retry_delays: millis_list(self.value("TIDINGS_RESTOCK_RETRY_DELAYS_MS")).unwrap_or_default(),
            max_age: Duration::from_secs(self.number("TIDINGS_RESTOCK_MAX_AGE_S")),
        }
    }

    fn webhooks(&self) -> WebhookConfig {
        WebhookConfig {
            policy: UrlPolicy { allow_private: self.flag("TIDINGS_WEBHOOK_ALLOW_PRIVATE") },
            rotation_grace: Duration::from_secs(self.number("TIDINGS_WEBHOOK_ROTATION_GRACE_S")),
            ..WebhookConfig::default()
        }
    }
}

/// Where a variable's value comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The table's default: the variable is unset (or empty).
    Default,
    /// The process's environment.
    Environment,
    /// A command-line flag (`--data-dir`, `--backend`): the `tidings` command says so.
    Flag,
    /// Unset, and what stands for it was made and kept in the data directory (the local signing
    /// key, the local demo and operator keys): the `tidings` command says so.
    DataDirectory,
    /// Unset, without a default.
    Unset,
}

/// A variable as it stands in a process ([`Settings::in_effect`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct InEffect {
    pub name: String,
    /// The value, secrets masked; none when unset without a default.
    pub value: Option<String>,
    pub source: Source,
    /// Whether the value was masked.
    pub secret: bool,
    pub reader: Reader,
    pub meaning: &'static str,
    /// What else is to be known of the value: the value in effect where the one given is
    /// raised or capped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl InEffect {
    fn of(v: &Variable, name: &str, value: Option<&str>, source: Source) -> Self {
        Self {
            name: name.to_owned(),
            value: value.map(|value| v.shown(value)),
            source,
            secret: v.secret != Secret::No,
            reader: v.reader,
            meaning: v.meaning,
            note: None,
        }
    }
}

fn check(known: &Variable, name: &str, value: &str) -> Result<(), ConfigError> {
    let v = value.trim();
    let problem = match known.kind {
        Kind::Text => None,
        Kind::Number { min, max } => match v.parse::<u64>() {
            Ok(n) if (min..=max).contains(&n) => None,
            _ if max == u64::MAX => Some(format!("{value:?} is not a whole number of at least {min}")),
            _ => Some(format!("{value:?} is not a whole number from {min} to {max}")),
        },
        Kind::Flag => flag(v).is_none().then(|| format!("{value:?} is neither true nor false")),
        Kind::OneOf(words) => (!words.contains(&v)).then(|| format!("{value:?} is not one of {}", words.join(", "))),
        Kind::Spec(parse) => parse(v).err(),
    };
    match problem {
        // A parser that names the variable itself is not made to say it twice.
        Some(reason) => {
            let reason = reason.strip_prefix(&format!("{name}: ")).map_or(reason.clone(), str::to_owned);
            Err(ConfigError::new(name, reason))
        }
        None => Ok(()),
    }
}

fn flag(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" => Some(true),
        "0" | "false" | "no" | "" => Some(false),
        _ => None,
    }
}

fn check_hold_times(v: &str) -> Result<(), String> {
    HoldTimes::parse(v).map(drop).map_err(|e| e.to_string())
}

fn check_api_rates(v: &str) -> Result<(), String> {
    ApiRates::parse(v).map(drop)
}

fn check_api_keys(v: &str) -> Result<(), String> {
    env_keys(Some(v), None).map(drop).map_err(|e| e.reason)
}

fn check_operator_keys(v: &str) -> Result<(), String> {
    env_keys(None, Some(v)).map(drop).map_err(|e| e.reason)
}

fn check_abuse<const I: usize>(v: &str) -> Result<(), String> {
    let name = crate::notify::abuse::SETTINGS[I];
    AbuseGuard::from_settings(|n| (n == name).then(|| v.to_owned())).map(drop)
}

fn check_frequency_caps(v: &str) -> Result<(), String> {
    frequency_caps(v).map(drop)
}

fn check_rates(v: &str) -> Result<(), String> {
    rates(v).map(drop)
}

fn check_breaker(v: &str) -> Result<(), String> {
    breaker(v).map(drop)
}

fn check_millis_list(v: &str) -> Result<(), String> {
    millis_list(v).map(drop)
}

fn check_signing_keys(v: &str) -> Result<(), String> {
    match v
        .split(',')
        .map(str::trim)
        .find(|p| !p.split_once(':').is_some_and(|(k, s)| !k.trim().is_empty() && !s.trim().is_empty()))
    {
        Some(entry) => Err(format!("{entry:?} is not kid:secret")),
        None => Ok(()),
    }
}

fn entries(spec: &str) -> impl Iterator<Item = &str> {
    spec.split(',').map(str::trim).filter(|p| !p.is_empty())
}

/// `acme:5,globex:2`: marketing sends per user, channel and day, per tenant.
fn frequency_caps(spec: &str) -> Result<BTreeMap<String, u32>, String> {
    entries(spec)
        .map(|pair| {
            let (tenant, n) = pair.split_once(':').ok_or_else(|| format!("{pair:?} is not tenant:number"))?;
            let n: u32 = n.trim().parse().map_err(|_| format!("{pair:?}: {n:?} is not a whole number"))?;
            Ok((tenant.trim().to_owned(), n.min(10_000)))
        })
        .collect()
}

/// `email:14,sms:20`: a rate per second by name, each above 0.
fn rates(spec: &str) -> Result<BTreeMap<String, f64>, String> {
    entries(spec)
        .map(|pair| {
            let (name, rate) = pair.split_once(':').ok_or_else(|| format!("{pair:?} is not name:rate"))?;
            match rate.trim().parse::<f64>() {
                Ok(r) if r > 0.0 && r.is_finite() => Ok((name.trim().to_owned(), r)),
                _ => Err(format!("{pair:?}: the rate must be a number above 0")),
            }
        })
        .collect()
}

/// `window_s=10,min_calls=20,error_ratio=0.5,open_s=30,probes=3`, or `off`.
fn breaker(spec: &str) -> Result<crate::gates::breaker::BreakerConfig, String> {
    let mut b = crate::gates::breaker::BreakerConfig::default();
    if spec.trim() == "off" {
        b.min_calls = u32::MAX;
        return Ok(b);
    }
    for pair in entries(spec) {
        let bad = || format!("{pair:?} is not key=number (window_s, min_calls, error_ratio, open_s, probes)");
        let (k, val) = pair.split_once('=').ok_or_else(bad)?;
        let n = val.trim().parse::<f64>().ok().filter(|n| n.is_finite() && *n >= 0.0).ok_or_else(bad)?;
        match k.trim() {
            "window_s" => b.window = Duration::from_secs_f64(n.max(0.1)),
            "min_calls" => b.min_calls = n.max(1.0) as u32,
            "error_ratio" => b.error_ratio = n.clamp(0.01, 1.0),
            "open_s" => b.open_for = Duration::from_secs_f64(n.max(0.1)),
            "probes" => b.probes = n.max(1.0) as u32,
            _ => return Err(bad()),
        }
    }
    Ok(b)
}

/// `1000,5000`: delays in milliseconds, at least one.
fn millis_list(spec: &str) -> Result<Vec<Duration>, String> {
    let delays = entries(spec)
        .map(|p| p.parse::<u64>().map(Duration::from_millis).map_err(|_| format!("{p:?} is not milliseconds")))
        .collect::<Result<Vec<_>, _>>()?;
    if delays.is_empty() {
        return Err("no delay given".into());
    }
    Ok(delays)
}

/// The fewest characters a key given in the environment may have: a short key is guessed (the
/// per-address limit on failed authentications slows guessing, it does not make a short key
/// long; docs/operators.md, "Keys").
pub const MIN_ENV_KEY_CHARS: usize = 16;

/// A key given in the environment of a local run: a tenant's (`TIDINGS_API_KEYS`) or, without
/// a tenant, an operator's (`TIDINGS_OPERATOR_KEYS`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvKey {
    pub tenant: Option<TenantId>,
    pub key: String,
}

/// The keys of `TIDINGS_API_KEYS` (`tenant_a:key_a,tenant_b:key_b`) and `TIDINGS_OPERATOR_KEYS`
/// (`key_1,key_2`), checked together: each at least [`MIN_ENV_KEY_CHARS`] long, and none given to
/// two tenants, or to a tenant and an operator (a request's key is all that says whose it is, so
/// one of them would silently be the other). A key given twice to the same holder counts once.
/// The messages name the holder and the entry, never the key.
pub fn env_keys(tenants: Option<&str>, operators: Option<&str>) -> Result<Vec<EnvKey>, ConfigError> {
    const TENANTS: &str = "TIDINGS_API_KEYS";
    const OPERATORS: &str = "TIDINGS_OPERATOR_KEYS";
    let holder = |k: &EnvKey| match &k.tenant {
        Some(t) => format!("tenant {t}"),
        None => "an operator".to_owned(),
    };
    let mut given: Vec<EnvKey> = Vec::new();
    let listed = tenants.into_iter().flat_map(entries).map(|e| (TENANTS, e));
    let listed = listed.chain(operators.into_iter().flat_map(entries).map(|e| (OPERATORS, e)));
    for (n, (var, entry)) in listed.enumerate() {
        let place = format!("entry {}", n + 1);
        let k = if var == TENANTS {
            let (tenant, key) =
                entry.split_once(':').ok_or_else(|| ConfigError::new(var, format!("{place} is not tenant:key")))?;
            let tenant = TenantId::parse(tenant.trim())
                .map_err(|e| ConfigError::new(var, format!("{place}: the tenant: {e}")))?;
            EnvKey { tenant: Some(tenant), key: key.trim().to_owned() }
        } else {
            EnvKey { tenant: None, key: entry.to_owned() }
        };
        let chars = k.key.chars().count();
        if chars < MIN_ENV_KEY_CHARS {
            return Err(ConfigError::new(
                var,
                format!(
                    "{place}: the key of {} has {chars} characters, fewer than {MIN_ENV_KEY_CHARS}: give a longer \
                     random one (`openssl rand -hex 16`), or leave the variable unset for a generated key",
                    holder(&k)
                ),
            ));
        }
        if let Some(same) = given.iter().find(|g| g.key == k.key) {
            if same.tenant == k.tenant {
                continue;
            }
            let names = if var == TENANTS { TENANTS.to_owned() } else { format!("{TENANTS} and {OPERATORS}") };
            return Err(ConfigError::new(
                &names,
                format!(
                    "{place}: {} is given the key of {}: give each its own (a request's key is all that says \
                     whose it is)",
                    holder(&k),
                    holder(same)
                ),
            ));
        }
        given.push(k);
    }
    Ok(given)
}

/// The configuration table (docs/configuration.md): one row per variable of [`VARIABLES`].
pub fn markdown_table() -> String {
    let mut out = String::from("| variable | default | meaning |\n|---|---|---|\n");
    for v in VARIABLES {
        let default = if v.default.is_empty() { "none".to_owned() } else { format!("`{}`", v.default) };
        out.push_str(&format!("| `{}` | {default} | {} |\n", v.name, v.meaning));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        Settings::from_vars(pairs.iter().copied())
    }

    #[test]
    fn a_provider_timeout_beyond_the_visibility_is_doubted() {
        assert!(settings(&[]).unwrap().local_doubts().is_empty(), "the defaults agree");
        let fine = settings(&[("TIDINGS_PROVIDER_TIMEOUT_MS", "20000"), ("TIDINGS_VISIBILITY_S", "30")]).unwrap();
        assert!(fine.local_doubts().is_empty());
        let doubts = settings(&[("TIDINGS_PROVIDER_TIMEOUT_MS", "20000"), ("TIDINGS_VISIBILITY_S", "8")])
            .unwrap()
            .local_doubts();
        assert_eq!(doubts.len(), 1, "{doubts:?}");
        assert!(
            doubts[0].contains("TIDINGS_PROVIDER_TIMEOUT_MS (20000 ms)") && doubts[0].contains("(8 s)"),
            "{doubts:?}"
        );
    }

    #[test]
    fn a_malformed_number_stops_the_start_naming_the_variable() {
        let e = settings(&[("TIDINGS_MAX_RECEIVES", "five")]).unwrap_err();
        assert_eq!(e.var, "TIDINGS_MAX_RECEIVES");
        assert!(e.to_string().starts_with("TIDINGS_MAX_RECEIVES: \"five\""), "{e}");
        for (name, bad) in [
            ("TIDINGS_MAX_RECEIVES", "0"),
            ("TIDINGS_MAX_RECEIVES", "1001"),
            ("TIDINGS_RETRY_BASE_MS", "10s"),
            ("TIDINGS_VISIBILITY_S", "-1"),
            ("TIDINGS_WORKERS_LOW", "0"),
            ("TIDINGS_WEBHOOK_ALLOW_PRIVATE", "maybe"),
            ("TIDINGS_REDRIVE_MODE", "sideways"),
            ("TIDINGS_LOG_FORMAT", "xml"),
            ("TIDINGS_SMS_NUMBER_LIMITS", "5 per hour"),
            ("TIDINGS_SMS_COUNTRIES", "Mars"),
            ("TIDINGS_HOLD_TIMES", "promotion"),
            ("TIDINGS_FREQUENCY_CAPS", "acme:many"),
            ("TIDINGS_PROVIDER_RATES", "email:fast"),
            ("TIDINGS_TENANT_RATES", "default:0"),
            ("TIDINGS_BREAKER", "window=10"),
            ("TIDINGS_API_RATES", "send:lots"),
            ("TIDINGS_RESTOCK_RETRY_DELAYS_MS", "1000,soon"),
            ("TIDINGS_SIGNING_KEYS", "just-a-secret"),
        ] {
            let e = settings(&[(name, bad)]).unwrap_err();
            assert_eq!(e.var, name, "{name}={bad}: {e}");
            assert!(!e.reason.starts_with(name), "the name said twice: {e}");
        }
    }

    /// A key of fewer than 16 characters in the environment stops the start, naming whose it is
    /// and never showing it.
    #[test]
    fn a_short_environment_key_is_refused_at_start() {
        let e = settings(&[("TIDINGS_API_KEYS", "acme:0123456789abcdef,globex:hunter2")]).unwrap_err();
        assert_eq!(e.var, "TIDINGS_API_KEYS");
        assert!(e.reason.contains("tenant globex") && e.reason.contains("16"), "{e}");
        assert!(!e.to_string().contains("hunter2"), "the key is shown: {e}");
        let e = settings(&[("TIDINGS_OPERATOR_KEYS", "short-op-key")]).unwrap_err();
        assert_eq!(e.var, "TIDINGS_OPERATOR_KEYS");
        assert!(!e.to_string().contains("short-op-key"), "{e}");
        let ok = settings(&[("TIDINGS_API_KEYS", "acme:0123456789abcdef")]).unwrap();
        let keys = ok.env_keys().unwrap();
        assert_eq!(keys, [EnvKey { tenant: Some(TenantId::parse("acme").unwrap()), key: "0123456789abcdef".into() }]);
    }

    /// The same key for two tenants (which one a request meant cannot be known: it went to the
    /// last) stops the start; so does a tenant's key given to an operator.
    #[test]
    fn one_key_for_two_holders_is_refused_at_start() {
        let same = "acme:0123456789abcdef,globex:0123456789abcdef";
        let e = settings(&[("TIDINGS_API_KEYS", same)]).unwrap_err();
        assert_eq!(e.var, "TIDINGS_API_KEYS");
        assert!(e.reason.contains("tenant globex") && e.reason.contains("tenant acme"), "{e}");
        assert!(!e.to_string().contains("0123456789abcdef"), "the key is shown: {e}");
        let s =
            settings(&[("TIDINGS_API_KEYS", "acme:0123456789abcdef"), ("TIDINGS_OPERATOR_KEYS", "0123456789abcdef")])
                .unwrap();
        let e = s.env_keys().unwrap_err();
        assert!(e.var.contains("TIDINGS_OPERATOR_KEYS") && e.reason.contains("an operator"), "{e}");
        // The same key twice for the same tenant is one key.
        let twice = settings(&[("TIDINGS_API_KEYS", "acme:0123456789abcdef,acme:0123456789abcdef")]).unwrap();
        assert_eq!(twice.env_keys().unwrap().len(), 1);
    }

    #[test]
    fn a_misspelt_name_is_unknown_and_its_closest_known_name_given() {
        let s = settings(&[("TIDINGS_MAX_RECIEVES", "5"), ("TIDINGS_NOTHING_LIKE_IT_AT_ALL", "1"), ("PATH", "/bin")])
            .unwrap();
        let unknown: Vec<_> = s.unknown().collect();
        assert_eq!(
            unknown,
            [("TIDINGS_MAX_RECIEVES", Some("TIDINGS_MAX_RECEIVES")), ("TIDINGS_NOTHING_LIKE_IT_AT_ALL", None)]
        );
        // The misspelt setting has no effect: the default stands.
        assert_eq!(s.core().max_receives, 5);
    }

    #[test]
    fn the_variables_serve_prints_for_the_shell_are_known_and_read_by_no_server() {
        let printed = ["TIDINGS_URL", "TIDINGS_API_KEY", "TIDINGS_OPERATOR_KEY"];
        let s = settings(&printed.map(|n| (n, "x"))).unwrap();
        assert_eq!(s.unknown().count(), 0, "pasting them never warns");
        for name in printed {
            assert_eq!(
                variable(name).map(|v| v.reader),
                Some(Reader::Tests),
                "{name}: clients read it, not the server"
            );
        }
    }

    #[test]
    fn every_known_name_and_queue_urls_are_known() {
        let mut vars: Vec<(String, String)> = VARIABLES
            .iter()
            .filter(|v| !v.name.contains('<'))
            .map(|v| (v.name.to_owned(), v.default.to_owned()))
            .collect();
        vars.push(("TIDINGS_QUEUE_URL_REQUESTS_HIGH_DLQ".into(), "http://q/1".into()));
        let s = Settings::from_vars(vars).unwrap();
        assert_eq!(s.unknown().count(), 0);
        assert_eq!(s.queue_urls().collect::<Vec<_>>(), [("REQUESTS_HIGH_DLQ", "http://q/1")]);
    }

    /// The table's defaults are the values the types default to: an unset variable and its
    /// documented default mean the same.
    #[test]
    fn the_tables_defaults_are_the_configurations_defaults() {
        let s = settings(&[]).unwrap();
        assert_eq!(format!("{:?}", s.core()), format!("{:?}", CoreConfig::default()));
        assert_eq!(s.gates(), CoreConfig::default().gates);
        assert_eq!(s.core().api_rates, ApiRates::default());
        for v in VARIABLES.iter().filter(|v| !v.default.is_empty()) {
            check(v, v.name, v.default).unwrap();
        }
    }

    #[test]
    fn values_are_read_and_empty_ones_are_unset() {
        let s = settings(&[
            ("TIDINGS_MAX_RECEIVES", "12"),
            ("TIDINGS_PROVIDER_TIMEOUT_MS", "5000"),
            ("TIDINGS_DELIVERY_LEASE_MS", "100"),
            ("TIDINGS_TENANT_RATES", "default:100,acme:5"),
            ("TIDINGS_BREAKER", "off"),
            ("TIDINGS_FREQUENCY_CAPS", "globex:1"),
            ("TIDINGS_WEBHOOK_ALLOW_PRIVATE", "true"),
            ("TIDINGS_RESTOCK_RETRY_DELAYS_MS", "500,500"),
            ("TIDINGS_SMS_NUMBER_LIMITS", ""),
            ("TIDINGS_PUBLIC_URL", ""),
        ])
        .unwrap();
        let c = s.core();
        assert_eq!(c.max_receives, 12);
        // The lease is never shorter than a provider call.
        assert_eq!(c.delivery_lease, Duration::from_secs(6));
        assert_eq!(c.gates.default_tenant_rate, Some(100.0));
        assert_eq!(c.gates.tenant_rates.get("acme"), Some(&5.0));
        assert_eq!(c.gates.breaker.min_calls, u32::MAX);
        assert_eq!(c.frequency_cap_of("globex"), 1);
        assert!(c.webhooks.policy.allow_private);
        assert_eq!(c.restock.retry_delays, [Duration::from_millis(500); 2]);
        assert!(c.abuse.number_limits.is_empty());
        assert_eq!(c.public_url, "http://127.0.0.1:8080");
    }

    /// `tidings config`'s view: each variable with its value and where it comes from, no
    /// secret shown (the names of tenants and key ids are), the tests' variables only when set,
    /// and a value raised to its floor said so.
    #[test]
    fn the_variables_in_effect_say_where_each_comes_from_and_hide_secrets() {
        let s = settings(&[
            ("TIDINGS_MAX_RECEIVES", "7"),
            ("TIDINGS_API_KEYS", "acme:0123456789abcdef,globex:fedcba9876543210"),
            ("TIDINGS_OPERATOR_KEYS", "operator-secret-0123"),
            ("TIDINGS_SIGNING_KEYS", "k2:signing-secret-2,k1:signing-secret-1"),
            ("TIDINGS_DELIVERY_LEASE_MS", "100"),
            ("TIDINGS_QUEUE_URL_EMAIL_HIGH", "http://q/email-high"),
            ("TIDINGS_URL", "http://127.0.0.1:1"),
        ])
        .unwrap();
        let shown = s.in_effect();
        let of = |name: &str| shown.iter().find(|e| e.name == name).unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!(
            (of("TIDINGS_MAX_RECEIVES").value.as_deref(), of("TIDINGS_MAX_RECEIVES").source),
            (Some("7"), Source::Environment)
        );
        assert_eq!(
            (of("TIDINGS_RETRY_BASE_MS").value.as_deref(), of("TIDINGS_RETRY_BASE_MS").source),
            (Some("10000"), Source::Default)
        );
        assert_eq!(
            (of("TIDINGS_SNS_TOPIC_ARNS").value.as_deref(), of("TIDINGS_SNS_TOPIC_ARNS").source),
            (None, Source::Unset)
        );
        assert_eq!(of("TIDINGS_API_KEYS").value.as_deref(), Some("acme:****,globex:****"));
        assert_eq!(of("TIDINGS_OPERATOR_KEYS").value.as_deref(), Some("****"));
        assert_eq!(of("TIDINGS_SIGNING_KEYS").value.as_deref(), Some("k2:****,k1:****"));
        assert!(of("TIDINGS_SIGNING_KEYS").secret && !of("TIDINGS_MAX_RECEIVES").secret);
        let all = serde_json::to_string(&shown).unwrap();
        for secret in ["0123456789abcdef", "fedcba9876543210", "operator-secret", "signing-secret"] {
            assert!(!all.contains(secret), "{secret} shown: {all}");
        }
        let lease = of("TIDINGS_DELIVERY_LEASE_MS");
        assert_eq!(lease.value.as_deref(), Some("100"));
        assert_eq!(lease.note.as_deref(), Some("11000 in effect (never below the provider timeout + 1 s)"));
        assert_eq!(of("TIDINGS_QUEUE_URL_EMAIL_HIGH").value.as_deref(), Some("http://q/email-high"));
        assert!(!shown.iter().any(|e| e.name.contains('<')), "the family's row itself is not a variable");
        assert_eq!(of("TIDINGS_URL").reader, Reader::Tests);
        assert!(!shown.iter().any(|e| e.name == "TIDINGS_BIN"), "an unset tests' variable is shown");
        // Every variable a deployment reads is there.
        for v in VARIABLES.iter().filter(|v| v.reader != Reader::Tests && !v.name.contains('<')) {
            of(v.name);
        }
    }

    /// The configuration table (docs/configuration.md) is [`markdown_table`], row for row.
    #[test]
    fn the_readme_table_is_the_module_table() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/configuration.md");
        let readme = std::fs::read_to_string(path).unwrap();
        let table: Vec<&str> = readme
            .lines()
            .skip_while(|l| !l.contains("<!-- configuration table"))
            .skip(1)
            .take_while(|l| l.starts_with('|'))
            .collect();
        let expected = markdown_table();
        let expected: Vec<&str> = expected.lines().collect();
        let missing: Vec<&&str> = expected.iter().filter(|l| !table.contains(l)).collect();
        let extra: Vec<&&str> = table.iter().filter(|l| !expected.contains(l)).collect();
        assert!(
            missing.is_empty() && extra.is_empty() && table == expected,
            "docs/configuration.md's table differs from tidings_core::config::VARIABLES \
             (print it with `tidings config --table`):\nmissing from docs/configuration.md:\n{missing:#?}\nnot in the module:\n{extra:#?}"
        );
    }
}
