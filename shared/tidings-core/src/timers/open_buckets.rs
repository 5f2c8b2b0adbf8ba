//! The timer buckets an instance saw open ([`OpenBuckets`]), apart from [`super::task`] so that
//! [`crate::deps::Deps`] can hold them without importing what schedules timers.

/// The timer buckets an instance saw open (their index entry read or written), and when by the
/// deps' clock. Sound because a bucket is only ever picked while it is at least
/// [`super::task::WRITE_AHEAD_MINUTES`] ahead and ticks fire it from 1 minute before (the doc of
/// [`crate::timers`]): a bucket picked now and seen open earlier has not been fired since by
/// another instance. One this instance fires is forgotten, and a clock gone back since a bucket
/// was seen reads it again. Holds at most [`OPEN_BUCKETS_HELD`]; when full, forgets all.
#[derive(Default)]
pub struct OpenBuckets {
    seen: std::sync::Mutex<std::collections::HashMap<String, i64>>,
}

/// The most buckets an instance remembers (one per minute of holds in use).
const OPEN_BUCKETS_HELD: usize = 64;

impl OpenBuckets {
    /// Whether `bucket` was seen open at or before `now_ms`.
    pub(crate) fn holds(&self, bucket: &str, now_ms: i64) -> bool {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.get(bucket).is_some_and(|&at| at <= now_ms)
    }

    /// Forgets `bucket` (this instance fires it).
    pub(crate) fn forget(&self, bucket: &str) {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).remove(bucket);
    }

    pub(crate) fn saw(&self, bucket: &str, now_ms: i64) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.len() >= OPEN_BUCKETS_HELD && !seen.contains_key(bucket) {
            seen.clear();
        }
        seen.insert(bucket.to_owned(), now_ms);
    }
}
