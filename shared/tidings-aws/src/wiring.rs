//! Assembles the core's ports on AWS from the environment: what every Lambda `main` and
//! `tidings serve --backend aws` call, so the wiring exists once.

use std::sync::Arc;

use tidings_core::ports::{ChangeFeed, Provider, Queues, SystemClock, Table};
use tidings_core::{CoreConfig, Deps, Providers};

use crate::{AwsBackend, BootstrapError, ConfigError, bootstrap};

#[derive(Debug, thiserror::Error)]
pub enum WiringError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Bootstrap(#[from] BootstrapError),
}

/// The ports on AWS.
#[derive(Clone)]
pub struct AwsPorts {
    pub backend: AwsBackend,
    pub table: Arc<dyn Table>,
    pub queues: Arc<dyn Queues>,
    pub feed: Arc<dyn ChangeFeed>,
    pub email: Arc<dyn Provider>,
    pub sms: Arc<dyn Provider>,
    pub push: Arc<dyn Provider>,
    /// Prefix of the queue ARNs in the SQS events the local runtime builds.
    pub queue_arn_prefix: String,
}

impl AwsPorts {
    /// Reads the configuration; with `bootstrap`, first creates the table and the queues where
    /// missing (for an emulator; on AWS the SAM template owns them).
    pub async fn from_env(bootstrap_first: bool, queue_names: &[String]) -> Result<Self, WiringError> {
        let backend = AwsBackend::from_env().await?;
        if bootstrap_first {
            let names: Vec<&str> = queue_names.iter().map(String::as_str).collect();
            bootstrap(&backend, &names).await?;
        }
        let region = std::env::var("AWS_REGION").unwrap_or_else(|_| "us-east-1".into());
        Ok(Self {
            table: Arc::new(backend.table()),
            queues: Arc::new(backend.queues()),
            feed: Arc::new(backend.change_feed()),
            email: Arc::new(backend.email()),
            sms: Arc::new(backend.sms()),
            push: Arc::new(backend.push()),
            queue_arn_prefix: format!("arn:aws:sqs:{region}:000000000000:{}", backend.config().queue_prefix),
            backend,
        })
    }

    /// The core's dependencies, with the real providers and the system clock (Lambda).
    pub fn deps(&self) -> Deps {
        Deps {
            table: self.table.clone(),
            queues: self.queues.clone(),
            clock: Arc::new(SystemClock),
            providers: Providers { email: self.email.clone(), sms: self.sms.clone(), push: self.push.clone() },
            config: Arc::new(CoreConfig::from_env()),
        }
    }

    /// The deployment's queue prefix (logical name = physical name without it).
    pub fn queue_prefix(&self) -> &str {
        &self.backend.config().queue_prefix
    }
}
