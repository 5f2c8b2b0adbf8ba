//! Rate limits on the HTTP API: token buckets per tenant and class, and per client address
//! where there is no tenant yet (the public routes, provider callbacks, failed
//! authentications), so that a flood from one caller is refused with 429 before it takes the
//! capacity every tenant's OTPs share. The buckets are the provider gates'
//! ([`super::GateStore`]): in the table on AWS, shared by every instance and leased a few tokens
//! at a time; in the process on the embedded backend. How to size each class: docs/gates.md,
//! "API limits".
//!
//! `TIDINGS_API_RATES="send:50,recipients:1000,orders:1500:3000,acme/send:200"`: per class a
//! rate per second and, after a second `:`, the bucket's burst (default: one second's rate);
//! `tenant/class:rate[:burst]` overrides one tenant's; `class:off` lifts a class's limit; `off`
//! lifts them all. Absent: [`ApiRates::default`].

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::GateStore;
use super::token_bucket::{LocalGate, RateGate, SharedGate};
use crate::ids::TenantId;
use crate::notify::abuse::{ip_subject, subject_hash};

/// Which bucket a request takes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RouteClass {
    /// `POST /v1/notifications` (OTPs, receipts, campaigns), per tenant: one unit a request.
    Send,
    /// The recipients of `POST /v1/notifications` with `user_ids`, per tenant: one unit a
    /// recipient, so that a request to 1,000 users costs what 1,000 requests to one do. A
    /// segment (a campaign) costs nothing here: its size is not known when it is accepted, and
    /// its pages are paced by the campaign pipeline and the tenant's send gate
    /// (`TIDINGS_TENANT_RATES`).
    Recipients,
    /// `/v1/orders*` (place, pay, cancel, read an order), per tenant: sized for a flash sale.
    Orders,
    /// Every other change, per tenant.
    Write,
    /// Reads, per tenant.
    Read,
    /// Tracking pixels and clicks, unsubscribe pages, the live feed: per client address.
    Public,
    /// Provider callbacks (SNS, push services): per client address.
    Callback,
    /// Failed authentications (401) per client address: an address out of them is answered 429
    /// before its key is checked, so keys cannot be guessed at the API's speed.
    Auth,
}

impl RouteClass {
    pub const ALL: [RouteClass; 8] = [
        RouteClass::Send,
        RouteClass::Recipients,
        RouteClass::Orders,
        RouteClass::Write,
        RouteClass::Read,
        RouteClass::Public,
        RouteClass::Callback,
        RouteClass::Auth,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RouteClass::Send => "send",
            RouteClass::Recipients => "recipients",
            RouteClass::Orders => "orders",
            RouteClass::Write => "write",
            RouteClass::Read => "read",
            RouteClass::Public => "public",
            RouteClass::Callback => "callback",
            RouteClass::Auth => "auth",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == s)
    }

    /// Whether its buckets are per client address (no tenant is known for them).
    pub fn by_address(self) -> bool {
        matches!(self, RouteClass::Public | RouteClass::Callback | RouteClass::Auth)
    }

    /// What one unit of it is, for the answers' words.
    pub fn unit(self) -> &'static str {
        match self {
            RouteClass::Recipients => "recipients",
            RouteClass::Auth => "failed authentications",
            _ => "requests",
        }
    }
}

/// Who a bucket belongs to.
#[derive(Clone, Copy, Debug)]
pub enum Caller<'a> {
    Tenant(&'a TenantId),
    Address(IpAddr),
}

/// One bucket's rate: `per_s` units a second, `burst` of them at once.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rate {
    pub per_s: f64,
    pub burst: f64,
}

impl Rate {
    /// A bucket of one second's quota.
    pub const fn per_second(per_s: f64) -> Self {
        Self { per_s, burst: per_s }
    }

    /// The whole units the bucket holds: the most one request may cost.
    pub fn burst_units(&self) -> u32 {
        self.burst.floor().clamp(1.0, f64::from(u32::MAX)) as u32
    }
}

/// Units per second per class, and per tenant where configured (`None`: off for that tenant).
#[derive(Clone, Debug, PartialEq)]
pub struct ApiRates {
    pub classes: BTreeMap<RouteClass, Rate>,
    pub tenants: BTreeMap<(String, RouteClass), Option<Rate>>,
}

impl Default for ApiRates {
    /// Per tenant: 50 send requests and 1,000 recipients a second (a bucket of 1,000: one
    /// `user_ids` list at its largest), 1,500 order requests a second with a burst of 3,000 (a
    /// flash sale's 1,000 orders at once, their payments and reads), 100 other changes and 200
    /// reads; per client address: 20 public requests, 100 callbacks (a provider's callbacks come
    /// from few addresses), and 10 failed authentications at once then one a second. Why these:
    /// docs/gates.md, "API limits".
    fn default() -> Self {
        let classes = [
            (RouteClass::Send, Rate::per_second(50.0)),
            (RouteClass::Recipients, Rate::per_second(1000.0)),
            (RouteClass::Orders, Rate { per_s: 1500.0, burst: 3000.0 }),
            (RouteClass::Write, Rate::per_second(100.0)),
            (RouteClass::Read, Rate::per_second(200.0)),
            (RouteClass::Public, Rate::per_second(20.0)),
            (RouteClass::Callback, Rate::per_second(100.0)),
            (RouteClass::Auth, Rate { per_s: 1.0, burst: 10.0 }),
        ];
        Self { classes: classes.into_iter().collect(), tenants: BTreeMap::new() }
    }
}

/// The variable the rates are read from.
pub const API_RATES_VAR: &str = "TIDINGS_API_RATES";

impl ApiRates {
    /// Parses [`API_RATES_VAR`]'s syntax; classes it does not name keep their default.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let mut rates = Self::default();
        let bad = |entry: &str, why: &str| format!("{API_RATES_VAR}: {entry:?} {why}");
        for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            if entry == "off" {
                rates.classes.clear();
                continue;
            }
            let (name, value) = entry.split_once(':').ok_or_else(|| bad(entry, "is not class:rate"))?;
            let positive = |v: &str| match v.trim().parse::<f64>() {
                Ok(n) if n.is_finite() && n > 0.0 => Some(n),
                _ => None,
            };
            let rate = match value.trim().split_once(':') {
                _ if value.trim() == "off" => None,
                None => Some(
                    positive(value)
                        .map(Rate::per_second)
                        .ok_or_else(|| bad(entry, "needs a rate above 0 (units per second) or off"))?,
                ),
                Some((per_s, burst)) => {
                    let per_s = positive(per_s).ok_or_else(|| bad(entry, "needs a rate above 0 (units per second)"))?;
                    let burst = positive(burst)
                        .filter(|b| *b >= per_s)
                        .ok_or_else(|| bad(entry, "needs a burst of at least its rate (class:rate:burst)"))?;
                    Some(Rate { per_s, burst })
                }
            };
            let (tenant, class) = match name.trim().split_once('/') {
                Some((t, c)) => (Some(t.trim()), c.trim()),
                None => (None, name.trim()),
            };
            let class = RouteClass::parse(class).ok_or_else(|| {
                bad(entry, "names no class (send, recipients, orders, write, read, public, callback, auth)")
            })?;
            match tenant {
                Some(_) if class.by_address() => {
                    return Err(bad(entry, "public, callback and auth limits are per address"));
                }
                Some(t) => {
                    let t = TenantId::parse(t).map_err(|e| bad(entry, &e.to_string()))?;
                    rates.tenants.insert((t.as_str().to_owned(), class), rate);
                }
                None => match rate {
                    Some(r) => {
                        rates.classes.insert(class, r);
                    }
                    None => {
                        rates.classes.remove(&class);
                    }
                },
            }
        }
        Ok(rates)
    }

    /// The rate of `caller`'s bucket of `class`; `None`: no limit.
    pub fn rate(&self, caller: Caller<'_>, class: RouteClass) -> Option<Rate> {
        if let Caller::Tenant(t) = caller
            && let Some(r) = self.tenants.get(&(t.as_str().to_owned(), class))
        {
            return *r;
        }
        self.classes.get(&class).copied()
    }
}

/// A request's place in its bucket: what the `RateLimit-Policy` and `RateLimit` headers say.
#[derive(Clone, Debug, PartialEq)]
pub struct Admission {
    pub class: RouteClass,
    /// Units allowed per second (the policy's quota over a window of one second).
    pub quota: u32,
    /// About how many more units would be let through now.
    pub remaining: u32,
    /// Until the bucket is full again.
    pub reset: Duration,
    /// Refused: how long until the request could pass (`Retry-After`).
    pub refused: Option<Duration>,
}

/// Buckets kept in this process at most; past it, those idle for a while are dropped (a
/// dropped bucket is a full one, which an idle bucket is anyway).
const MAX_BUCKETS: usize = 20_000;
const IDLE_MS: i64 = 10_000;

struct Kept {
    gate: Arc<dyn RateGate>,
    used_ms: i64,
}

/// The API's buckets.
pub struct ApiLimits {
    rates: ApiRates,
    store: GateStore,
    gates: Mutex<HashMap<String, Kept>>,
}

impl ApiLimits {
    pub fn new(rates: ApiRates, store: GateStore) -> Self {
        Self { rates, store, gates: Mutex::new(HashMap::new()) }
    }

    /// No limits at all.
    pub fn off() -> Self {
        Self::new(ApiRates { classes: BTreeMap::new(), tenants: BTreeMap::new() }, GateStore::Local)
    }

    fn name(caller: Caller<'_>, class: RouteClass) -> String {
        match caller {
            Caller::Tenant(t) => format!("api#{}#T#{t}", class.as_str()),
            // Hashed: the table holds no client address.
            Caller::Address(ip) => {
                format!("api#{}#IP#{}", class.as_str(), subject_hash(&ip_subject(&ip.to_string()).unwrap_or_default()))
            }
        }
    }

    fn gate(&self, name: String, rate: Rate, now_ms: i64) -> Arc<dyn RateGate> {
        let mut gates = self.gates.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(kept) = gates.get_mut(&name) {
            kept.used_ms = now_ms;
            return kept.gate.clone();
        }
        if gates.len() >= MAX_BUCKETS {
            gates.retain(|_, k| now_ms - k.used_ms < IDLE_MS);
            if gates.len() >= MAX_BUCKETS {
                gates.clear();
            }
        }
        // Seconds of quota the bucket holds: 1 and more (see `TokenBucket::shaped`).
        let share = (rate.burst / rate.per_s).max(1.0);
        let gate: Arc<dyn RateGate> = match &self.store {
            GateStore::Local => Arc::new(LocalGate::shaped(rate.per_s, share, now_ms)),
            GateStore::Shared(table) => Arc::new(SharedGate::shaped(table.clone(), &name, rate.per_s, share)),
        };
        gates.insert(name, Kept { gate: gate.clone(), used_ms: now_ms });
        gate
    }

    /// The rate of `caller`'s bucket of `class`; `None` when that class has no limit.
    pub fn rate(&self, caller: Caller<'_>, class: RouteClass) -> Option<Rate> {
        self.rates.rate(caller, class)
    }

    /// Takes one request from `caller`'s bucket of `class`; `None` when that class has no limit.
    pub async fn admit(&self, caller: Caller<'_>, class: RouteClass, now_ms: i64) -> Option<Admission> {
        self.admit_n(caller, class, 1, now_ms).await
    }

    /// Takes `units` at once from `caller`'s bucket of `class` (all or none); `None` when that
    /// class has no limit. More units than the bucket's burst are never admitted: see
    /// [`ApiLimits::rate`] and [`Rate::burst_units`] to say so before asking.
    pub async fn admit_n(&self, caller: Caller<'_>, class: RouteClass, units: u32, now_ms: i64) -> Option<Admission> {
        let rate = self.rates.rate(caller, class)?;
        let gate = self.gate(Self::name(caller, class), rate, now_ms);
        let refused =
            if units <= 1 { gate.try_admit(now_ms).await.err() } else { gate.try_admit_n(units, now_ms).await.err() };
        Some(Self::admission(gate.as_ref(), class, rate, refused, now_ms))
    }

    fn admission(
        gate: &dyn RateGate,
        class: RouteClass,
        rate: Rate,
        refused: Option<Duration>,
        now_ms: i64,
    ) -> Admission {
        let (remaining, reset) = gate.remaining(now_ms);
        let quota = rate.per_s.floor().clamp(1.0, f64::from(u32::MAX)) as u32;
        Admission {
            class,
            quota,
            remaining: if refused.is_some() { 0 } else { remaining.min(rate.burst_units()) },
            reset: refused.map_or(reset, |wait| wait.max(reset)),
            refused,
        }
    }

    /// Whether `ip` is out of failed authentications (then the refusal, before its key is
    /// checked). Asks no store: an instance knows an address's bucket is empty from its own
    /// last take ([`ApiLimits::authentication_failed`]); an address it never saw fail is not
    /// refused.
    pub fn authentication_refused(&self, ip: IpAddr, now_ms: i64) -> Option<Admission> {
        let caller = Caller::Address(ip);
        let rate = self.rates.rate(caller, RouteClass::Auth)?;
        let gate = {
            let mut gates = self.gates.lock().unwrap_or_else(|p| p.into_inner());
            let kept = gates.get_mut(&Self::name(caller, RouteClass::Auth))?;
            kept.used_ms = now_ms;
            kept.gate.clone()
        };
        let wait = gate.empty_for(now_ms)?;
        Some(Self::admission(gate.as_ref(), RouteClass::Auth, rate, Some(wait), now_ms))
    }

    /// A request from `ip` failed its authentication: one unit of its bucket.
    pub async fn authentication_failed(&self, ip: IpAddr, now_ms: i64) -> Option<Admission> {
        self.admit(Caller::Address(ip), RouteClass::Auth, now_ms).await
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn acme() -> TenantId {
        TenantId::parse("acme").unwrap()
    }

    #[test]
    fn rates_parse_with_defaults_overrides_bursts_and_off() {
        let r = ApiRates::parse("send:5, read:off, acme/write:7, globex/send:off, orders:10:40").unwrap();
        assert_eq!(r.classes.get(&RouteClass::Send), Some(&Rate::per_second(5.0)));
        assert_eq!(r.classes.get(&RouteClass::Read), None);
        assert_eq!(r.classes.get(&RouteClass::Orders), Some(&Rate { per_s: 10.0, burst: 40.0 }));
        assert_eq!(
            r.classes.get(&RouteClass::Public),
            Some(&Rate::per_second(20.0)),
            "unnamed classes keep their default"
        );
        let acme = acme();
        let globex = TenantId::parse("globex").unwrap();
        assert_eq!(r.rate(Caller::Tenant(&acme), RouteClass::Write), Some(Rate::per_second(7.0)));
        assert_eq!(r.rate(Caller::Tenant(&globex), RouteClass::Write), Some(Rate::per_second(100.0)));
        assert_eq!(r.rate(Caller::Tenant(&globex), RouteClass::Send), None);
        assert!(ApiRates::parse("off").unwrap().classes.is_empty());
        for bad in [
            "send",
            "send:0",
            "send:-1",
            "sned:5",
            "acme/public:5",
            "acme/auth:5",
            "send:fast",
            "Bad Tenant/send:3",
            "orders:10:5",
            "orders:10:many",
            "orders:0:5",
        ] {
            let e = ApiRates::parse(bad).unwrap_err();
            assert!(e.contains(API_RATES_VAR) && e.contains(bad), "{bad}: {e}");
        }
    }

    /// The defaults let a flash sale's orders through at once and hold a whole `user_ids` list
    /// of recipients (docs/gates.md, "API limits").
    #[test]
    fn the_defaults_take_a_flash_sale_and_a_largest_list() {
        let d = ApiRates::default();
        let orders = d.classes[&RouteClass::Orders];
        assert!(orders.burst >= 2000.0 && orders.per_s >= 1000.0, "{orders:?}");
        assert!(
            d.classes[&RouteClass::Recipients].burst_units() as usize >= crate::notify::model::MAX_USER_IDS,
            "a list of the most user_ids a request may name must fit in the bucket"
        );
        assert!(d.classes.contains_key(&RouteClass::Auth));
    }

    /// A bucket of 1,000 recipients: 40 notifications of 1,000 recipients at once pass one,
    /// where they were 40 requests of the send class before; the refusal says when all the
    /// units will be there.
    #[tokio::test]
    async fn recipients_are_counted_by_the_unit() {
        let limits = ApiLimits::new(ApiRates::default(), GateStore::Local);
        let acme = acme();
        let mut passed = 0;
        for _ in 0..40 {
            let a = limits.admit_n(Caller::Tenant(&acme), RouteClass::Recipients, 1000, 0).await.unwrap();
            match a.refused {
                None => passed += 1,
                Some(wait) => assert_eq!(wait, Duration::from_secs(1), "1,000 more at 1,000 a second"),
            }
        }
        assert_eq!(passed, 1);
        let later = limits.admit_n(Caller::Tenant(&acme), RouteClass::Recipients, 1000, 1000).await.unwrap();
        assert_eq!(later.refused, None, "a second later the bucket holds 1,000 again");
    }

    /// An address is refused before its key is checked once its failed authentications ran out,
    /// and not before; another address is not.
    #[tokio::test]
    async fn failed_authentications_empty_an_addresss_bucket() {
        let limits = ApiLimits::new(ApiRates::parse("auth:1:3").unwrap(), GateStore::Local);
        let a: IpAddr = "203.0.113.7".parse().unwrap();
        let b: IpAddr = "198.51.100.1".parse().unwrap();
        assert_eq!(limits.authentication_refused(a, 0), None, "an address never seen failing");
        for _ in 0..3 {
            assert_eq!(limits.authentication_failed(a, 0).await.unwrap().refused, None);
        }
        let refused = limits.authentication_refused(a, 0).unwrap();
        assert_eq!(refused.refused, Some(Duration::from_secs(1)));
        assert_eq!(refused.class, RouteClass::Auth);
        assert_eq!(limits.authentication_refused(b, 0), None);
        assert_eq!(limits.authentication_refused(a, 1000), None, "a second later one more try");
    }

    /// One tenant sending ten times its rate gets no more than its rate a second; another
    /// tenant's bucket is untouched by it; the refusals say when to come back.
    #[tokio::test]
    async fn one_tenant_over_its_rate_is_refused_and_another_is_not() {
        let limits = ApiLimits::new(ApiRates::parse("send:10").unwrap(), GateStore::Local);
        let (acme, globex) = (acme(), TenantId::parse("globex").unwrap());
        let mut passed = 0;
        // 100 requests spread over one second: ten times the rate.
        for i in 0..100 {
            let a = limits.admit(Caller::Tenant(&acme), RouteClass::Send, i * 10).await.unwrap();
            assert_eq!(a.quota, 10);
            match a.refused {
                None => passed += 1,
                Some(wait) => {
                    assert!(wait > Duration::ZERO && wait <= Duration::from_secs(1), "{wait:?}");
                    assert_eq!(a.remaining, 0);
                    assert!(a.reset >= wait);
                }
            }
        }
        // The bucket's 10 and one second's refill, less what the last 10 ms had not yet made.
        assert!((18..=20).contains(&passed), "{passed} of 100 passed at 10/s");
        let other = limits.admit(Caller::Tenant(&globex), RouteClass::Send, 990).await.unwrap();
        assert_eq!(other.refused, None);
        assert_eq!(other.remaining, 9, "a fresh bucket of 10, one taken");
        // Another class of the same tenant is a bucket of its own.
        assert_eq!(limits.admit(Caller::Tenant(&acme), RouteClass::Read, 990).await.unwrap().refused, None);
        // And a class without a limit admits without a bucket.
        let off = ApiLimits::new(ApiRates::parse("read:off").unwrap(), GateStore::Local);
        assert_eq!(off.admit(Caller::Tenant(&acme), RouteClass::Read, 0).await, None);
    }

    #[tokio::test]
    async fn addresses_have_buckets_of_their_own_and_an_ipv6_prefix_is_one() {
        let limits = ApiLimits::new(ApiRates::parse("public:1").unwrap(), GateStore::Local);
        let a: IpAddr = "203.0.113.7".parse().unwrap();
        let b: IpAddr = "198.51.100.1".parse().unwrap();
        assert_eq!(limits.admit(Caller::Address(a), RouteClass::Public, 0).await.unwrap().refused, None);
        assert!(limits.admit(Caller::Address(a), RouteClass::Public, 0).await.unwrap().refused.is_some());
        assert_eq!(limits.admit(Caller::Address(b), RouteClass::Public, 0).await.unwrap().refused, None);
        let v6a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let v6b: IpAddr = "2001:db8:1:2::ffff".parse().unwrap();
        assert_eq!(limits.admit(Caller::Address(v6a), RouteClass::Public, 0).await.unwrap().refused, None);
        assert!(limits.admit(Caller::Address(v6b), RouteClass::Public, 0).await.unwrap().refused.is_some());
    }
}
