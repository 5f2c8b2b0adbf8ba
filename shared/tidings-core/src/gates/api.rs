//! Rate limits on the HTTP API: a token bucket per tenant and route class, and per client
//! address on the public routes (tracking links, unsubscribe, provider callbacks), so that a
//! flood from one caller is refused with 429 before it takes the capacity every tenant's OTPs
//! share. The buckets are the provider gates' ([`super::GateStore`]): in the table on AWS,
//! shared by every instance and leased a few tokens at a time; in the process on the embedded
//! backend.
//!
//! `TIDINGS_API_RATES="send:50,write:100,read:200,public:20,callback:100,acme/send:200"`:
//! requests per second per class; `tenant/class:rate` overrides one tenant's; `class:off`
//! lifts a class's limit; `off` lifts them all. Absent: [`ApiRates::default`].

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
    /// `POST /v1/notifications` (OTPs, receipts, campaigns), per tenant.
    Send,
    /// Every other change, per tenant.
    Write,
    /// Reads, per tenant.
    Read,
    /// Tracking pixels and clicks, unsubscribe pages, the live feed: per client address.
    Public,
    /// Provider callbacks (SNS, push services): per client address.
    Callback,
}

impl RouteClass {
    pub const ALL: [RouteClass; 5] =
        [RouteClass::Send, RouteClass::Write, RouteClass::Read, RouteClass::Public, RouteClass::Callback];

    pub fn as_str(self) -> &'static str {
        match self {
            RouteClass::Send => "send",
            RouteClass::Write => "write",
            RouteClass::Read => "read",
            RouteClass::Public => "public",
            RouteClass::Callback => "callback",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == s)
    }

    /// Whether its buckets are per client address (the routes that take no API key).
    pub fn by_address(self) -> bool {
        matches!(self, RouteClass::Public | RouteClass::Callback)
    }
}

/// Who a bucket belongs to.
#[derive(Clone, Copy, Debug)]
pub enum Caller<'a> {
    Tenant(&'a TenantId),
    Address(IpAddr),
}

/// Requests per second per class, and per tenant where configured.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiRates {
    pub classes: BTreeMap<RouteClass, f64>,
    pub tenants: BTreeMap<(String, RouteClass), f64>,
}

impl Default for ApiRates {
    /// Per tenant: 50 sends, 100 other changes and 200 reads a second; per client address: 20
    /// public requests and 100 callbacks a second (a provider's callbacks come from few
    /// addresses).
    fn default() -> Self {
        let classes = [
            (RouteClass::Send, 50.0),
            (RouteClass::Write, 100.0),
            (RouteClass::Read, 200.0),
            (RouteClass::Public, 20.0),
            (RouteClass::Callback, 100.0),
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
            let (name, rate) = entry.split_once(':').ok_or_else(|| bad(entry, "is not class:rate"))?;
            let rate = match rate.trim() {
                "off" => None,
                r => match r.parse::<f64>() {
                    Ok(n) if n.is_finite() && n > 0.0 => Some(n),
                    _ => return Err(bad(entry, "needs a rate above 0 (requests per second) or off")),
                },
            };
            let (tenant, class) = match name.trim().split_once('/') {
                Some((t, c)) => (Some(t.trim()), c.trim()),
                None => (None, name.trim()),
            };
            let class = RouteClass::parse(class)
                .ok_or_else(|| bad(entry, "names no class (send, write, read, public, callback)"))?;
            match tenant {
                Some(_) if class.by_address() => return Err(bad(entry, "public and callback limits are per address")),
                Some(t) => {
                    let t = TenantId::parse(t).map_err(|e| bad(entry, &e.to_string()))?;
                    // A tenant's `off` is a rate no one reaches.
                    rates.tenants.insert((t.as_str().to_owned(), class), rate.unwrap_or(f64::MAX));
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

    fn rate(&self, caller: Caller<'_>, class: RouteClass) -> Option<f64> {
        if let Caller::Tenant(t) = caller
            && let Some(r) = self.tenants.get(&(t.as_str().to_owned(), class))
        {
            return (*r < f64::MAX).then_some(*r);
        }
        self.classes.get(&class).copied()
    }
}

/// A request's place in its bucket: what the `RateLimit-Policy` and `RateLimit` headers say.
#[derive(Clone, Debug, PartialEq)]
pub struct Admission {
    pub class: RouteClass,
    /// Requests allowed per second (the policy's quota over a window of one second).
    pub quota: u32,
    /// About how many more would be let through now.
    pub remaining: u32,
    /// Until the bucket is full again.
    pub reset: Duration,
    /// Refused: how long until the next request could pass (`Retry-After`).
    pub refused: Option<Duration>,
}

/// A client may send a second's quota at once, then the rate: the policy is `q` requests
/// restored over a window of one second.
const API_BURST_SHARE: f64 = 1.0;
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

    fn gate(&self, name: String, rate: f64, now_ms: i64) -> Arc<dyn RateGate> {
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
        let gate: Arc<dyn RateGate> = match &self.store {
            GateStore::Local => Arc::new(LocalGate::shaped(rate, API_BURST_SHARE, now_ms)),
            GateStore::Shared(table) => Arc::new(SharedGate::shaped(table.clone(), &name, rate, API_BURST_SHARE)),
        };
        gates.insert(name, Kept { gate: gate.clone(), used_ms: now_ms });
        gate
    }

    /// Takes one request from `caller`'s bucket of `class`; `None` when that class has no limit.
    pub async fn admit(&self, caller: Caller<'_>, class: RouteClass, now_ms: i64) -> Option<Admission> {
        let rate = self.rates.rate(caller, class)?;
        let name = match caller {
            Caller::Tenant(t) => format!("api#{}#T#{t}", class.as_str()),
            // Hashed: the table holds no client address.
            Caller::Address(ip) => {
                format!("api#{}#IP#{}", class.as_str(), subject_hash(&ip_subject(&ip.to_string()).unwrap_or_default()))
            }
        };
        let gate = self.gate(name, rate, now_ms);
        let refused = gate.try_admit(now_ms).await.err();
        let (remaining, reset) = gate.remaining(now_ms);
        let quota = rate.floor().clamp(1.0, f64::from(u32::MAX)) as u32;
        Some(Admission {
            class,
            quota,
            remaining: if refused.is_some() { 0 } else { remaining.min(quota) },
            reset: refused.map_or(reset, |wait| wait.max(reset)),
            refused,
        })
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
    fn rates_parse_with_defaults_overrides_and_off() {
        let r = ApiRates::parse("send:5, read:off, acme/write:7, globex/send:off").unwrap();
        assert_eq!(r.classes.get(&RouteClass::Send), Some(&5.0));
        assert_eq!(r.classes.get(&RouteClass::Read), None);
        assert_eq!(r.classes.get(&RouteClass::Public), Some(&20.0), "unnamed classes keep their default");
        let acme = acme();
        let globex = TenantId::parse("globex").unwrap();
        assert_eq!(r.rate(Caller::Tenant(&acme), RouteClass::Write), Some(7.0));
        assert_eq!(r.rate(Caller::Tenant(&globex), RouteClass::Write), Some(100.0));
        assert_eq!(r.rate(Caller::Tenant(&globex), RouteClass::Send), None);
        assert!(ApiRates::parse("off").unwrap().classes.is_empty());
        for bad in ["send", "send:0", "send:-1", "sned:5", "acme/public:5", "send:fast", "Bad Tenant/send:3"] {
            let e = ApiRates::parse(bad).unwrap_err();
            assert!(e.contains(API_RATES_VAR) && e.contains(bad), "{bad}: {e}");
        }
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
