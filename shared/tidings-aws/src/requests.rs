//! Every request the adapters make, counted by an interceptor on each SDK client: the metric
//! [`AWS_REQUESTS`](tidings_core::metrics::AWS_REQUESTS) by service and operation (one per
//! attempt: a retried call is billed twice), shown by `GET /v1/ops/metrics` and in EMF from
//! Lambda. What a campaign costs is these counts divided by its deliveries. Each is labelled
//! with the function it was made for ([`tidings_core::roles`]), when the local runtime plays
//! them all.

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextRef;
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;
use metrics::Label;
use tidings_core::metrics::AWS_REQUESTS;

/// The interceptor counting requests (attach it with `config::Builder::interceptor`).
#[derive(Clone, Copy, Debug, Default)]
pub struct RequestCounter;

impl Intercept for RequestCounter {
    fn name(&self) -> &'static str {
        "TidingsRequestCounter"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let (service, operation) = match cfg.load::<Metadata>() {
            Some(m) => (m.service().to_owned(), m.name().to_owned()),
            None => ("unknown".to_owned(), "unknown".to_owned()),
        };
        // On Lambda no role is set (the process is one function) and the metric has no label
        // for it. When the local runtime plays the functions, an SQS request also names its
        // queue, for the check of the template's resources.
        let sqs = service == "SQS";
        let mut labels = vec![Label::new("service", service), Label::new("operation", operation)];
        if let Some(function) = tidings_core::roles::current() {
            labels.push(Label::new("function", function));
            if let Some(queue) = sqs.then(|| queue_of(context.request().body().bytes())).flatten() {
                labels.push(Label::new("queue", queue));
            }
        }
        metrics::counter!(AWS_REQUESTS, labels).increment(1);
        Ok(())
    }
}

/// The queue an SQS request (JSON protocol) names: its `QueueUrl`'s last segment, its
/// `QueueName`, or the queue of its `SourceArn` (a message move task).
fn queue_of(body: Option<&[u8]>) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body?).ok()?;
    let named = ["QueueUrl", "QueueName", "SourceArn"].iter().find_map(|k| v[*k].as_str())?;
    named.rsplit(['/', ':']).next().filter(|q| !q.is_empty()).map(str::to_owned)
}
