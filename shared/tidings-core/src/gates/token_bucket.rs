//! Token buckets: the rate gates in front of providers, per provider and per tenant.
//!
//! A bucket of capacity `burst` refilled at `rate - burst` per second lets through at most
//! `rate` sends in any window of one second (`burst + refill · 1 s`), spread out rather than
//! in one block (docs/gates.md).
//!
//! The API's buckets (`super::api`) hold at least a whole second's quota instead (`burst_share`
//! 1 or more: the `orders` class holds two seconds', so a flash sale's orders and their payments
//! pass at once) and refill at the rate: a client may send its burst at once, then the rate.
//!
//! AIMD on 429: the rate halves (never below 1/s); each accepted send adds back 1% of the
//! configured rate. [`TokenBucket::throttled`] can also pause the bucket for a `Retry-After`;
//! the provider gates pass none, and hold the tenant whose send was answered 429 instead
//! (`super::TenantGates::hold`), so one tenant's 429 does not stop the others' sends. The number of workers
//! never changes: fewer tokens, not more callers (more workers against a throttling provider
//! only get the account blocked sooner).

use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::ports::{Attrs, Cond, Item, Key, StoreError, Table};

/// The state of one bucket; pure arithmetic over a millisecond clock.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TokenBucket {
    /// The configured rate (sends per second).
    pub limit: f64,
    /// The current rate (AIMD moves it between 1 and `limit`).
    pub rate: f64,
    /// Tokens in the bucket.
    pub tokens: f64,
    pub last_ms: i64,
    /// Nothing passes before this (a provider's `Retry-After`).
    #[serde(default)]
    pub paused_until_ms: i64,
    /// When the rate was last halved.
    #[serde(default)]
    pub decreased_ms: i64,
    /// The share of the rate the bucket holds (its burst): at most one half, or 1 and more (see
    /// [`TokenBucket::refill_rate`]).
    #[serde(default = "provider_burst_share")]
    pub burst_share: f64,
}

/// The burst of a provider's bucket: 5% of its rate (sends spread over the second).
pub const PROVIDER_BURST_SHARE: f64 = 0.05;

fn provider_burst_share() -> f64 {
    PROVIDER_BURST_SHARE
}

/// 429s within this long of a decrease are answers to sends made before it: one congestion
/// event halves the rate once, not once per call that was already on its way.
const DECREASE_EVERY_MS: i64 = 1000;

impl TokenBucket {
    pub fn new(limit: f64, now_ms: i64) -> Self {
        Self::shaped(limit, PROVIDER_BURST_SHARE, now_ms)
    }

    /// A full bucket of `limit` per second holding `burst_share` of it.
    pub fn shaped(limit: f64, burst_share: f64, now_ms: i64) -> Self {
        let limit = limit.max(0.001);
        let mut b = Self {
            limit,
            rate: limit,
            tokens: 0.0,
            last_ms: now_ms,
            paused_until_ms: 0,
            decreased_ms: i64::MIN,
            burst_share,
        };
        b.tokens = b.burst();
        b
    }

    /// Up to one half, or 1 and more (the API's buckets: seconds of quota held).
    fn share(&self) -> f64 {
        if self.burst_share >= 1.0 { self.burst_share } else { self.burst_share.clamp(0.0, 0.5) }
    }

    /// The bucket's capacity: `burst_share` of the current rate, at least one token.
    pub fn burst(&self) -> f64 {
        (self.rate * self.share()).max(1.0).floor()
    }

    /// How long until the next whole token (zero when one is there).
    pub fn next_token_in(&self, now_ms: i64) -> Duration {
        let mut b = self.clone();
        b.refill(now_ms);
        if b.tokens >= 1.0 {
            return Duration::ZERO;
        }
        Duration::from_millis(((1.0 - b.tokens) * 1000.0 / b.refill_rate()).ceil().max(1.0) as u64)
    }

    /// Whole tokens in the bucket as of `now_ms` (without taking any).
    pub fn available(&self, now_ms: i64) -> u32 {
        let mut b = self.clone();
        b.refill(now_ms);
        b.tokens.floor().max(0.0) as u32
    }

    /// How long until the bucket is full again.
    pub fn until_full(&self, now_ms: i64) -> Duration {
        let mut b = self.clone();
        b.refill(now_ms);
        let ms = ((b.burst() - b.tokens).max(0.0) * 1000.0 / b.refill_rate()).ceil();
        Duration::from_millis(ms as u64)
    }

    /// Tokens per second added: so that burst + refill ≤ rate over one second (providers: never
    /// more than the rate in any second); a bucket of a whole second's quota refills at the rate.
    fn refill_rate(&self) -> f64 {
        if self.share() >= 1.0 {
            return self.rate.max(0.001);
        }
        (self.rate - self.burst()).max(self.rate * 0.5).max(0.001)
    }

    fn refill(&mut self, now_ms: i64) {
        if now_ms > self.last_ms {
            let add = (now_ms - self.last_ms) as f64 * self.refill_rate() / 1000.0;
            self.tokens = (self.tokens + add).min(self.burst());
            self.last_ms = now_ms;
        }
    }

    /// Takes up to `n` tokens: how many it got, or (when none) how long until one is there.
    pub fn take(&mut self, n: u32, now_ms: i64) -> Result<u32, Duration> {
        if now_ms < self.paused_until_ms {
            return Err(Duration::from_millis((self.paused_until_ms - now_ms) as u64));
        }
        self.refill(now_ms);
        let got = (self.tokens.floor() as u32).min(n);
        if got == 0 {
            let ms = ((1.0 - self.tokens) * 1000.0 / self.refill_rate()).ceil().max(1.0);
            return Err(Duration::from_millis(ms as u64));
        }
        self.tokens -= f64::from(got);
        Ok(got)
    }

    /// Takes exactly `n` tokens, or none and says how long until `n` are there (a request that
    /// costs several units: a notification's recipients). `n` above the burst never passes;
    /// callers check it first ([`TokenBucket::burst`]).
    pub fn take_exactly(&mut self, n: u32, now_ms: i64) -> Result<(), Duration> {
        if now_ms < self.paused_until_ms {
            return Err(Duration::from_millis((self.paused_until_ms - now_ms) as u64));
        }
        self.refill(now_ms);
        let n = f64::from(n.max(1));
        if self.tokens >= n {
            self.tokens -= n;
            return Ok(());
        }
        let ms = ((n - self.tokens) * 1000.0 / self.refill_rate()).ceil().max(1.0);
        Err(Duration::from_millis(ms as u64))
    }

    /// Takes `n` tokens when at least one is there, owing the rest (the bucket goes below zero
    /// and refills from there): a lease of the next tokens, so that one instance takes several
    /// in one request of the store while the rate over time stays the same.
    pub fn lease(&mut self, n: u32, now_ms: i64) -> Result<u32, Duration> {
        if now_ms < self.paused_until_ms {
            return Err(Duration::from_millis((self.paused_until_ms - now_ms) as u64));
        }
        self.refill(now_ms);
        if self.tokens < 1.0 {
            let ms = ((1.0 - self.tokens) * 1000.0 / self.refill_rate()).ceil().max(1.0);
            return Err(Duration::from_millis(ms as u64));
        }
        let n = n.max(1);
        self.tokens -= f64::from(n);
        Ok(n)
    }

    /// The provider answered 429: halve the rate (once per congestion event), empty the
    /// bucket, pause for `retry_after`.
    pub fn throttled(&mut self, now_ms: i64, retry_after: Option<Duration>) {
        self.refill(now_ms);
        if now_ms.saturating_sub(self.decreased_ms) >= DECREASE_EVERY_MS {
            self.rate = (self.rate / 2.0).max(1.0_f64.min(self.limit));
            self.decreased_ms = now_ms;
        }
        self.tokens = 0.0;
        if let Some(ra) = retry_after {
            let until = now_ms.saturating_add(i64::try_from(ra.as_millis()).unwrap_or(i64::MAX));
            self.paused_until_ms = self.paused_until_ms.max(until);
        }
    }

    /// A send went through: creep back towards the configured rate.
    pub fn succeeded(&mut self, n: u32) {
        self.rate = (self.rate + self.limit * 0.01 * f64::from(n)).min(self.limit);
    }
}

/// A rate gate, local or shared between instances.
#[async_trait]
pub trait RateGate: Send + Sync + 'static {
    /// Takes one token, or says how long to wait for one.
    async fn try_take(&self, now_ms: i64) -> Result<(), Duration>;
    /// The provider behind the gate answered 429.
    async fn throttled(&self, now_ms: i64, retry_after: Option<Duration>);
    /// A send went through.
    async fn succeeded(&self);
    /// The current rate (for metrics and tests).
    fn current_rate(&self) -> f64;
    /// `try_take` for a request the store would serve anyway (the API's limits): a shared
    /// bucket the store cannot reach lets it through instead of refusing it.
    async fn try_admit(&self, now_ms: i64) -> Result<(), Duration> {
        self.try_take(now_ms).await
    }
    /// [`RateGate::try_admit`] of `n` tokens at once, all or none.
    async fn try_admit_n(&self, n: u32, now_ms: i64) -> Result<(), Duration>;
    /// How long until a token is there, when this instance knows the bucket is empty (without
    /// taking one, nor asking a shared store): a check made before any work is done.
    fn empty_for(&self, _now_ms: i64) -> Option<Duration> {
        None
    }
    /// About how many tokens are left after the last take, and how long until the bucket is
    /// full (the API's `RateLimit` header); shared gates know it as of their last read.
    fn remaining(&self, _now_ms: i64) -> (u32, Duration) {
        (0, Duration::ZERO)
    }
}

/// A bucket in this process (the embedded backend: one process is the whole system).
pub struct LocalGate {
    bucket: Mutex<TokenBucket>,
}

impl LocalGate {
    pub fn new(limit: f64, now_ms: i64) -> Self {
        Self::shaped(limit, PROVIDER_BURST_SHARE, now_ms)
    }
    pub fn shaped(limit: f64, burst_share: f64, now_ms: i64) -> Self {
        Self { bucket: Mutex::new(TokenBucket::shaped(limit, burst_share, now_ms)) }
    }
    fn with<T>(&self, f: impl FnOnce(&mut TokenBucket) -> T) -> T {
        f(&mut self.bucket.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

#[async_trait]
impl RateGate for LocalGate {
    async fn try_take(&self, now_ms: i64) -> Result<(), Duration> {
        self.with(|b| b.take(1, now_ms)).map(|_| ())
    }
    async fn throttled(&self, now_ms: i64, retry_after: Option<Duration>) {
        self.with(|b| b.throttled(now_ms, retry_after));
    }
    async fn succeeded(&self) {
        self.with(|b| b.succeeded(1));
    }
    fn current_rate(&self) -> f64 {
        self.with(|b| b.rate)
    }
    async fn try_admit_n(&self, n: u32, now_ms: i64) -> Result<(), Duration> {
        self.with(|b| b.take_exactly(n, now_ms))
    }
    fn empty_for(&self, now_ms: i64) -> Option<Duration> {
        self.with(|b| (b.available(now_ms) == 0).then(|| b.next_token_in(now_ms).max(Duration::from_millis(1))))
    }
    fn remaining(&self, now_ms: i64) -> (u32, Duration) {
        self.with(|b| (b.available(now_ms), b.until_full(now_ms)))
    }
}

/// A bucket shared by every instance, kept in the table (DynamoDB on AWS): an item written
/// back by a conditional update on its `version` (optimistic), taking a few tokens at a time
/// into a local allowance so that a send costs a small fraction of a request.
///
/// The item as this instance last wrote it is kept: the next write is tried from it, so an
/// uncontended take is one request (a conditional put), and only a lost race reads the item
/// again. An empty bucket says when its next token comes; until then takes are refused here,
/// without asking the store, since only time adds tokens.
pub struct SharedGate {
    table: std::sync::Arc<dyn Table>,
    key: Key,
    limit: f64,
    burst_share: f64,
    local: Mutex<Allowance>,
    /// One lease at a time per instance: concurrent takers wait for it and share what it
    /// brought, instead of racing each other on the item.
    leasing: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct Allowance {
    tokens: u32,
    successes: u32,
    rate: f64,
    /// The item's `version` and bucket as this instance last wrote them.
    last: Option<(i64, TokenBucket)>,
    /// Until then, another instance wrote the item after this one: read it before writing.
    contended_until_ms: i64,
    /// The bucket had no token before this.
    empty_until_ms: i64,
}

const BUCKET_ATTR: &str = "bucket";
const VERSION_ATTR: &str = "version";
/// An idle bucket's item expires (the table's TTL attribute): a bucket unused for this long
/// is full again, which is what a missing item means. Per-address buckets would otherwise pile up.
const IDLE_TTL_S: i64 = 86_400;
/// After a write from the kept item lost to another instance's, writes read first for this long.
const CONTENDED_MS: i64 = 10_000;

impl SharedGate {
    pub fn new(table: std::sync::Arc<dyn Table>, name: &str, limit: f64) -> Self {
        Self::shaped(table, name, limit, PROVIDER_BURST_SHARE)
    }

    pub fn shaped(table: std::sync::Arc<dyn Table>, name: &str, limit: f64, burst_share: f64) -> Self {
        Self {
            table,
            key: Key::new(format!("RATE#{name}"), "BUCKET"),
            limit,
            burst_share,
            local: Mutex::new(Allowance { rate: limit, ..Default::default() }),
            leasing: tokio::sync::Mutex::new(()),
        }
    }

    /// From the local allowance, if it has a token or knows the bucket is empty.
    fn take_local(&self, now_ms: i64) -> Option<Result<(), Duration>> {
        let mut local = self.lock();
        if local.tokens > 0 {
            local.tokens -= 1;
            return Some(Ok(()));
        }
        (now_ms < local.empty_until_ms).then(|| Err(Duration::from_millis((local.empty_until_ms - now_ms) as u64)))
    }

    /// Takes a token, leasing more from the shared bucket when the local allowance is out.
    async fn take(&self, now_ms: i64) -> Result<Result<(), Duration>, StoreError> {
        if let Some(local) = self.take_local(now_ms) {
            return Ok(local);
        }
        let _leasing = self.leasing.lock().await;
        // Another taker's lease may have come in meanwhile.
        if let Some(local) = self.take_local(now_ms) {
            return Ok(local);
        }
        let chunk = self.chunk();
        let successes = std::mem::take(&mut self.lock().successes);
        let taken = self
            .modify(now_ms, |b| {
                b.succeeded(successes);
                // The API's buckets lease (they promise a rate, not a strict window); providers'
                // take only what is there.
                let got = if self.burst_share >= 1.0 { b.lease(chunk, now_ms) } else { b.take(chunk, now_ms) };
                (got, b.next_token_in(now_ms))
            })
            .await?;
        let mut local = self.lock();
        Ok(match taken {
            (Ok(n), next) => {
                local.tokens += n - 1;
                // Emptied: the next take past these tokens need not ask before the next token.
                local.empty_until_ms = now_ms.saturating_add(i64::try_from(next.as_millis()).unwrap_or(i64::MAX));
                Ok(())
            }
            (Err(wait), _) => {
                local.empty_until_ms = now_ms.saturating_add(i64::try_from(wait.as_millis()).unwrap_or(i64::MAX));
                Err(wait)
            }
        })
    }

    /// Takes `n` tokens at once, all or none: from the local allowance when it holds them,
    /// else in one write of the shared bucket (a weighted request is one store request).
    async fn take_n(&self, n: u32, now_ms: i64) -> Result<Result<(), Duration>, StoreError> {
        let from_local = |local: &mut Allowance| {
            (local.tokens >= n).then(|| {
                local.tokens -= n;
            })
        };
        if from_local(&mut self.lock()).is_some() {
            return Ok(Ok(()));
        }
        let _leasing = self.leasing.lock().await;
        if from_local(&mut self.lock()).is_some() {
            return Ok(Ok(()));
        }
        let taken = self.modify(now_ms, |b| b.take_exactly(n, now_ms)).await?;
        if let Err(wait) = taken {
            let mut local = self.lock();
            if local.tokens == 0 {
                local.empty_until_ms = now_ms.saturating_add(i64::try_from(wait.as_millis()).unwrap_or(i64::MAX));
            }
        }
        Ok(taken)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Allowance> {
        self.local.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Tokens taken from the shared bucket at once: about 20 ms of sends, or a quarter of the
    /// burst where that is more (the API's buckets).
    fn chunk(&self) -> u32 {
        let burst = (self.limit * self.burst_share.min(1.0)).floor().max(1.0);
        ((self.limit / 50.0).max(burst / 4.0).floor() as u32).max(1)
    }

    /// Changes the bucket with `f` and writes it back if nobody else did meanwhile: from the
    /// last write of this instance first, else from a fresh read.
    async fn modify<T>(&self, now_ms: i64, f: impl Fn(&mut TokenBucket) -> T) -> Result<T, StoreError> {
        let mut known = {
            let mut local = self.lock();
            let last = local.last.take();
            if now_ms < local.contended_until_ms { None } else { last }
        };
        let mut from_cache = known.is_some();
        for _ in 0..10 {
            let (version, mut bucket) = match known.take() {
                Some((version, bucket)) => (Some(version), bucket),
                None => {
                    let item = self.table.get(&self.key).await?;
                    let version = item.as_ref().and_then(|i| i.i64(VERSION_ATTR));
                    let bucket: TokenBucket = item
                        .as_ref()
                        .and_then(|i| i.attrs.get(BUCKET_ATTR).cloned())
                        .and_then(|v| serde_json::from_value(v).ok())
                        .unwrap_or_else(|| TokenBucket::shaped(self.limit, self.burst_share, now_ms));
                    (version, bucket)
                }
            };
            // The configured rate may have changed since the item was written.
            bucket.limit = self.limit;
            bucket.rate = bucket.rate.min(self.limit);
            bucket.burst_share = self.burst_share;
            let out = f(&mut bucket);
            let value = serde_json::to_value(&bucket).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            let cond = match version {
                Some(v) => Cond::eq(VERSION_ATTR, v),
                None => Cond::NotExists,
            };
            let next = version.unwrap_or(0) + 1;
            let mut attrs = Attrs::new();
            attrs.insert(BUCKET_ATTR.into(), value);
            attrs.insert(VERSION_ATTR.into(), next.into());
            attrs.insert("ttl".into(), (now_ms / 1000 + IDLE_TTL_S).into());
            match self.table.put(Item::new(self.key.clone(), attrs), cond).await {
                Ok(()) => {
                    let mut local = self.lock();
                    local.rate = bucket.rate;
                    local.last = Some((next, bucket));
                    return Ok(out);
                }
                Err(StoreError::ConditionFailed { .. }) => {
                    if std::mem::take(&mut from_cache) {
                        self.lock().contended_until_ms = now_ms.saturating_add(CONTENDED_MS);
                    }
                    continue;
                }
                Err(e) => return Err(e),
            }
        }
        Err(StoreError::Conflict)
    }
}

#[async_trait]
impl RateGate for SharedGate {
    async fn try_take(&self, now_ms: i64) -> Result<(), Duration> {
        match self.take(now_ms).await {
            Ok(taken) => taken,
            // The store is busy: back off a little rather than send unmetered.
            Err(_) => Err(Duration::from_millis(50)),
        }
    }

    async fn try_admit(&self, now_ms: i64) -> Result<(), Duration> {
        match self.take(now_ms).await {
            Ok(taken) => taken,
            Err(e) => {
                tracing::warn!(error = %e, "rate bucket unreachable: the request goes through unmetered");
                Ok(())
            }
        }
    }

    async fn try_admit_n(&self, n: u32, now_ms: i64) -> Result<(), Duration> {
        if n <= 1 {
            return self.try_admit(now_ms).await;
        }
        match self.take_n(n, now_ms).await {
            Ok(taken) => taken,
            Err(e) => {
                tracing::warn!(error = %e, "rate bucket unreachable: the request goes through unmetered");
                Ok(())
            }
        }
    }

    fn empty_for(&self, now_ms: i64) -> Option<Duration> {
        let local = self.lock();
        (local.tokens == 0 && now_ms < local.empty_until_ms)
            .then(|| Duration::from_millis((local.empty_until_ms - now_ms) as u64))
    }

    async fn throttled(&self, now_ms: i64, retry_after: Option<Duration>) {
        self.lock().tokens = 0;
        if let Err(e) = self.modify(now_ms, |b| b.throttled(now_ms, retry_after)).await {
            tracing::warn!(error = %e, "could not slow the shared rate bucket down");
        }
    }

    async fn succeeded(&self) {
        self.lock().successes += 1;
    }

    fn current_rate(&self) -> f64 {
        self.lock().rate
    }

    fn remaining(&self, now_ms: i64) -> (u32, Duration) {
        let local = self.lock();
        let (shared, full) =
            local.last.as_ref().map_or((0, Duration::ZERO), |(_, b)| (b.available(now_ms), b.until_full(now_ms)));
        (local.tokens + shared, full)
    }
}

/// What a provider's bucket promises, measured: the most of `times_ms` (sorted, in
/// milliseconds) that fall in any window of one second. The gates' tests hold it to the rate.
pub fn most_in_any_second(times_ms: &[i64]) -> usize {
    let mut best = 0;
    let mut start = 0;
    for end in 0..times_ms.len() {
        while times_ms[end] - times_ms[start] >= 1000 {
            start += 1;
        }
        best = best.max(end - start + 1);
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn max_per_second(times: &[i64]) -> usize {
        most_in_any_second(times)
    }

    #[test]
    fn windows_of_one_second() {
        assert_eq!(max_per_second(&[]), 0);
        assert_eq!(max_per_second(&[0, 999]), 2);
        assert_eq!(max_per_second(&[0, 1000, 2000]), 1);
        assert_eq!(max_per_second(&[0, 10, 20, 1500, 1600, 1700, 1800]), 4);
    }

    #[test]
    fn never_more_than_the_rate_in_any_second() {
        for limit in [1.0, 7.0, 100.0, 1000.0] {
            let mut b = TokenBucket::new(limit, 0);
            let mut sends = Vec::new();
            // Greedy callers asking every millisecond for 10 seconds (a manual clock).
            for now in 0..10_000i64 {
                while b.take(1, now).is_ok() {
                    sends.push(now);
                }
            }
            let max = max_per_second(&sends);
            assert!(max as f64 <= limit, "limit {limit}: {max} in one second");
            // And it is not starved either: at least half the rate over the run.
            assert!(sends.len() as f64 >= limit * 10.0 * 0.5, "limit {limit}: only {} sends", sends.len());
        }
    }

    /// The API's buckets may hold more than a second's quota; a weighted take is all or none and
    /// says when all its tokens will be there.
    #[test]
    fn a_bucket_of_two_seconds_and_weighted_takes() {
        let mut b = TokenBucket::shaped(100.0, 2.0, 0);
        assert_eq!(b.burst(), 200.0);
        assert_eq!(b.available(0), 200);
        assert_eq!(b.take_exactly(150, 0), Ok(()));
        assert_eq!(b.take_exactly(100, 0), Err(Duration::from_millis(500)), "50 there, 50 more at 100/s");
        assert_eq!(b.available(0), 50, "a refused take takes nothing");
        assert_eq!(b.take_exactly(100, 500), Ok(()));
        // Refilled at the rate, up to the burst.
        assert_eq!(b.available(10_000), 200);
    }

    #[test]
    fn a_429_halves_the_rate_and_pauses_for_retry_after() {
        let mut b = TokenBucket::new(100.0, 0);
        b.throttled(0, Some(Duration::from_secs(3)));
        assert_eq!(b.rate, 50.0);
        assert_eq!(b.take(1, 2_999), Err(Duration::from_millis(1)));
        let mut sent = 0;
        for now in 3_000..4_000 {
            while b.take(1, now).is_ok() {
                sent += 1;
            }
        }
        assert!(sent <= 50, "slowed to 50/s, sent {sent}");
        b.succeeded(100);
        assert_eq!(b.rate, 100.0, "creeps back to the limit, never above");
    }
}
