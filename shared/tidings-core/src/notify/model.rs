//! Notifications and deliveries: the records and the request.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{CoreError, CoreResult};
use crate::ids::{TenantId, check_id};
use crate::ports::Channel;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Category {
    Transactional,
    Marketing,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    High,
    Normal,
    Low,
}

impl Priority {
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::High => "high",
            Priority::Normal => "normal",
            Priority::Low => "low",
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Recipients {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_ids: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segment: Option<String>,
}

/// The body of `POST /v1/notifications`, as sent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NotificationRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    pub recipients: Recipients,
    /// The template to send (or `workflow_id`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub template_id: String,
    /// The workflow to run for each recipient (then no `template_id`, `category` or
    /// `channels`: the workflow has them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_id: Option<String>,
    #[serde(default = "empty_object")]
    pub params: Value,
    /// Required with `template_id`; a workflow has its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<Category>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channels: Option<Vec<Channel>>,
    /// Default: transactional `high`, marketing `low`. `high` is granted only to a
    /// transactional send to at most 10 users; anything else asking for it gets `normal`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<Priority>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_at: Option<chrono::DateTime<chrono::Utc>>,
    #[serde(default)]
    pub local_time: bool,
    /// Who asked for this message (an OTP's end user, as the shop's endpoint saw them), for
    /// the per-requester limits (`crate::notify::abuse`). Counted at accept, never stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requester: Option<Requester>,
}

/// The end user behind a user-triggered message.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Requester {
    /// The client's IP address (IPv4, or IPv6: counted by its /64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    /// The client's device identifier, as the shop knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_id: Option<String>,
}

fn empty_object() -> Value {
    Value::Object(Default::default())
}

/// Most users in one `user_ids` list; larger audiences are segments (campaigns).
pub const MAX_USER_IDS: usize = 1000;

/// Most recipients a notification may have and still be sent on the high lanes. An OTP, an
/// order's confirmation or a shipping update goes to one user; a few more covers a household or
/// a shop's staff. At 10 users and up to three queued channels a request is at most 30 sends,
/// three receives of the high lanes' batches of 10: what one such request can put in front of
/// another tenant's OTP (docs/delivery.md, "Fair lanes").
pub const MAX_HIGH_RECIPIENTS: usize = 10;

/// Why a notification got a lower priority than it asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PriorityLowered {
    /// A segment (a campaign): bulk whatever it asks.
    Segment,
    /// A marketing send: the high lanes are for transactional messages.
    Marketing,
    /// More than [`MAX_HIGH_RECIPIENTS`] users.
    TooManyRecipients,
}

impl NotificationRequest {
    pub fn validate(&self) -> CoreResult<()> {
        if let Some(key) = &self.idempotency_key
            && (key.is_empty() || key.len() > 200 || key.chars().any(|c| c.is_control() || c == '#'))
        {
            return Err(CoreError::invalid(
                "idempotency_key",
                "must be 1 to 200 characters, without # or control characters",
            ));
        }
        match (&self.workflow_id, self.template_id.is_empty()) {
            (Some(w), true) => {
                check_id("workflow_id", w)?;
                if self.category.is_some() {
                    return Err(CoreError::invalid(
                        "category",
                        "a workflow send takes its workflow's category: omit it",
                    ));
                }
                if self.channels.is_some() {
                    return Err(CoreError::invalid(
                        "channels",
                        "a workflow send takes its workflow's channels: omit them",
                    ));
                }
            }
            (None, false) => {
                check_id("template_id", &self.template_id)?;
                if self.category.is_none() {
                    return Err(CoreError::invalid("category", "required: transactional or marketing"));
                }
            }
            _ => return Err(CoreError::invalid("template_id", "give exactly one of template_id or workflow_id")),
        }
        if let Some(r) = &self.requester {
            if let Some(ip) = &r.ip
                && ip.parse::<std::net::IpAddr>().is_err()
            {
                return Err(CoreError::invalid("requester.ip", "must be an IPv4 or IPv6 address"));
            }
            if let Some(device) = &r.device_id
                && (device.is_empty() || device.len() > 200 || device.chars().any(char::is_control))
            {
                return Err(CoreError::invalid("requester.device_id", "must be 1 to 200 characters"));
            }
        }
        if !self.params.is_object() {
            return Err(CoreError::invalid("params", "must be an object"));
        }
        match (&self.recipients.user_ids, &self.recipients.segment) {
            (Some(ids), None) => {
                if ids.is_empty() || ids.len() > MAX_USER_IDS {
                    return Err(CoreError::invalid(
                        "recipients.user_ids",
                        format!("must list 1 to {MAX_USER_IDS} users"),
                    ));
                }
                for (i, id) in ids.iter().enumerate() {
                    check_id(&format!("recipients.user_ids[{i}]"), id)?;
                }
            }
            (None, Some(segment)) => check_id("recipients.segment", segment)?,
            _ => return Err(CoreError::invalid("recipients", "give exactly one of user_ids or segment")),
        }
        if let Some(channels) = &self.channels
            && channels.is_empty()
        {
            return Err(CoreError::invalid("channels", "must not be empty (omit it to use preferences)"));
        }
        if self.local_time && self.send_at.is_none() {
            return Err(CoreError::invalid(
                "local_time",
                "needs send_at (its wall-clock time is used in each user's zone)",
            ));
        }
        Ok(())
    }

    /// Checks `send_at` against the clock: at most a year ahead.
    pub fn validate_schedule(&self, now: chrono::DateTime<chrono::Utc>) -> CoreResult<()> {
        if let Some(at) = self.send_at
            && at > now + chrono::Duration::days(366)
        {
            return Err(CoreError::invalid("send_at", "must be within a year"));
        }
        Ok(())
    }

    /// Whether the request waits for a timer: `send_at` in the future, or any `local_time`
    /// request (some zones may still be ahead).
    pub fn is_scheduled(&self, now: chrono::DateTime<chrono::Utc>) -> bool {
        match self.send_at {
            Some(at) => self.local_time || at > now,
            None => false,
        }
    }

    /// The priority asked for: `priority` as sent, else the category's default (transactional
    /// `high`, marketing `low`). What it gets is [`Self::granted_priority`].
    pub fn priority(&self) -> Priority {
        self.priority.unwrap_or(match self.category() {
            Category::Transactional => Priority::High,
            Category::Marketing => Priority::Low,
        })
    }

    /// The priority it gets, and why it is lower than asked (`None`: as asked). The high lanes
    /// are for small transactional sends (an OTP, an order's confirmation): a segment, a
    /// marketing send or a list of more than [`MAX_HIGH_RECIPIENTS`] users asking for `high`
    /// gets `normal`, so no bulk send queues in front of an OTP, the sender's own or another
    /// tenant's (docs/delivery.md, "Fair lanes").
    pub fn granted_priority(&self) -> (Priority, Option<PriorityLowered>) {
        let asked = self.priority();
        if asked != Priority::High {
            return (asked, None);
        }
        let lowered = if self.recipients.segment.is_some() {
            Some(PriorityLowered::Segment)
        } else if self.category() == Category::Marketing {
            Some(PriorityLowered::Marketing)
        } else if self.user_ids().len() > MAX_HIGH_RECIPIENTS {
            Some(PriorityLowered::TooManyRecipients)
        } else {
            None
        };
        match lowered {
            Some(reason) => (Priority::Normal, Some(reason)),
            None => (Priority::High, None),
        }
    }

    /// What it sends: its template's id, or its workflow's (the key of its verification stats).
    pub fn sends_what(&self) -> &str {
        match &self.workflow_id {
            Some(w) if self.template_id.is_empty() => w,
            _ => &self.template_id,
        }
    }

    /// The category: as sent, or (a workflow send) its workflow's, set at accept.
    pub fn category(&self) -> Category {
        self.category.unwrap_or(Category::Transactional)
    }

    /// The recipients' user ids, without duplicates, in the order given.
    pub fn user_ids(&self) -> Vec<String> {
        let mut seen = std::collections::HashSet::new();
        self.recipients.user_ids.iter().flatten().filter(|u| seen.insert(u.as_str())).cloned().collect()
    }
}

/// A notification's status. Once every delivery has ended: `completed` when none failed or
/// died, `completed_with_failures` when some were sent and some failed or died, `failed` when
/// none was sent and some failed or died (suppressed deliveries are no failures).
// Only `accepted`, `scheduled`, `processing` and `cancelled` are stored; the ends are read from
// the counts (`NotificationStatus::ended`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum NotificationStatus {
    Accepted,
    Scheduled,
    Processing,
    Completed,
    CompletedWithFailures,
    Failed,
    Cancelled,
}

impl NotificationStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            NotificationStatus::Accepted => "accepted",
            NotificationStatus::Scheduled => "scheduled",
            NotificationStatus::Processing => "processing",
            NotificationStatus::Completed => "completed",
            NotificationStatus::CompletedWithFailures => "completed_with_failures",
            NotificationStatus::Failed => "failed",
            NotificationStatus::Cancelled => "cancelled",
        }
    }

    /// Whether it has not ended yet: accepted, scheduled or processing (completed, completed
    /// with failures, failed and cancelled are final).
    pub fn is_open(self) -> bool {
        matches!(self, NotificationStatus::Accepted | NotificationStatus::Scheduled | NotificationStatus::Processing)
    }

    /// The status of a notification whose deliveries have all ended, from how many were sent
    /// (`sent` and beyond: delivered, opened, clicked) and how many failed or died.
    pub fn ended(sent: u64, failed_or_dead: u64) -> Self {
        match (sent, failed_or_dead) {
            (_, 0) => NotificationStatus::Completed,
            (0, _) => NotificationStatus::Failed,
            _ => NotificationStatus::CompletedWithFailures,
        }
    }
}

/// The notification item: the API's write, which is also the outbox entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Notification {
    pub notification_id: String,
    pub status: NotificationStatus,
    pub request: NotificationRequest,
    /// The priority granted ([`NotificationRequest::granted_priority`]): its lanes.
    pub priority: Priority,
    /// Why `priority` is lower than the request asked for (absent: as asked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_lowered: Option<PriorityLowered>,
    pub body_hash: String,
    pub created_at: String,
    pub created_ms: i64,
    /// Set once every delivery has been created and queued.
    #[serde(default)]
    pub orchestrated: bool,
    /// Its deliveries are counted in progress counter items (`keys::progress_counter`), kept
    /// in the same transactions as the status changes. False only for notifications accepted
    /// before the counters existed (their counts come from reading every delivery).
    #[serde(default)]
    pub counted: bool,
    /// A campaign's last page, once its expansion reached the end of the segment (`user_ids`
    /// notifications have one page, 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_page: Option<u64>,
    /// Accepted with a `requester` (an end user asked for it): counted in its template's
    /// verification stats (`super::verification`).
    #[serde(default)]
    pub user_triggered: bool,
    /// When the shop reported its code used (`POST /v1/notifications/{id}/verified`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified_at: Option<String>,
    /// Its sends get one attempt on their channel ([`ChannelTask::one_attempt`]): the caller
    /// that created it retries on its own schedule (back-in-stock alerts, 1/5/30 minutes after
    /// the failure). Never set through the API.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub one_attempt: bool,
    /// A workflow send: the workflow and the version its runs follow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow: Option<crate::workflows::model::WorkflowRef>,
}

impl Notification {
    /// A segment notification: a campaign, expanded page by page.
    pub fn segment(&self) -> Option<&str> {
        self.request.recipients.segment.as_deref()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum DeliveryStatus {
    Pending,
    Sending,
    Sent,
    Delivered,
    Opened,
    Clicked,
    Failed,
    Suppressed,
    Dead,
}

impl DeliveryStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryStatus::Pending => "pending",
            DeliveryStatus::Sending => "sending",
            DeliveryStatus::Sent => "sent",
            DeliveryStatus::Delivered => "delivered",
            DeliveryStatus::Opened => "opened",
            DeliveryStatus::Clicked => "clicked",
            DeliveryStatus::Failed => "failed",
            DeliveryStatus::Suppressed => "suppressed",
            DeliveryStatus::Dead => "dead",
        }
    }
    /// Still on its way (counts as `queued`).
    pub fn is_open(self) -> bool {
        matches!(self, DeliveryStatus::Pending | DeliveryStatus::Sending)
    }
}

/// One delivery: `(notification, user, channel)`, the deduplication key of the send.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Delivery {
    pub user_id: String,
    pub channel: Channel,
    pub status: DeliveryStatus,
    #[serde(default)]
    pub attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_failed_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_until_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_message_id: Option<String>,
    /// Set while quiet hours hold the delivery back (status `pending`, reason `quiet_hours`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deferred_until: Option<String>,
    pub category: Category,
    pub updated_at: String,
    /// A workflow's send step (its index): a workflow may send on one channel in several steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u32>,
}

/// The request queue message: which notification to orchestrate. For a campaign (a segment),
/// one message per page of the segment: `page` counts from 0 and `cursor` is where the page
/// starts (`None` for the first); each page's task queues the next one.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RequestMessage {
    pub tenant: TenantId,
    pub notification_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub page: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl RequestMessage {
    /// The first (or only) task of a notification.
    pub fn first(tenant: &TenantId, notification_id: &str) -> Self {
        Self { tenant: tenant.clone(), notification_id: notification_id.to_owned(), cursor: None, page: 0 }
    }
}

/// The channel queue message: one rendered send.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChannelTask {
    pub tenant: TenantId,
    pub notification_id: String,
    pub user_id: String,
    pub channel: Channel,
    pub category: Category,
    pub to: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// The message; for an email, its text part.
    pub body: String,
    /// An email's HTML part (docs/security.md, "Email parts").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub html: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<(String, String)>,
    /// When its notification was accepted (ms since the epoch, the notification's
    /// `created_ms`): the start of the accepted → provider latency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted_ms: Option<i64>,
    /// Its notification's priority (absent in tasks queued before it was carried: then the
    /// category's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<Priority>,
    /// One attempt only: a transient failure closes the delivery `dead` at once, without the
    /// channel's own retries, for its notification's creator to retry ([`Notification::one_attempt`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub one_attempt: bool,
    /// A workflow's send step: its delivery is `D#{user}#{channel}#{step}`, and its end wakes
    /// the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u32>,
    /// Its end wakes its run at once (a fallback's channel: the next may follow); other steps'
    /// sends are not waited for.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub wake: bool,
}

impl ChannelTask {
    /// The key of its delivery.
    pub fn delivery_key(&self) -> crate::ports::Key {
        crate::keys::delivery_at(&self.tenant, &self.notification_id, &self.user_id, self.channel, self.step)
    }

    /// Its notification's priority.
    pub fn priority(&self) -> Priority {
        self.priority.unwrap_or(match self.category {
            Category::Transactional => Priority::High,
            Category::Marketing => Priority::Low,
        })
    }
}

/// A channel queue's message: one rendered send, or a send batch of marketing deliveries
/// (`super::batch`, docs/delivery.md "Send batches"). Told apart by the batch's `batch` field,
/// so each keeps its own parse errors.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum ChannelMessage {
    Task(ChannelTask),
    Batch(SendBatchTask),
}

impl<'de> Deserialize<'de> for ChannelMessage {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(d)?;
        let is_batch = value.get("batch").is_some();
        if is_batch {
            serde_json::from_value(value).map(ChannelMessage::Batch).map_err(serde::de::Error::custom)
        } else {
            serde_json::from_value(value).map(ChannelMessage::Task).map_err(serde::de::Error::custom)
        }
    }
}

/// One send of a batch message: whom, where, what.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BatchSend {
    pub user_id: String,
    pub to: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    pub body: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub html: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<(String, String)>,
}

/// The channel queue message of a send batch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SendBatchTask {
    pub tenant: TenantId,
    pub notification_id: String,
    /// The batch item's sort key (`B#{page}#{n}`).
    pub batch: String,
    pub page: u64,
    pub channel: Channel,
    pub category: Category,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<Priority>,
    pub entries: Vec<BatchSend>,
}

impl SendBatchTask {
    /// The channel task of one of its sends (what a provider call is made of).
    pub fn task_of(&self, send: &BatchSend) -> ChannelTask {
        ChannelTask {
            tenant: self.tenant.clone(),
            notification_id: self.notification_id.clone(),
            user_id: send.user_id.clone(),
            channel: self.channel,
            category: self.category,
            to: send.to.clone(),
            subject: send.subject.clone(),
            body: send.body.clone(),
            html: send.html.clone(),
            headers: send.headers.clone(),
            accepted_ms: self.accepted_ms,
            priority: self.priority,
            one_attempt: false,
            step: None,
            wake: false,
        }
    }
}
