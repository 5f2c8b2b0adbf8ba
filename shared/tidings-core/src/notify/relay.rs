//! The outbox relay: committed notification items, read from the change stream, become request
//! messages. It may deliver twice (the stream is at least once); the orchestrator is idempotent.

use std::collections::BTreeMap;

use tracing::{debug, warn};

use super::model::{Notification, NotificationStatus, RequestMessage};
use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::keys::{self, NOTIFICATION_SK};
use crate::ports::{ChangeRecord, Item, OutMessage, StoreError};

/// Whether the relay (with the live feed and back-in-stock rounds) acts on changes of the item
/// `key`: new notifications (`N`), campaign page tasks (`P#`), stock items (`STOCK`) and inbox
/// messages (`M#`). The same filter as the event source mapping's `FilterCriteria` in
/// `template.yaml`; the embedded store records only these changes (a campaign's deliveries,
/// counters and receipts are most of its writes and nobody reads their changes).
pub fn streamed(key: &crate::ports::Key) -> bool {
    let sk = key.sk.as_str();
    sk == NOTIFICATION_SK
        || sk == crate::inventory::keys::STOCK_SK
        || sk.starts_with(keys::PAGE_PREFIX)
        || sk.starts_with(keys::INBOX_MESSAGE_PREFIX)
}

/// Handles a batch of change records; an error fails the whole batch (it is retried).
pub async fn handle_changes(deps: &Deps, records: &[ChangeRecord]) -> CoreResult<()> {
    // Stock items whose restock round grew start back-in-stock rounds (seed 000).
    crate::restock::on_stock_changes(deps, records).await?;
    let mut by_queue: BTreeMap<&'static str, Vec<OutMessage>> = BTreeMap::new();
    let mut pages: BTreeMap<String, Vec<OutMessage>> = BTreeMap::new();
    for record in records {
        // A campaign's next page (an outbox entry put by the page before it).
        if record.key.sk.starts_with(keys::PAGE_PREFIX) {
            if record.is_insert()
                && let Some((queue, message)) = record.new.as_ref().and_then(super::campaign::page_task)
            {
                let body = serde_json::to_string(&message)
                    .map_err(|e| CoreError::Store(StoreError::Corrupt(e.to_string())))?;
                pages.entry(queue).or_default().push(OutMessage::new(body));
            }
            continue;
        }
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
        if notification.status == NotificationStatus::Scheduled {
            crate::schedule::on_scheduled(deps, &tenant, &notification).await?;
            continue;
        }
        if notification.status != NotificationStatus::Accepted {
            continue;
        }
        let message = RequestMessage::first(tenant.as_str(), &notification.notification_id);
        let body = serde_json::to_string(&message).map_err(|e| CoreError::Store(StoreError::Corrupt(e.to_string())))?;
        debug!(notification_id = %message.notification_id, "relaying");
        by_queue.entry(notification.priority.request_queue()).or_default().push(OutMessage::new(body));
    }
    let relayed = !by_queue.is_empty() || !pages.is_empty();
    for (queue, messages) in by_queue {
        deps.queues.send_batch(queue, messages).await?;
    }
    for (queue, messages) in pages {
        deps.queues.send_batch(&queue, messages).await?;
    }
    if relayed {
        // Queued, but the stream position is not committed yet: the records come again.
        crate::crash::point("relay.after_send");
    }
    Ok(())
}
