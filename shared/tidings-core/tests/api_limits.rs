//! The API's rate limits over a shared bucket in the table (as on AWS): two instances sharing
//! one tenant's bucket let through its rate (after a second's quota at once), and a request
//! costs at most one store request in the common case (tokens are leased a few at a time, an
//! uncontended write needs no read first, and an empty bucket is not asked again before its
//! next token).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use async_trait::async_trait;
use tidings_core::TenantId;
use tidings_core::gates::api::{ApiLimits, ApiRates, Caller, RouteClass};
use tidings_core::gates::{GateStore, RateGate, SharedGate};
use tidings_core::ports::StoreError;
use tidings_embedded::EmbeddedStore;
use tidings_embedded::test_world::{Around, Call, Wrapped};

/// The embedded table, counting the requests made of it.
struct Counting {
    requests: AtomicUsize,
    /// Every request fails as an unreachable store would.
    down: AtomicBool,
}

impl Counting {
    fn new() -> Arc<Wrapped<Self>> {
        let store = Arc::new(EmbeddedStore::in_memory().unwrap());
        Arc::new(Wrapped::new(store, Counting { requests: AtomicUsize::new(0), down: AtomicBool::new(false) }))
    }
}

#[async_trait]
impl Around for Counting {
    async fn before(&self, _: Call<'_>) -> Result<(), StoreError> {
        self.requests.fetch_add(1, Ordering::SeqCst);
        if self.down.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("down".into()));
        }
        Ok(())
    }
}

#[tokio::test]
async fn two_instances_share_a_tenants_bucket_at_under_one_request_each() {
    let table = Counting::new();
    let rates = ApiRates::parse("send:20").unwrap();
    // Two API instances over one table.
    let a = ApiLimits::new(rates.clone(), GateStore::Shared(table.clone()));
    let b = ApiLimits::new(rates, GateStore::Shared(table.clone()));
    let acme = TenantId::parse("acme").unwrap();
    let mut passed_at = Vec::new();
    let mut requests = 0;
    // 200 requests a second for three seconds, alternating instances: ten times the rate.
    for i in 0..600i64 {
        let now = i * 5;
        let limits = if i % 2 == 0 { &a } else { &b };
        let adm = limits.admit(Caller::Tenant(&acme), RouteClass::Send, now).await.unwrap();
        requests += 1;
        if adm.refused.is_none() {
            passed_at.push(now);
        } else {
            assert_eq!(adm.remaining, 0);
        }
    }
    // Never more than the bucket (one second's quota) and one second's refill in any second.
    let mut start = 0;
    for end in 0..passed_at.len() {
        while passed_at[end] - passed_at[start] >= 1000 {
            start += 1;
        }
        assert!(end - start < 40, "{} passed within one second", end - start + 1);
    }
    // The bucket and three seconds at the rate, less the tokens an instance held unused.
    let n = passed_at.len();
    assert!((60..=80).contains(&n), "{n} of 600 passed over 3 s at 20/s");
    // In the last second, the rate.
    let last = passed_at.iter().filter(|t| **t >= 2000).count();
    assert!((15..=21).contains(&last), "{last} passed in the last second");
    let store_requests = table.around.requests.load(Ordering::SeqCst);
    assert!(
        store_requests <= passed_at.len(),
        "{store_requests} store requests for {} admitted and {} refused",
        passed_at.len(),
        requests - passed_at.len()
    );
}

/// A single instance: each lease of tokens is one conditional write, not a read and a write.
#[tokio::test]
async fn an_uncontended_lease_is_one_request() {
    let table = Counting::new();
    let limits = ApiLimits::new(ApiRates::parse("read:40").unwrap(), GateStore::Shared(table.clone()));
    let acme = TenantId::parse("acme").unwrap();
    // 40 requests spread over two seconds: half the rate, all admitted.
    for i in 0..40i64 {
        let adm = limits.admit(Caller::Tenant(&acme), RouteClass::Read, i * 50).await.unwrap();
        assert_eq!(adm.refused, None, "request {i}");
    }
    // Leases of 10 (a quarter of the burst of 40): 4 leases; the first also reads the item.
    let n = table.around.requests.load(Ordering::SeqCst);
    assert!(n <= 5, "{n} store requests for 40 admitted");
}

/// Fifty requests of one tenant at the same moment on one instance: one lease serves them all
/// (they wait for it rather than race each other on the item), none is refused under its rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_on_one_instance_share_one_lease() {
    let table = Counting::new();
    let limits = Arc::new(ApiLimits::new(ApiRates::parse("send:5000").unwrap(), GateStore::Shared(table.clone())));
    let acme = TenantId::parse("acme").unwrap();
    let all = (0..50).map(|_| {
        let (limits, acme) = (limits.clone(), acme.clone());
        tokio::spawn(async move { limits.admit(Caller::Tenant(&acme), RouteClass::Send, 1_000).await.unwrap() })
    });
    for a in futures::future::join_all(all).await {
        assert_eq!(a.unwrap().refused, None);
    }
    let n = table.around.requests.load(Ordering::SeqCst);
    assert!(n <= 2, "{n} store requests: a read and one write");
}

/// A tenant's recipients on two instances of one shared bucket: a weighted take is all or
/// none across instances, one store write each, and a two-second bucket holds its burst.
#[tokio::test]
async fn recipients_on_a_shared_bucket_are_all_or_none_across_instances() {
    let table = Counting::new();
    let rates = ApiRates::parse("recipients:100,orders:10:20").unwrap();
    let a = ApiLimits::new(rates.clone(), GateStore::Shared(table.clone()));
    let b = ApiLimits::new(rates, GateStore::Shared(table.clone()));
    let acme = TenantId::parse("acme").unwrap();
    async fn take(l: &ApiLimits, n: u32) -> Option<std::time::Duration> {
        let acme = TenantId::parse("acme").unwrap();
        l.admit_n(Caller::Tenant(&acme), RouteClass::Recipients, n, 0).await.unwrap().refused
    }
    assert_eq!(take(&a, 80).await, None);
    let refused = take(&b, 30).await.expect("80 of 100 taken on the other instance");
    assert_eq!(refused, std::time::Duration::from_millis(100), "10 more at 100 a second");
    assert_eq!(take(&b, 20).await, None, "the refused take took nothing");
    assert!(take(&a, 1).await.is_some(), "the bucket is empty on both");
    let before = table.around.requests.load(Ordering::SeqCst);
    // A bucket of 20 at 10 a second: 20 orders at once on one instance, not 10.
    let mut passed = 0;
    for _ in 0..25 {
        passed += usize::from(a.admit(Caller::Tenant(&acme), RouteClass::Orders, 0).await.unwrap().refused.is_none());
    }
    assert_eq!(passed, 20);
    assert!(before <= 8, "{before} store requests for four weighted takes");
}

/// A bucket the store cannot reach lets API requests through (they meet the store themselves);
/// the provider gates back off instead.
#[tokio::test]
async fn an_unreachable_bucket_admits_api_requests() {
    let table = Counting::new();
    table.around.down.store(true, Ordering::SeqCst);
    let limits = ApiLimits::new(ApiRates::parse("send:1").unwrap(), GateStore::Shared(table.clone()));
    let acme = TenantId::parse("acme").unwrap();
    for _ in 0..3 {
        assert_eq!(limits.admit(Caller::Tenant(&acme), RouteClass::Send, 0).await.unwrap().refused, None);
    }
    let provider = SharedGate::new(table, "provider#email", 10.0);
    assert!(provider.try_take(0).await.is_err());
}

/// Two instances' provider gates on one shared bucket (one table), taking greedily at once on a
/// manual millisecond clock: together never more than the rate in any second, and not starved.
#[tokio::test]
async fn two_instances_on_one_shared_bucket_never_exceed_its_rate() {
    const RATE: f64 = 50.0;
    let table = Counting::new();
    let gates =
        [SharedGate::new(table.clone(), "provider#email", RATE), SharedGate::new(table, "provider#email", RATE)];
    let mut sends: Vec<i64> = Vec::new();
    for now in 0..5_000i64 {
        // Both instances ask at every millisecond, in turn, until each is refused.
        for gate in &gates {
            while gate.try_take(now).await.is_ok() {
                sends.push(now);
            }
        }
    }
    let most = tidings_core::gates::token_bucket::most_in_any_second(&sends);
    assert!(most as f64 <= RATE, "{most} sends in one second from two instances, rate {RATE}");
    assert!(sends.len() as f64 >= RATE * 5.0 * 0.5, "only {} sends in 5 s", sends.len());
}
