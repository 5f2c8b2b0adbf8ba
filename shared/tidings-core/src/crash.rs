//! Named crash points for fault-injection tests: the process aborts (as `kill -9` would end it:
//! no unwinding, no cleanup) at a named step when the test asks for it with
//! `TIDINGS_CRASH_AT=name[:n]` (abort at the n-th time the point is reached; default 1).
//!
//! Compiled in only with the `crash-points` feature, which only the test build of `tidings`
//! enables; in any other build `point` is an empty inline function.
//!
//! | point | where |
//! |---|---|
//! | `worker.before_provider` | a delivery is claimed; the provider has not been called |
//! | `worker.after_provider` | the provider accepted; `sent` is not written yet |
//! | `worker.after_sent` | `sent` is written; the queue message is not deleted yet |
//! | `relay.after_send` | request messages are queued; the stream position is not committed |
//! | `orchestrator.mid_fanout` | some deliveries of a notification are created, not all |
//! | `inventory.after_commit` | a reservation's transaction committed; no answer sent yet |
//! | `workflow.run_created` | a workflow run is created (or read again); none of its steps ran |
//! | `workflow.send_planned` | a workflow send's delivery is written and queued; the run is not |
//! | `workflow.digest_entered` | a trigger is in its digest window; its run is not written |
//! | `workflow.digest_closed` | a digest window is closed; its events are not read, its run not written |

/// Arms the crash point `spec` names (`TIDINGS_CRASH_AT`, which the process's edge passes
/// once at start); without the `crash-points` feature, nothing.
pub fn arm(spec: Option<&str>) {
    #[cfg(feature = "crash-points")]
    imp::arm(spec);
    #[cfg(not(feature = "crash-points"))]
    let _ = spec;
}

/// Reached a named step: aborts here if a test asked for it.
#[inline]
pub fn point(name: &'static str) {
    #[cfg(feature = "crash-points")]
    imp::hit(name);
    #[cfg(not(feature = "crash-points"))]
    let _ = name;
}

#[cfg(feature = "crash-points")]
mod imp {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU32, Ordering};

    static TARGET: OnceLock<Option<(String, u32)>> = OnceLock::new();
    static HITS: AtomicU32 = AtomicU32::new(0);

    pub fn arm(spec: Option<&str>) {
        let target = spec.map(|spec| match spec.split_once(':') {
            Some((name, n)) => (name.to_owned(), n.parse::<u32>().unwrap_or(1).max(1)),
            None => (spec.to_owned(), 1),
        });
        let _ = TARGET.set(target);
    }

    pub fn hit(name: &'static str) {
        if let Some(Some((target, n))) = TARGET.get()
            && target == name
            && HITS.fetch_add(1, Ordering::SeqCst) + 1 >= *n
        {
            eprintln!("crash point {name}: aborting");
            std::process::abort();
        }
    }
}
