//! The ports through which the core speaks to the world.

pub mod clock;
pub mod provider;
pub mod queue;
pub mod table;

pub use clock::{Clock, ManualClock, SystemClock};
pub use provider::{
    Channel, OutboundMessage, PermanentCode, Platform, Provider, ProviderError, ProviderReceipt, Providers, one_line,
};
pub use queue::{OutMessage, QueueError, QueueStats, Queues, Received};
pub use table::{
    Attrs, ChangeFeed, ChangeRecord, CmpOp, Cond, Item, Key, Page, QueryOpts, StoreError, Table, Update, Updating,
    Write, attrs_of,
};
