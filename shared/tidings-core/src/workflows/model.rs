//! A run as stored (`crate::workflows::run` drives it; `super::conditions` reads it).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ports::Channel;

/// A run's status, as `GET /v1/notifications/{id}/runs` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Running,
    Waiting,
    Completed,
    Throttled,
    Failed,
    Cancelled,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Waiting => "waiting",
            RunStatus::Completed => "completed",
            RunStatus::Throttled => "throttled",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
        }
    }

    pub fn ended(self) -> bool {
        !matches!(self, RunStatus::Running | RunStatus::Waiting)
    }
}

/// One step a run went through (a send that tried several channels: one per channel).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StepRecord {
    pub index: u32,
    #[serde(rename = "type")]
    pub kind: String,
    /// `done`, `skipped`, `waiting`, `queued`, `sent`, `suppressed`, `failed`, `throttled`,
    /// `digested` (it carries the digest), `merged` (into another trigger's run), `then`,
    /// `else`, `cancelled`.
    pub status: String,
    pub at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<Channel>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// What a waiting run waits for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "for", rename_all = "snake_case")]
pub enum Wait {
    /// A delay until `due_ms`.
    Delay { due_ms: i64 },
    /// Quiet hours (or `local_time`) hold the send at this step's `channel_index` until `due_ms`.
    Deferred { due_ms: i64, channel_index: u32 },
    /// A digest window it leads, closing at `due_ms`.
    Digest { pk: String, window: String, due_ms: i64 },
    /// A fallback send's channel `channel_index` reaching what the step asks, until
    /// `deadline_ms` (none: until it ends); checked at `next_check_ms`.
    Send {
        channel_index: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        deadline_ms: Option<i64>,
        checks: u32,
    },
}

/// A run as stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Run {
    pub user_id: String,
    pub workflow_id: String,
    pub version: u32,
    pub status: RunStatus,
    /// The step it is at (none once ended).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<Wait>,
    /// The params its steps render with: the notification's, and after a digest `events` and
    /// `count`.
    pub params: Value,
    #[serde(default)]
    pub steps: Vec<StepRecord>,
    /// The page of its notification it was started by (its progress counter).
    #[serde(default)]
    pub page: u64,
    /// Bumped by each write: a write is conditioned on the value it read.
    #[serde(default)]
    pub seq: u64,
    pub created_at: String,
    pub updated_at: String,
    /// When it last went on after a wait (none: it has not waited, and its time is its
    /// trigger's: the notification's acceptance, or its `send_at`). A delay's `for` and a digest's
    /// `window` count from it, so a backlog in front of the engine neither stretches a delay nor
    /// splits a digest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<i64>,
    /// A send that failed for good: the run ends `failed`.
    #[serde(default)]
    pub failed: bool,
}

impl Run {
    /// The channel step `step` last used (a fallback: the last one tried).
    pub fn channel_of(&self, step: u32) -> Option<Channel> {
        self.steps.iter().rev().find(|r| r.index == step && r.channel.is_some()).and_then(|r| r.channel)
    }
}

/// What a notification records of its workflow: the version its runs follow.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkflowRef {
    pub workflow_id: String,
    pub version: u32,
    /// No preference stops it.
    #[serde(default)]
    pub required: bool,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn names_are_the_ones_the_api_shows() {
        use RunStatus::*;
        for s in [Running, Waiting, Completed, Throttled, Failed, Cancelled] {
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
        use crate::workflows::definition::Reach;
        for r in [Reach::Sent, Reach::Delivered, Reach::Opened, Reach::Clicked, Reach::Read] {
            assert_eq!(serde_json::to_value(r).unwrap(), r.as_str());
        }
    }
}
