//! Retry delays: exponential backoff with jitter, never sooner than a provider's Retry-After.

use std::time::Duration;

use rand::Rng;

/// The delay before attempt `attempt + 1`, after `attempt` failed attempts (1-based): a random
/// value in `[d/2, d]` where `d = min(cap, base * 2^(attempt-1))` ("equal jitter": spreads
/// retries out without ever retrying at once), then at least `retry_after`.
pub fn backoff(attempt: u32, base: Duration, cap: Duration, retry_after: Option<Duration>) -> Duration {
    let exp = attempt.saturating_sub(1).min(30);
    let d = base.saturating_mul(1u32 << exp).min(cap);
    let half = d / 2;
    let jitter_ms = rand::rng().random_range(0..=half.as_millis().min(u128::from(u64::MAX)) as u64);
    let delay = half + Duration::from_millis(jitter_ms);
    match retry_after {
        Some(ra) if ra > delay => ra.min(Duration::from_secs(12 * 3600)),
        _ => delay,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_and_is_capped() {
        let base = Duration::from_secs(10);
        let cap = Duration::from_secs(300);
        for _ in 0..100 {
            let d1 = backoff(1, base, cap, None);
            assert!(d1 >= Duration::from_secs(5) && d1 <= base, "{d1:?}");
            let d3 = backoff(3, base, cap, None);
            assert!(d3 >= Duration::from_secs(20) && d3 <= Duration::from_secs(40), "{d3:?}");
            let d20 = backoff(20, base, cap, None);
            assert!(d20 >= Duration::from_secs(150) && d20 <= cap, "{d20:?}");
        }
    }

    #[test]
    fn honours_retry_after() {
        let d = backoff(1, Duration::from_secs(1), Duration::from_secs(60), Some(Duration::from_secs(30)));
        assert_eq!(d, Duration::from_secs(30));
    }
}
