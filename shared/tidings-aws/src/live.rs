//! Live in-app pushes on AWS: `PostToConnection` to every API Gateway WebSocket connection of the
//! user. A connection answered `GoneException` (410) is removed at once.

use async_trait::async_trait;
use aws_sdk_apigatewaymanagement::error::ProvideErrorMetadata;
use aws_sdk_apigatewaymanagement::primitives::Blob;
use tidings_core::Deps;
use tidings_core::TenantId;
use tidings_core::inbox::live::{self, LiveEvent, LivePush};
use tracing::{debug, warn};

pub struct ApiGatewayLive {
    client: aws_sdk_apigatewaymanagement::Client,
    deps: Deps,
}

impl ApiGatewayLive {
    pub fn new(client: aws_sdk_apigatewaymanagement::Client, deps: Deps) -> Self {
        Self { client, deps }
    }
}

#[async_trait]
impl LivePush for ApiGatewayLive {
    async fn publish(&self, t: &TenantId, user_id: &str, event: &LiveEvent) -> Result<usize, String> {
        let data = serde_json::to_vec(event).map_err(|e| e.to_string())?;
        let connections = live::connections_of(&self.deps, t, user_id).await.map_err(|e| e.to_string())?;
        let mut delivered = 0;
        for connection_id in connections {
            let sent = self
                .client
                .post_to_connection()
                .connection_id(&connection_id)
                .data(Blob::new(data.clone()))
                .send()
                .await;
            match sent {
                Ok(_) => delivered += 1,
                Err(e)
                    if e.as_service_error().is_some_and(|s| s.is_gone_exception())
                        || e.code() == Some("GoneException") =>
                {
                    debug!("stale connection removed");
                    if let Err(e) = live::forget_connection(&self.deps, &connection_id).await {
                        warn!(error = %e, "could not remove a stale connection");
                    }
                }
                Err(e) => {
                    warn!(error = %aws_sdk_apigatewaymanagement::error::DisplayErrorContext(&e), "live push failed")
                }
            }
        }
        Ok(delivered)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use aws_smithy_mocks::{MockResponseInterceptor, RuleMode, mock};
    use tidings_core::inbox::live::{LiveMessage, remember_connection};
    use tidings_core::ports::{Clock, SystemClock};
    use tidings_core::{CoreConfig, Providers};

    use super::*;

    fn deps() -> Deps {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let store = tidings_embedded::EmbeddedStore::in_memory_with_clock(clock.clone()).unwrap();
        let null = Arc::new(tidings_core::dev::NullProvider);
        let providers = Providers { email: null.clone(), sms: null.clone(), push: null };
        Deps::new(Arc::new(store.clone()), Arc::new(store), clock, providers, CoreConfig::default())
    }

    #[tokio::test]
    async fn a_gone_connection_is_removed_after_the_first_410() {
        let deps = deps();
        let t = TenantId::parse("acme").unwrap();
        remember_connection(&deps, &t, "u1", "live-conn").await.unwrap();
        remember_connection(&deps, &t, "u1", "gone-conn").await.unwrap();

        let ok = mock!(aws_sdk_apigatewaymanagement::Client::post_to_connection)
            .match_requests(|r| r.connection_id() == Some("live-conn"))
            .then_output(|| {
                aws_sdk_apigatewaymanagement::operation::post_to_connection::PostToConnectionOutput::builder().build()
            });
        let gone = mock!(aws_sdk_apigatewaymanagement::Client::post_to_connection)
            .match_requests(|r| r.connection_id() == Some("gone-conn"))
            .then_error(|| {
                aws_sdk_apigatewaymanagement::operation::post_to_connection::PostToConnectionError::GoneException(
                    aws_sdk_apigatewaymanagement::types::error::GoneException::builder().build(),
                )
            });
        let interceptor = MockResponseInterceptor::new().rule_mode(RuleMode::MatchAny).with_rule(&ok).with_rule(&gone);
        let client = aws_sdk_apigatewaymanagement::Client::from_conf(
            aws_sdk_apigatewaymanagement::Config::builder()
                .behavior_version(aws_sdk_apigatewaymanagement::config::BehaviorVersion::latest())
                .region(aws_sdk_apigatewaymanagement::config::Region::new("us-east-1"))
                .endpoint_url("https://example.execute-api.us-east-1.amazonaws.com/prod")
                .credentials_provider(aws_sdk_apigatewaymanagement::config::Credentials::new("t", "t", None, None, "t"))
                .http_client(aws_smithy_mocks::create_mock_http_client())
                .interceptor(interceptor)
                .build(),
        );
        let live = ApiGatewayLive::new(client, deps.clone());
        let event = LiveEvent::InboxMessage {
            message: LiveMessage {
                message_id: "m1".into(),
                title: "t".into(),
                body: "b".into(),
                created_at: "now".into(),
            },
            unread_count: 1,
        };
        assert_eq!(live.publish(&t, "u1", &event).await, Ok(1));
        assert_eq!(gone.num_calls(), 1);
        let left = live::connections_of(&deps, &t, "u1").await.unwrap();
        assert_eq!(left, vec!["live-conn".to_string()], "the gone connection was removed");
        // The next push goes only to the live one.
        assert_eq!(live.publish(&t, "u1", &event).await, Ok(1));
        assert_eq!(gone.num_calls(), 1);
        assert_eq!(ok.num_calls(), 2);
    }
}
