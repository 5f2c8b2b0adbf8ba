//! Which Lambda function a piece of work belongs to, when one process plays all of them (the
//! local runtime): the runtime runs each handler "as" its function (the HTTP routes as the API
//! function that serves them on Lambda), and the AWS adapters' request counter labels every
//! request with it. What each function may call is checked on its binary, behind the proxy that
//! enforces `template.yaml`'s statements (`tests/e2e/lambda/proxy.rs`).
//!
//! On Lambda a process is one function and nothing is set (the metric then has no such label;
//! the local metrics read it as `unattributed`).

use std::future::Future;

tokio::task_local! {
    static ROLE: &'static str;
}

/// The role of work done by the event source mappings themselves (queue receives and deletes,
/// stream reads): on AWS, Lambda's pollers with the permissions SAM adds for each event source.
pub const EVENT_SOURCE: &str = "event-source-mapping";

/// The role of what the local process does before it serves (creating the emulator's tables
/// and queues, reading settings): deployment, not a function.
pub const STARTUP: &str = "startup";

/// The role of what only the local runtime does (sampling queue ages for its metrics; on AWS
/// CloudWatch has them).
pub const LOCAL_RUNTIME: &str = "local-runtime";

/// The HTTP functions that serve part of the routes `tidings serve` answers in one router: the
/// role of their part there, and their binary's name (`tidings_functions::Function::name`).
pub const COMMERCE_API: &str = "commerce-api";
pub const MESSAGES_API: &str = "messages-api";
pub const PUBLIC_API: &str = "public-api";

/// Runs `work` as `role`; requests it makes are counted for that role.
pub async fn acting_as<F: Future>(role: &'static str, work: F) -> F::Output {
    ROLE.scope(role, work).await
}

/// The role of the current task, if any.
pub fn current() -> Option<&'static str> {
    ROLE.try_with(|r| *r).ok()
}

/// Spawns `work` in the role of the caller (a task spawned inside a handler is that handler's).
pub fn spawn_in_role<F>(work: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    match current() {
        Some(role) => tokio::spawn(acting_as(role, work)),
        None => tokio::spawn(work),
    }
}

/// The function that consumes a queue (as `template.yaml` wires them: [`crate::lanes::Lane::consumer`]).
pub fn consumer_of(queue: &str) -> &'static str {
    crate::lanes::Lane::from_name(queue).and_then(crate::lanes::Lane::consumer).unwrap_or("unattributed")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_role_holds_inside_its_scope_and_in_tasks_spawned_there() {
        assert_eq!(current(), None);
        let inner = acting_as("api", async {
            assert_eq!(current(), Some("api"));
            let nested = acting_as("tick", async { current() }).await;
            let spawned = spawn_in_role(async { current() }).await.unwrap_or(None);
            (nested, spawned, current())
        })
        .await;
        assert_eq!(inner, (Some("tick"), Some("api"), Some("api")));
        assert_eq!(current(), None);
    }

    #[test]
    fn each_queue_has_its_consumer() {
        for q in crate::messages::ALL_QUEUES.iter().filter(|q| crate::messages::is_consumed(q)) {
            assert_ne!(consumer_of(q), "unattributed", "{q}");
        }
    }
}
