//! Back-in-stock alerts (issue 3; docs/restock.md): subscriptions, restock
//! rounds, paced waves, merged messages, retries and manual resend.
//!
//! - [`subscriptions`]: at most one WAITING subscription per (tenant, sku, user) by a
//!   conditional write; WAITING → NOTIFIED / CANCELLED / EXPIRED; rows are never deleted.
//! - [`rounds`]: a round opens when the SKU's `restock_round` grows (stream, via
//!   [`rounds::on_stock_changes`], or an upstream `stock.in` applied as an adjustment); the
//!   scheduled [`rounds::scan`] queues the current round of every SKU with stock and waiters.
//!   `batch_no` = f(sku, round). Waves of `k × available`, oldest first, in batches.
//! - [`waiting`]: a SKU's WAITING indexes, one of no market and one per market named; a round's
//!   waves count, per index, the units its subscribers can buy.
//! - [`analytics`]: what alerts earn per SKU (waiting, notified, clicked, ordered, revenue).
//! - [`merge`]: one message per user per window listing every SKU, retries 1/5/30 min, MANUAL,
//!   resend.
//!
//! - [`incoming`]: subscribers who asked are told when stock is on its way, and its date.
//!
//! Entry points for the runtime: the `stock-events` queue →
//! [`rounds::StockEventStep`]; timers `restock.wave`, `restock.flush`,
//! `restock.check`; the `restock-scan` schedule → [`rounds::scan`].

pub mod analytics;
pub mod incoming;
pub mod keys;
pub mod merge;
pub mod model;
pub mod rounds;
pub mod subscriptions;
pub mod waiting;

pub use merge::{NoticePage, RESTOCK_TEMPLATE, ResendReport, get_notice, list_notices, resend};
pub use model::{
    MessageStatus, Notice, NoticeStatus, RestockConfig, RestockMessage, RestockRound, StockEvent, StockLaneMessage,
    Subscription, SubscriptionRequest, SubscriptionStatus,
};
pub use rounds::{
    STOCK_EVENTS_QUEUE, ScanReport, StockEventAccepted, StockEventStep, WaveReport, apply_stock_event, batch_no,
    on_stock_changes, run_round, scan,
};
pub use subscriptions::{SubscriptionPage, cancel, list_for_user, subscribe};
