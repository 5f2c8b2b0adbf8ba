//! Token buckets: the rate gates in front of providers, per provider and per tenant.
//!
//! A bucket of capacity `burst` refilled at `rate - burst` per second lets through at most
//! `rate` sends in any window of one second (`burst + refill · 1 s`), spread out rather than
//! in one block (seed 004 §5.5: "均匀摊到发送窗口里").
//!
//! AIMD on 429: the rate halves (never below 1/s) and the bucket pauses for the provider's
//! `Retry-After`; each accepted send adds back 1% of the configured rate. The number of workers
//! never changes: fewer tokens, not more callers (seed 003: "最危险的反应是继续扩容 Worker").

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
}

/// 429s within this long of a decrease are answers to sends made before it: one congestion
/// event halves the rate once, not once per call that was already on its way.
const DECREASE_EVERY_MS: i64 = 1000;

impl TokenBucket {
    pub fn new(limit: f64, now_ms: i64) -> Self {
        let limit = limit.max(0.001);
        let mut b =
            Self { limit, rate: limit, tokens: 0.0, last_ms: now_ms, paused_until_ms: 0, decreased_ms: i64::MIN };
        b.tokens = b.burst();
        b
    }

    /// The bucket's capacity: 5% of the current rate, at least one token.
    pub fn burst(&self) -> f64 {
        (self.rate * 0.05).max(1.0).floor()
    }

    /// Tokens per second added, so that burst + refill ≤ rate over one second.
    fn refill_rate(&self) -> f64 {
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
}

/// A bucket in this process (the embedded backend: one process is the whole system).
pub struct LocalGate {
    bucket: Mutex<TokenBucket>,
}

impl LocalGate {
    pub fn new(limit: f64, now_ms: i64) -> Self {
        Self { bucket: Mutex::new(TokenBucket::new(limit, now_ms)) }
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
}

/// A bucket shared by every instance, kept in the table (DynamoDB on AWS): an item read and
/// written back by a conditional update on its `version` (optimistic), taking a few tokens at
/// a time into a local allowance so that a send costs a small fraction of a request.
pub struct SharedGate {
    table: std::sync::Arc<dyn Table>,
    key: Key,
    limit: f64,
    local: Mutex<Allowance>,
}

#[derive(Default)]
struct Allowance {
    tokens: u32,
    successes: u32,
    rate: f64,
}

const BUCKET_ATTR: &str = "bucket";
const VERSION_ATTR: &str = "version";

impl SharedGate {
    pub fn new(table: std::sync::Arc<dyn Table>, name: &str, limit: f64) -> Self {
        Self {
            table,
            key: Key::new(format!("RATE#{name}"), "BUCKET"),
            limit,
            local: Mutex::new(Allowance { tokens: 0, successes: 0, rate: limit }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Allowance> {
        self.local.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads the bucket, changes it with `f`, writes it back if nobody else did meanwhile.
    async fn modify<T>(&self, now_ms: i64, f: impl Fn(&mut TokenBucket) -> T) -> Result<T, StoreError> {
        for _ in 0..10 {
            let item = self.table.get(&self.key).await?;
            let version = item.as_ref().and_then(|i| i.i64(VERSION_ATTR));
            let mut bucket: TokenBucket = item
                .as_ref()
                .and_then(|i| i.attrs.get(BUCKET_ATTR).cloned())
                .and_then(|v| serde_json::from_value(v).ok())
                .unwrap_or_else(|| TokenBucket::new(self.limit, now_ms));
            // The configured rate may have changed since the item was written.
            bucket.limit = self.limit;
            bucket.rate = bucket.rate.min(self.limit);
            let out = f(&mut bucket);
            let value = serde_json::to_value(&bucket).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            let cond = match version {
                Some(v) => Cond::eq(VERSION_ATTR, v),
                None => Cond::NotExists,
            };
            let mut attrs = Attrs::new();
            attrs.insert(BUCKET_ATTR.into(), value);
            attrs.insert(VERSION_ATTR.into(), (version.unwrap_or(0) + 1).into());
            match self.table.put(Item::new(self.key.clone(), attrs), cond).await {
                Ok(()) => {
                    self.lock().rate = bucket.rate;
                    return Ok(out);
                }
                Err(StoreError::ConditionFailed { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(StoreError::Conflict)
    }
}

#[async_trait]
impl RateGate for SharedGate {
    async fn try_take(&self, now_ms: i64) -> Result<(), Duration> {
        {
            let mut local = self.lock();
            if local.tokens > 0 {
                local.tokens -= 1;
                return Ok(());
            }
        }
        // About 20 ms of sends per read of the shared item.
        let chunk = ((self.limit / 50.0).floor() as u32).max(1);
        let successes = std::mem::take(&mut self.lock().successes);
        let taken = self
            .modify(now_ms, |b| {
                b.succeeded(successes);
                b.take(chunk, now_ms)
            })
            .await;
        match taken {
            Ok(Ok(n)) => {
                self.lock().tokens += n - 1;
                Ok(())
            }
            Ok(Err(wait)) => Err(wait),
            // The store is busy: back off a little rather than send unmetered.
            Err(_) => Err(Duration::from_millis(50)),
        }
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every send time, the most sends in any window of one second.
    fn max_per_second(times: &[i64]) -> usize {
        let mut best = 0;
        let mut start = 0;
        for end in 0..times.len() {
            while times[end] - times[start] >= 1000 {
                start += 1;
            }
            best = best.max(end - start + 1);
        }
        best
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
