//! The outbox relay: committed notification items, read from the change stream, become request
//! messages. It may deliver twice (the stream is at least once); the orchestrator is idempotent.

use std::collections::BTreeMap;

use tracing::{debug, warn};

use super::model::{Notification, NotificationStatus, RequestMessage};
use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::keys::{self, NOTIFICATION_SK};
use crate::ports::{ChangeRecord, Item, OutMessage, StoreError};

/// Handles a batch of change records; an error fails the whole batch (it is retried).
pub async fn handle_changes(deps: &Deps, records: &[ChangeRecord]) -> CoreResult<()> {
    let mut by_queue: BTreeMap<&'static str, Vec<OutMessage>> = BTreeMap::new();
    for record in records {
        if record.key.sk != NOTIFICATION_SK || !record.is_insert() {
            continue;
        }
        let (Some((tenant, _)), Some(new)) = (keys::tenant_of(&record.key.pk), &record.new) else {
            warn!(pk = %record.key.pk, "notification record without a tenant; skipped");
            continue;
        };
        let notification: Notification = match Item::new(record.key.clone(), new.clone()).parse() {
            Ok(n) => n,
            Err(e) => {
                warn!(error = %e, "unreadable notification record; skipped");
                continue;
            }
        };
        if notification.status != NotificationStatus::Accepted {
            continue;
        }
        let message =
            RequestMessage { tenant: tenant.as_str().to_owned(), notification_id: notification.notification_id };
        let body = serde_json::to_string(&message).map_err(|e| CoreError::Store(StoreError::Corrupt(e.to_string())))?;
        debug!(notification_id = %message.notification_id, "relaying");
        by_queue.entry(notification.priority.request_queue()).or_default().push(OutMessage::new(body));
    }
    for (queue, messages) in by_queue {
        deps.queues.send_batch(queue, messages).await?;
    }
    Ok(())
}
