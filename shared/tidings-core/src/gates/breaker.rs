//! A circuit breaker per provider: calls pause while its error ratio is over a threshold
//! (docs/gates.md, "Circuit breaker").
//!
//! Closed: calls pass; outcomes of the last `window` are kept. When at least `min_calls` ended
//! and the share of transient failures (5xx, timeouts, 429) reaches `error_ratio`, it opens.
//! Open: calls are refused for `open_for`. Then half-open: up to `probes` calls pass; if they
//! all succeed it closes, a failure opens it again. Permanent errors (a bad address) are the
//! recipient's fault, not the provider's: they count as successes.

use std::collections::VecDeque;
use std::time::Duration;

#[derive(Clone, Debug, PartialEq)]
pub struct BreakerConfig {
    pub window: Duration,
    pub min_calls: u32,
    pub error_ratio: f64,
    pub open_for: Duration,
    pub probes: u32,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(10),
            min_calls: 20,
            error_ratio: 0.5,
            open_for: Duration::from_secs(30),
            probes: 3,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    Open { until_ms: i64 },
    HalfOpen { started: u32, succeeded: u32 },
}

#[derive(Clone, Debug)]
pub struct Breaker {
    config: BreakerConfig,
    state: BreakerState,
    /// Recent calls in slots of a twentieth of the window: `(slot, calls, failures)`, oldest
    /// first, with their sums below (constant work and memory per call, whatever the rate).
    outcomes: VecDeque<(i64, u32, u32)>,
    calls: u32,
    failures: u32,
}

/// Slots per window.
const SLOTS: i64 = 20;

impl Breaker {
    pub fn new(config: BreakerConfig) -> Self {
        Self { config, state: BreakerState::Closed, outcomes: VecDeque::new(), calls: 0, failures: 0 }
    }

    pub fn state(&self) -> &BreakerState {
        &self.state
    }

    /// Whether a call may go now (a half-open breaker lets a few probes through).
    pub fn allow(&mut self, now_ms: i64) -> bool {
        match self.state {
            BreakerState::Closed => true,
            BreakerState::Open { until_ms } if now_ms < until_ms => false,
            BreakerState::Open { .. } => {
                self.state = BreakerState::HalfOpen { started: 1, succeeded: 0 };
                true
            }
            BreakerState::HalfOpen { started, succeeded } => {
                if started < self.config.probes {
                    self.state = BreakerState::HalfOpen { started: started + 1, succeeded };
                    true
                } else {
                    false
                }
            }
        }
    }

    /// How long an open breaker stays open (zero otherwise).
    pub fn open_for(&self, now_ms: i64) -> Duration {
        match self.state {
            BreakerState::Open { until_ms } if until_ms > now_ms => Duration::from_millis((until_ms - now_ms) as u64),
            _ => Duration::ZERO,
        }
    }

    fn open(&mut self, now_ms: i64) {
        let until_ms = now_ms.saturating_add(i64::try_from(self.config.open_for.as_millis()).unwrap_or(i64::MAX));
        self.state = BreakerState::Open { until_ms };
        self.forget();
    }

    fn forget(&mut self) {
        self.outcomes.clear();
        self.calls = 0;
        self.failures = 0;
    }

    /// Records how an allowed call ended.
    pub fn record(&mut self, now_ms: i64, failed: bool) {
        match self.state {
            BreakerState::HalfOpen { started, succeeded } => {
                if failed {
                    self.open(now_ms);
                } else if succeeded + 1 >= self.config.probes {
                    self.state = BreakerState::Closed;
                    self.forget();
                } else {
                    self.state = BreakerState::HalfOpen { started, succeeded: succeeded + 1 };
                }
            }
            // A call that started before the breaker opened: nothing to learn.
            BreakerState::Open { .. } => {}
            BreakerState::Closed => {
                let window = i64::try_from(self.config.window.as_millis()).unwrap_or(i64::MAX).max(SLOTS);
                let slot = now_ms.div_euclid(window / SLOTS);
                match self.outcomes.back_mut() {
                    Some((s, calls, failures)) if *s == slot => {
                        *calls += 1;
                        *failures += u32::from(failed);
                    }
                    _ => self.outcomes.push_back((slot, 1, u32::from(failed))),
                }
                self.calls += 1;
                self.failures += u32::from(failed);
                while let Some(&(s, calls, failures)) = self.outcomes.front() {
                    if slot - s < SLOTS {
                        break;
                    }
                    self.outcomes.pop_front();
                    self.calls -= calls;
                    self.failures -= failures;
                }
                if self.calls >= self.config.min_calls
                    && f64::from(self.failures) / f64::from(self.calls) >= self.config.error_ratio
                {
                    self.open(now_ms);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_on_error_rate_then_probes_then_closes() {
        let mut b = Breaker::new(BreakerConfig { min_calls: 10, ..BreakerConfig::default() });
        for i in 0..9 {
            assert!(b.allow(i));
            b.record(i, true);
        }
        assert_eq!(b.state(), &BreakerState::Closed, "not before min_calls");
        assert!(b.allow(9));
        b.record(9, true);
        assert!(matches!(b.state(), BreakerState::Open { .. }));
        assert!(!b.allow(10_000));
        // After open_for (30 s): three probes, no more.
        assert!(b.allow(40_000));
        assert!(b.allow(40_001));
        assert!(b.allow(40_002));
        assert!(!b.allow(40_003));
        for i in 0..3 {
            b.record(40_010 + i, false);
        }
        assert_eq!(b.state(), &BreakerState::Closed);
    }

    #[test]
    fn a_failed_probe_opens_again() {
        let mut b = Breaker::new(BreakerConfig { min_calls: 1, ..BreakerConfig::default() });
        b.record(0, true);
        assert!(b.allow(31_000));
        b.record(31_001, true);
        assert!(!b.allow(31_002));
    }
}
