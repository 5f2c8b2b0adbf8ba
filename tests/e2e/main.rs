//! End-to-end tests through the HTTP API, against a real `tidings serve` process, on both
//! backends: embedded, and AWS against the emulators (`make test` starts moto for SQS, SNS and
//! SES, `AWS_ENDPOINT_URL`, and DynamoDB Local for DynamoDB, `AWS_ENDPOINT_URL_DYNAMODB`). The
//! same test bodies run on both.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod alarms;
mod backorders;
mod bench;
mod bootstraps;
mod campaign;
mod cancel;
mod console;
mod contention;
mod contract;
mod crash;
mod dashboard;
mod email_parts;
mod figures;
mod gates;
mod import;
mod inventory;
mod isolation;
mod lambda;
mod lanes;
mod limits;
mod live;
mod locations;
mod notify;
mod platform;
mod progress;
mod rates_shipped;
mod receipts_shipped;
mod relay_limits;
mod resources;
mod restock;
mod safety;
mod server;
mod settings_shipped;
mod shipped;
mod site;
mod site_browser;
mod sizes;
mod sms_failover;
mod sms_shipped;
mod store_retries;
mod webhooks;
mod workflows;

/// Declares each test once per backend: `on_both_backends!(module as module_tests: test, ...)`
/// makes `module_tests::embedded::test` and `module_tests::aws::test` from `module::test`.
macro_rules! on_both_backends {
    ($group:ident as $tests:ident: $($name:ident),* $(,)?) => {
        mod $tests {
            mod embedded {
                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $name() -> anyhow::Result<()> {
                        crate::$group::$name(crate::server::Backend::Embedded).await
                    }
                )*
            }
            mod aws {
                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $name() -> anyhow::Result<()> {
                        crate::$group::$name(crate::server::Backend::Aws).await
                    }
                )*
            }
        }
    };
}

on_both_backends!(resources as resources_tests: lists_erase_and_preview);

on_both_backends!(contract as contract_tests: every_answer_is_a_documented_status);

on_both_backends!(cancel as cancel_tests:
    a_cancelled_campaign_sends_nothing_after_the_answer,
    cancelling_a_sent_notification_is_409_and_a_partly_sent_one_stops,
    a_subscription_cancelled_in_the_merge_window_is_not_notified,
    an_unknown_sku_is_404_and_preferences_stamps_are_times,
);

on_both_backends!(notify as notify_tests:
    two_users_on_email_and_sms_get_exactly_four_sends,
    transient_failures_back_off_then_send_once,
    permanent_failure_is_not_retried,
    dead_letters_are_redriven_and_delivered_once,
    accepted_work_survives_kill_9,
    inapp_goes_to_the_inbox,
    bad_input_gets_problem_documents,
    tenants_are_isolated,
    a_send_that_cannot_work_is_refused_at_accept,
    a_recipients_missing_attribute_fails_that_delivery_naming_it,
    a_notification_reads_how_it_ended,
    provider_fault_matrix_loses_nothing_and_never_retries_permanent_errors,
);

on_both_backends!(live as live_tests:
    live_feed_reaches_every_connection_of_the_user_only,
    forged_or_missing_tokens_are_refused,
    expired_tokens_are_refused,
);

on_both_backends!(console as console_tests: console_shows_the_system_and_redrives);

on_both_backends!(site_browser as site_browser_tests: the_shop_site_shows_both_elements_from_another_origin);

on_both_backends!(figures as figures_tests: a_backlog_shows_its_oldest_age_growing_then_falling_and_every_figure);

on_both_backends!(email_parts as email_parts_tests:
    an_email_has_a_text_part_without_markup_and_an_html_part_with_the_pixel,
);

on_both_backends!(sizes as sizes_tests:
    a_page_of_large_emails_is_delivered_in_full,
    oversized_params_and_bodies_answer_422_naming_the_field,
);

on_both_backends!(campaign as campaign_tests:
    a_segment_campaign_reaches_each_member_once_and_an_otp_is_not_held_up,
    a_neighbours_bulk_asking_high_does_not_hold_the_otps,
);

/// Campaigns through the function binaries, their AWS cost per delivery counted and held to a
/// budget (the embedded backend has no requests to count; its figures are `tidings bench
/// campaign`'s). 2,000 members for the table of docs/performance.md: TIDINGS_E2E_CAMPAIGN_MEMBERS=2000.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn campaign_of_two_thousand_through_the_function_binaries_within_the_cost_budget() -> anyhow::Result<()> {
    shipped::campaigns_through_the_function_binaries_within_their_cost_budgets().await
}

on_both_backends!(platform as platform_tests:
    quiet_hours_defer_marketing_but_not_transactional,
    frequency_cap_suppresses_the_fourth_marketing_message,
    opted_out_users_get_nothing_and_one_click_unsubscribe_works,
    scheduled_send_fires_at_send_at_and_cancel_stops_it,
    a_manual_clock_keeps_its_time_across_kill_9,
    push_reaches_every_device_and_a_dead_token_is_deleted,
    forged_sns_callback_is_rejected_and_a_genuine_bounce_suppresses,
    a_push_service_event_deletes_the_dead_device,
    sms_pumping_guard_limits_a_number_and_keeps_to_allowed_countries,
    requester_limits_refuse_the_third_otp_from_one_ip,
    verification_ratio_counts_codes_nobody_used,
);

#[tokio::test]
async fn a_malformed_sms_guard_setting_refuses_to_start() -> anyhow::Result<()> {
    platform::a_malformed_sms_guard_setting_refuses_to_start().await
}

on_both_backends!(crash as crash_tests:
    transactional_crash_after_provider_loses_nothing_and_duplicates_at_most_once_per_crash,
    transactional_crash_before_provider_sends_each_exactly_once,
    crash_after_sent_before_delete_sends_each_exactly_once,
    marketing_crash_after_provider_never_duplicates,
    relay_crash_before_commit_loses_nothing_and_absorbs_repeats,
    fanout_crash_midway_loses_nothing_and_absorbs_repeats,
    reservation_crash_after_commit_holds_once,
    workflow_steps_cut_off_at_each_point_send_one_digest,
);

on_both_backends!(restock as restock_tests: event_and_scan_race_send_one_merged_message, bad_input_retries_manual_and_resend, retries_come_1_5_and_30_minutes_after_each_failure, analytics_count_orders_within_seven_days_of_the_notice);

on_both_backends!(gates as gates_tests:
    marketing_emails_at_five_a_second_are_all_sent,
    a_429_with_retry_after_holds_the_provider_for_its_tenant,
);

on_both_backends!(inventory as inventory_tests:
    concurrent_orders_never_oversell_plain_and_sharded,
    pay_cancel_and_expiry_race_and_release_once,
    short_multi_sku_order_holds_nothing,
    an_expired_hold_is_released_and_its_waiters_are_alerted,
    a_finding_is_queued_once_and_settled_by_an_operator,
    incoming_stock_is_shown_told_once_and_closed_by_its_arrival,
);

on_both_backends!(backorders as backorders_tests: a_backorder_is_filled_before_the_alert_goes_out_for_the_same_units);

on_both_backends!(locations as locations_tests:
    concurrent_orders_over_three_locations_never_oversell_a_location,
    a_split_order_is_held_whole_or_not_at_all_and_settles_its_cells,
    reconciliation_finds_a_discrepancy_at_one_location_only,
    an_order_too_large_for_one_transaction_is_422_naming_items,
    stock_where_a_market_is_not_served_alerts_nobody_in_it,
);

on_both_backends!(safety as safety_tests:
    an_unsubscribed_user_still_gets_the_password_reset,
    a_hostile_template_is_refused_and_cannot_harm_another_tenant,
    contacts_are_real_addresses_and_sms_countries_come_from_the_number,
    clicks_redirect_only_to_the_shops_hosts,
);

on_both_backends!(limits as limits_tests:
    one_tenant_over_its_rate_is_refused_while_another_tenants_otps_are_sent,
    a_public_route_flood_from_one_address_is_refused_and_the_api_is_not,
    dev_routes_need_a_key_or_dev_and_do_not_exist_on_aws_without_it,
);

#[tokio::test]
async fn aws_dev_against_a_remote_endpoint_refuses_to_start() -> anyhow::Result<()> {
    limits::aws_dev_against_a_remote_endpoint_refuses_to_start().await
}

on_both_backends!(site as site_tests:
    a_user_token_reaches_its_users_inbox_and_the_changes_are_live,
    a_user_token_reaches_nothing_else,
    my_preferences_show_the_workflows_and_lock_required_ones,
    cors_answers_only_the_tenants_origins_on_the_user_routes,
    the_hosted_preferences_page_renders_saves_and_refuses_forged_links,
);

on_both_backends!(isolation as isolation_tests: no_route_shows_or_changes_another_tenants_data);

on_both_backends!(sms_failover as sms_failover_tests: sms_fails_over_to_the_second_provider_and_back);

/// End User Messaging as the SMS primary through the function binaries, with the template's
/// environment and policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn end_user_messaging_as_the_sms_primary_through_the_function_binaries() -> anyhow::Result<()> {
    sms_shipped::end_user_messaging_as_the_primary_through_the_function_binaries().await
}

on_both_backends!(webhooks as webhooks_tests:
    subscribed_events_arrive_once_signed_and_only_to_their_subscribers,
    a_failing_receiver_is_retried_dead_lettered_and_redriven_once,
    each_endpoint_is_posted_to_at_its_own_rate_and_loses_nothing,
    a_campaigns_end_is_posted_once,
);

on_both_backends!(workflows as workflows_tests:
    many_triggers_in_one_instant_make_one_digest,
    a_delay_then_a_digest_make_one_digest,
    two_digest_steps_each_digest,
    fallback_goes_from_push_to_sms_to_email_only_when_needed,
    an_email_only_when_the_inapp_message_was_not_read,
    preferences_per_workflow_and_required,
    definitions_are_checked_and_runs_keep_their_version,
    a_throttle_lets_its_limit_through,
    an_hour_long_delay_waits_for_the_clock,
    a_fallback_waits_for_until_then_takes_the_next_channel,
    a_cancelled_digest_leader_does_not_swallow_later_triggers,
    a_branch_takes_then_or_else_and_goes_on_after_it,
    a_one_channel_send_that_fails_later_is_the_deliverys_failure_not_the_runs,
);

/// A webhook posted through the function binaries, each under its template policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_webhook_through_the_function_binaries() -> anyhow::Result<()> {
    webhooks::a_webhook_through_the_function_binaries().await
}

on_both_backends!(contention as contention_tests:
    concurrent_otp_accepts_on_one_template_are_all_accepted,
    concurrent_otps_against_the_limits_get_exactly_the_limit_through,
);

/// A page of ten 110 KB emails through the function binaries is delivered in full.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_page_of_large_emails_through_the_function_binaries() -> anyhow::Result<()> {
    sizes::a_page_of_large_emails_through_the_function_binaries().await
}

/// Every bootstrap `sam build` makes is built for size, unwinds on a panic and links one crypto
/// library.
#[test]
fn the_bootstraps_are_built_for_size_and_unwind() -> anyhow::Result<()> {
    bootstraps::the_bootstraps_are_built_for_size_and_unwind()
}

/// A day of a shop through the binaries `sam build` makes, each under a Lambda Runtime API with
/// the environment and IAM policy `template.yaml` gives it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_day_of_a_shop_through_the_function_binaries() -> anyhow::Result<()> {
    shipped::a_day_of_a_shop_through_the_function_binaries().await
}

/// Workflows through the function binaries: a digest whose window is a durable timer that
/// `tick` fires, a channel fallback, and the runs and the notification as they wait and end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workflows_through_the_function_binaries() -> anyhow::Result<()> {
    shipped::workflows_through_the_function_binaries().await
}

/// The shop's own site (examples/site, both elements) in headless Chromium through the function
/// binaries: the `api` function's script, user routes and CORS, the WebSocket API's live feed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_shop_site_through_the_function_binaries() -> anyhow::Result<()> {
    site_browser::the_shop_site_through_the_function_binaries().await
}

/// Taking a needed statement out of a function's policy makes that function fail, so the day
/// above would fail too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_policy_without_a_needed_statement_fails_its_function() -> anyhow::Result<()> {
    shipped::a_policy_without_a_needed_statement_fails_its_function().await
}

/// Opens and clicks through the function binaries, the API never thawed after it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn opens_and_clicks_under_environments_frozen_after_answering_are_all_recorded() -> anyhow::Result<()> {
    receipts_shipped::opens_and_clicks_under_environments_frozen_after_answering_are_all_recorded().await
}

/// SES events through the template's configuration set, topic and subscription; other topics refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ses_events_arrive_through_the_templates_topic_and_another_topics_are_refused() -> anyhow::Result<()> {
    receipts_shipped::ses_events_arrive_through_the_templates_topic_and_another_topics_are_refused().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_local_public_url_stops_the_functions_that_make_links() -> anyhow::Result<()> {
    shipped::a_local_public_url_stops_the_functions_that_make_links().await
}

/// A malformed `TIDINGS_*` value stops a function binary's start, naming it; a misspelt name is
/// named in a warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_malformed_setting_stops_a_function_and_a_misspelt_one_is_named() -> anyhow::Result<()> {
    settings_shipped::a_malformed_setting_stops_a_function_and_a_misspelt_one_is_named().await
}

/// The template's provider and tenant rates, two channel-worker processes drawing from the
/// shared buckets at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_workers_behind_one_shared_gate_never_exceed_the_rate() -> anyhow::Result<()> {
    rates_shipped::two_workers_behind_one_shared_gate_never_exceed_the_rate().await
}

/// A poison stream record ends alone on stream-failures (listed, replayed); its batch is relayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_poison_stream_record_ends_alone_on_stream_failures_and_its_batch_is_relayed() -> anyhow::Result<()> {
    relay_limits::a_poison_stream_record_ends_alone_on_stream_failures_and_its_batch_is_relayed().await
}

/// An orchestrator batch that cannot end before its deadline hands the rest back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_orchestrator_batch_hands_back_what_it_cannot_finish() -> anyhow::Result<()> {
    relay_limits::a_slow_orchestrator_batch_hands_back_what_it_cannot_finish().await
}

/// `bench reserve --backend aws` sells exactly the stock of a sharded SKU in DynamoDB Local, and
/// the table read directly agrees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserve_bench_on_aws_sells_exactly_the_stock_and_the_table_agrees() -> anyhow::Result<()> {
    bench::reserve_bench_on_aws_sells_exactly_the_stock_and_the_table_agrees().await
}

/// `bench digest --backend aws` at a tiny scale passes its own checks: one digest per user
/// with its events, every run ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digest_bench_on_aws_sends_one_digest_per_user_with_its_events() -> anyhow::Result<()> {
    bench::digest_bench_on_aws_sends_one_digest_per_user_with_its_events().await
}

/// A DynamoDB transaction whose answer was lost after it committed, sent again by the SDK, is
/// applied once and answered as committed (the SDK's `ClientRequestToken`, one for all the attempts of a call; AWS only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_whose_answer_was_lost_is_applied_once_when_the_sdk_sends_it_again() -> anyhow::Result<()> {
    store_retries::a_transaction_whose_answer_was_lost_is_applied_once_when_the_sdk_sends_it_again().await
}

/// `--bootstrap` on AWS tells each table, queue, DLQ and sender, created then found (AWS only:
/// the embedded backend's progress is tested in the `tidings` crate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_on_aws_tells_each_resource_created_then_found() -> anyhow::Result<()> {
    progress::bootstrap_on_aws_tells_each_resource_created_then_found().await
}

/// `tidings import users` and `tidings import pinpoint --backend aws` beside a running server on
/// the same table: read back through the API, sendable at once, a second run writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_through_the_aws_backend_is_read_back_through_the_api() -> anyhow::Result<()> {
    import::a_csv_and_a_pinpoint_export_are_imported_through_the_aws_backend().await
}
