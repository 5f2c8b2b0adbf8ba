//! The `channel-worker` function: channel queues → the provider (SES, SNS), two-phase for transactional messages.
//! Failed messages get their backoff as visibility and are reported in `batchItemFailures`.

fn main() -> std::process::ExitCode {
    tidings_functions::channel_worker()
}
