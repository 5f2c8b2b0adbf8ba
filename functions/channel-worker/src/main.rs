//! The `channel-worker` function: channel queues → the provider (SES, SNS), two-phase for transactional messages;
//! and the webhooks queue → the tenants' endpoints.
//! Failed messages get their backoff as visibility and are reported in `batchItemFailures`.

use tidings_functions::lanes::{Channel, Lane, Urgency};

/// Each external channel's two lanes, and the webhooks.
const LANES: [Lane; 7] = [
    Lane::Channel(Channel::Email, Urgency::High),
    Lane::Channel(Channel::Email, Urgency::Low),
    Lane::Channel(Channel::Sms, Urgency::High),
    Lane::Channel(Channel::Sms, Urgency::Low),
    Lane::Channel(Channel::Push, Urgency::High),
    Lane::Channel(Channel::Push, Urgency::Low),
    Lane::Webhooks,
];

fn main() -> std::process::ExitCode {
    tidings_functions::channel_worker(&LANES)
}
