//! End-to-end tests through the HTTP API, against a real `tidings serve` process, on both
//! backends: embedded, and AWS against the emulator (`AWS_ENDPOINT_URL`; `make test` starts
//! moto). The same test bodies run on both.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod notify;
mod server;

/// Declares each test once per backend.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod embedded {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() -> anyhow::Result<()> {
                    crate::notify::$name(crate::server::Backend::Embedded).await
                }
            )*
        }
        mod aws {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() -> anyhow::Result<()> {
                    crate::notify::$name(crate::server::Backend::Aws).await
                }
            )*
        }
    };
}

on_both_backends!(
    two_users_on_email_and_sms_get_exactly_four_sends,
    transient_failures_back_off_then_send_once,
    permanent_failure_is_not_retried,
    dead_letters_are_redriven_and_delivered_once,
    accepted_work_survives_kill_9,
    inapp_goes_to_the_inbox,
    bad_input_gets_problem_documents,
    tenants_are_isolated,
    missing_placeholder_fails_without_retry,
);
