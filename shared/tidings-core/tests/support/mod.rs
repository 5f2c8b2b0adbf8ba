//! What the core's integration tests share (each test file that needs it says `mod support;`).

use std::sync::Mutex;

use async_trait::async_trait;
use tidings_core::ports::{OutboundMessage, Provider, ProviderError, ProviderReceipt};

/// A provider that accepts every send and records it; its message ids are `pm-1`, `pm-2`, ...
#[derive(Default)]
pub struct Recorder {
    pub sent: Mutex<Vec<OutboundMessage>>,
}

#[async_trait]
impl Provider for Recorder {
    fn name(&self) -> &str {
        "recorder"
    }
    async fn send(&self, message: &OutboundMessage) -> Result<ProviderReceipt, ProviderError> {
        let mut sent = self.sent.lock().unwrap_or_else(|p| p.into_inner());
        sent.push(message.clone());
        Ok(ProviderReceipt { provider_message_id: format!("pm-{}", sent.len()) })
    }
}
