//! A function's metrics as it prints them: EMF documents naming the function, with a cold
//! start in the first flush only (its own test binary: the recorder is the process's).
#![allow(clippy::unwrap_used)]

use serde_json::Value;
use std::time::Duration;

use tidings_core::metrics::{COLD_STARTS, NAMESPACE, WORKER_BUSY_MS, record_busy};

#[test]
fn the_first_flush_carries_one_cold_start_and_every_document_names_the_function() {
    tidings_core::metrics::install();
    tidings_lambda::init_metrics("channel-worker");
    // A second start-up call in one environment is no second cold start.
    tidings_lambda::init_metrics("channel-worker");
    record_busy("sms-low", Duration::from_millis(20));
    let first: Vec<Value> =
        tidings_lambda::metrics_documents().iter().map(|l| serde_json::from_str(l).unwrap()).collect();
    let cold: Vec<&Value> = first.iter().filter(|d| d.get(COLD_STARTS).is_some()).collect();
    assert_eq!(cold.len(), 1, "{first:#?}");
    assert_eq!(cold[0][COLD_STARTS], 1);
    for d in &first {
        assert_eq!(d["function"], "channel-worker", "{d}");
        assert_eq!(d["_aws"]["CloudWatchMetrics"][0]["Namespace"], NAMESPACE);
    }
    let busy = first.iter().find(|d| d.get(WORKER_BUSY_MS).is_some()).unwrap();
    assert_eq!((busy["queue"].as_str(), &busy[WORKER_BUSY_MS]), (Some("sms-low"), &Value::from(20)));
    assert_eq!(
        busy["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
        serde_json::json!([["function", "queue"], ["queue"]])
    );

    record_busy("email-high", Duration::from_millis(5));
    let second = tidings_lambda::metrics_documents().join("\n");
    assert!(!second.contains(COLD_STARTS), "{second}");
    assert!(second.contains("\"queue\":\"email-high\""), "{second}");
    assert!(!second.contains("\"queue\":\"sms-low\""), "counters flush their increase: {second}");
}
