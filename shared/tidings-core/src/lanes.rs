//! The system's queues as a type: each [`Lane`] knows its name, its dead-letter queue, the
//! function that consumes it and that function's batch size, as `template.yaml` deploys them
//! (`tests/e2e/lanes.rs` checks the template against this table). A queue's name is parsed once,
//! where a message comes in ([`Lane::from_name`]); nothing else matches queue names.

use crate::ids::TenantId;
use crate::notify::model::Priority;
use crate::ports::{Channel, OutMessage};

/// A channel queue's urgency: channel queues have two lanes, high and the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Urgency {
    High,
    Low,
}

impl Urgency {
    /// The channel lane of a notification's priority.
    pub fn of(priority: Priority) -> Self {
        match priority {
            Priority::High => Urgency::High,
            Priority::Normal | Priority::Low => Urgency::Low,
        }
    }
}

tokio::task_local! {
    static BULK: ();
}

/// Runs `work` as bulk work: what a low-priority queue's workers do (a campaign's pages and
/// sends). A store that serialises its writes (the embedded one's writer thread) lets every
/// other write (an API request, the relay, a high-priority queue's worker) go first, so an OTP
/// never waits behind a campaign's queued writes (docs/delivery.md, "Priorities"). On AWS it
/// changes nothing: each write is its own request.
pub async fn bulk<F: std::future::Future>(work: F) -> F::Output {
    BULK.scope((), work).await
}

/// Whether the current task runs bulk work ([`bulk`]).
pub fn is_bulk() -> bool {
    BULK.try_with(|_| ()).is_ok()
}

impl OutMessage {
    /// The message as the work of `tenant`: on a lane tenants share, taken in turn with the
    /// other tenants' (its fairness group; docs/delivery.md, "Fair lanes"). Here, not in the
    /// port, which knows no tenants.
    pub fn for_tenant(self, tenant: &TenantId) -> Self {
        self.in_group(Some(tenant.as_str().to_owned()))
    }
}

/// One queue of a deployment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    /// The relay's output, the orchestrator's input: which notification (page) to orchestrate.
    Requests(Priority),
    /// The orchestrator's rendered sends for the channel worker.
    Channel(Channel, Urgency),
    /// Short timers as queue delays, and fired durable timers (`crate::timers`).
    Timers,
    /// Stock events and restock rounds (`crate::restock`).
    StockEvents,
    /// Webhook events and their deliveries (`crate::webhooks`).
    Webhooks,
    /// Reconciliation findings, read by operators.
    InventoryReview,
    /// Change-stream records the relay could not handle, written by the stream's event source
    /// mapping and by the relay; read by operators (`tidings stream-failures`).
    StreamFailures,
    /// Scheduled invocations that failed, written by EventBridge Scheduler; read by operators.
    ScheduleFailures,
}

/// The functions of `template.yaml` that consume lanes, by binary name.
pub const ORCHESTRATOR: &str = "orchestrator";
pub const CHANNEL_WORKER: &str = "channel-worker";
pub const TICK: &str = "tick";
pub const RESTOCK_SCAN: &str = "restock-scan";

impl Lane {
    /// The queues a deployment declares and its code sends to (the failure queues, written by
    /// the platform, are [`Lane::FAILURES`]).
    pub const ALL: [Lane; 13] = [
        Lane::Requests(Priority::High),
        Lane::Requests(Priority::Normal),
        Lane::Requests(Priority::Low),
        Lane::Channel(Channel::Email, Urgency::High),
        Lane::Channel(Channel::Email, Urgency::Low),
        Lane::Channel(Channel::Sms, Urgency::High),
        Lane::Channel(Channel::Sms, Urgency::Low),
        Lane::Channel(Channel::Push, Urgency::High),
        Lane::Channel(Channel::Push, Urgency::Low),
        Lane::Timers,
        Lane::InventoryReview,
        Lane::StockEvents,
        Lane::Webhooks,
    ];

    /// The queues the platform parks failures on.
    pub const FAILURES: [Lane; 2] = [Lane::StreamFailures, Lane::ScheduleFailures];

    /// The request lane of a notification's priority.
    pub fn requests(priority: Priority) -> Self {
        Lane::Requests(priority)
    }

    /// The channel lane a send of this channel and priority goes to.
    pub fn channel(channel: Channel, priority: Priority) -> Self {
        Lane::Channel(channel, Urgency::of(priority))
    }

    /// The logical name (the physical one is the deployment's prefix and this).
    pub const fn name(self) -> &'static str {
        match self {
            Lane::Requests(Priority::High) => "requests-high",
            Lane::Requests(Priority::Normal) => "requests-normal",
            Lane::Requests(Priority::Low) => "requests-low",
            Lane::Channel(Channel::Email, Urgency::High) => "email-high",
            Lane::Channel(Channel::Email, Urgency::Low) => "email-low",
            Lane::Channel(Channel::Sms, Urgency::High) => "sms-high",
            Lane::Channel(Channel::Sms, Urgency::Low) => "sms-low",
            Lane::Channel(Channel::Push, Urgency::High) => "push-high",
            Lane::Channel(Channel::Push, Urgency::Low) => "push-low",
            // The in-app channel has no provider and no queue: the orchestrator writes it.
            Lane::Channel(Channel::Inapp, Urgency::High) => "inapp-high",
            Lane::Channel(Channel::Inapp, Urgency::Low) => "inapp-low",
            Lane::Timers => "timers",
            Lane::StockEvents => "stock-events",
            Lane::Webhooks => "webhooks",
            Lane::InventoryReview => "inventory-review",
            Lane::StreamFailures => "stream-failures",
            Lane::ScheduleFailures => "schedule-failures",
        }
    }

    /// The lane of a logical queue name, if it is one.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().chain(Self::FAILURES).find(|l| l.name() == name)
    }

    /// The physical name under a deployment's prefix (`tidings-` + `email-high`).
    pub fn physical(self, prefix: &str) -> String {
        format!("{prefix}{}", self.name())
    }

    /// The function that consumes it; `None`: read by operators, not by code.
    pub fn consumer(self) -> Option<&'static str> {
        match self {
            Lane::Requests(_) => Some(ORCHESTRATOR),
            Lane::Channel(..) | Lane::Webhooks => Some(CHANNEL_WORKER),
            Lane::Timers => Some(TICK),
            Lane::StockEvents => Some(RESTOCK_SCAN),
            Lane::InventoryReview | Lane::StreamFailures | Lane::ScheduleFailures => None,
        }
    }

    /// Whether a function consumes it.
    pub fn is_consumed(self) -> bool {
        self.consumer().is_some()
    }

    /// Its dead-letter queue's logical name: only a consumed lane has one (nothing
    /// dead-letters from a queue nobody receives from).
    pub fn dlq(self) -> Option<String> {
        self.is_consumed().then(|| format!("{}-dlq", self.name()))
    }

    /// The batch size of its event source mapping: 100 for the low channel lanes, where a
    /// campaign's sends are (the local runtime's `TIDINGS_BATCH_LOW` may change it), 5 for
    /// webhooks (each attempt is a POST that may take its timeout), 10 elsewhere (a
    /// transactional message is not held back to fill a batch). `None` when nothing consumes it.
    pub fn batch_size(self) -> Option<usize> {
        match self {
            Lane::Channel(_, Urgency::Low) => Some(100),
            Lane::Webhooks => Some(5),
            lane if lane.is_consumed() => Some(10),
            _ => None,
        }
    }

    /// Whether it carries high-priority work (run on the local runtime's own pool).
    pub fn is_high(self) -> bool {
        matches!(self, Lane::Requests(Priority::High) | Lane::Channel(_, Urgency::High))
    }
}

impl std::fmt::Display for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// [`Lane::ALL`] by name.
pub const ALL_QUEUES: &[&str] = &{
    let mut names = [""; Lane::ALL.len()];
    let mut i = 0;
    while i < names.len() {
        names[i] = Lane::ALL[i].name();
        i += 1;
    }
    names
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_lane_parses_back_from_its_name() {
        for lane in Lane::ALL.into_iter().chain(Lane::FAILURES) {
            assert_eq!(Lane::from_name(lane.name()), Some(lane));
        }
        assert_eq!(Lane::from_name("email-high-dlq"), None);
        assert_eq!(Lane::from_name("inapp-high"), None);
        assert_eq!(Lane::from_name("emails-high"), None);
    }

    #[test]
    fn the_named_queues_are_lanes() {
        assert_eq!(crate::notify::relay::STREAM_FAILURES_QUEUE, Lane::StreamFailures.name());
        assert_eq!(crate::inventory::REVIEW_QUEUE, Lane::InventoryReview.name());
        assert_eq!(crate::timers::TIMERS_QUEUE, Lane::Timers.name());
        assert_eq!(crate::restock::STOCK_EVENTS_QUEUE, Lane::StockEvents.name());
        assert_eq!(crate::webhooks::WEBHOOKS_QUEUE, Lane::Webhooks.name());
        assert_eq!(Lane::channel(Channel::Sms, Priority::Normal).name(), "sms-low");
        assert_eq!(Lane::channel(Channel::Sms, Priority::High).name(), "sms-high");
    }
}
