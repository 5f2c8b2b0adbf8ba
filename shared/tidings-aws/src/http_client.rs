//! The HTTP client of every SDK client here: reqwest's (HTTP/1.1 over rustls with ring, the
//! client the webhooks and the push providers use already) behind the SDK's `HttpClient`, not
//! the SDK's own hyper client, which links HTTP/2 (`h2`, about 0.5 MB of every function)
//! though DynamoDB, SQS, SES, SNS and SSM answer HTTP/1.1 (docs/deploy.md, "The functions'
//! size").
//!
//! What the SDK asks of a client: its connect and read timeouts applied (a connector per pair,
//! kept), a pool of connections (reqwest's), and failures classed so that its retry policy
//! tells a transient one: a timeout, or an I/O failure (a refused or reset connection, a
//! request or answer cut off) is retried; anything else is not.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpClient, SharedHttpConnector,
};
use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, HttpResponse};
use aws_smithy_runtime_api::client::result::ConnectorError;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::body::SdkBody;

/// The client every SDK configuration here is given.
pub fn shared() -> SharedHttpClient {
    SharedHttpClient::new(ReqwestClient::default())
}

/// Makes, and keeps, a connector per pair of timeouts the SDK asks for.
#[derive(Debug, Default)]
struct ReqwestClient {
    connectors: Mutex<Vec<(Timeouts, SharedHttpConnector)>>,
}

type Timeouts = (Option<Duration>, Option<Duration>);

impl HttpClient for ReqwestClient {
    fn http_connector(&self, settings: &HttpConnectorSettings, _: &RuntimeComponents) -> SharedHttpConnector {
        let timeouts = (settings.connect_timeout(), settings.read_timeout());
        let mut connectors = self.connectors.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, connector)) = connectors.iter().find(|(t, _)| *t == timeouts) {
            return connector.clone();
        }
        let connector = SharedHttpConnector::new(Connector::new(timeouts));
        connectors.push((timeouts, connector.clone()));
        connector
    }
}

/// One reqwest client, or why none could be made (every call then fails with it).
#[derive(Debug)]
struct Connector(Result<reqwest::Client, String>);

impl Connector {
    fn new((connect, read): Timeouts) -> Self {
        let mut builder = reqwest::Client::builder();
        if let Some(t) = connect {
            builder = builder.connect_timeout(t);
        }
        if let Some(t) = read {
            builder = builder.read_timeout(t);
        }
        Connector(builder.build().map_err(|e| format!("no HTTP client: {e}")))
    }
}

impl HttpConnector for Connector {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let client = self.0.clone();
        HttpConnectorFuture::new(async move {
            let client = client.map_err(|e| ConnectorError::other(e.into(), None))?;
            let request = request.try_into_http1x().map_err(|e| ConnectorError::user(e.into()))?;
            let (parts, body) = request.into_parts();
            let request = reqwest::Request::try_from(http::Request::from_parts(parts, reqwest::Body::wrap(body)))
                .map_err(|e| ConnectorError::user(e.into()))?;
            let response = client.execute(request).await.map_err(connector_error)?;
            let (parts, body) = http::Response::<reqwest::Body>::from(response).into_parts();
            HttpResponse::try_from(http::Response::from_parts(parts, SdkBody::from_body_1_x(body)))
                .map_err(|e| ConnectorError::other(e.into(), None))
        })
    }
}

/// The SDK's class of a failure: what its retry policy reads.
fn connector_error(e: reqwest::Error) -> ConnectorError {
    if e.is_timeout() {
        ConnectorError::timeout(e.into())
    } else if e.is_connect() || e.is_request() || e.is_body() {
        ConnectorError::io(e.into())
    } else {
        ConnectorError::other(e.into(), None)
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    /// A server on loopback that answers each connection as `answer` says.
    async fn server(answer: &'static [u8]) -> std::net::SocketAddr {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut buf = vec![0u8; 4096];
                let _ = socket.read(&mut buf).await;
                let _ = socket.write_all(answer).await;
                let _ = socket.shutdown().await;
            }
        });
        addr
    }

    fn connector() -> Connector {
        Connector::new((Some(Duration::from_secs(2)), None))
    }

    fn request(addr: std::net::SocketAddr, body: &str) -> HttpRequest {
        let request = http::Request::builder()
            .method("POST")
            .uri(format!("http://{addr}/"))
            .header("x-amz-target", "DynamoDB_20120810.GetItem")
            .body(SdkBody::from(body.to_owned()))
            .expect("request");
        HttpRequest::try_from(request).expect("smithy request")
    }

    #[tokio::test]
    async fn an_answer_comes_back_with_its_status_headers_and_body() {
        let addr = server(b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/x-amz-json-1.0\r\nx-amzn-requestid: r-1\r\ncontent-length: 14\r\n\r\n{\"__type\":\"x\"}").await;
        let response = connector().call(request(addr, "{}")).await.expect("an answer");
        assert_eq!(response.status().as_u16(), 400);
        assert_eq!(response.headers().get("x-amzn-requestid"), Some("r-1"));
        let body = response.into_body().collect().await.expect("body");
        assert_eq!(&body.to_bytes()[..], b"{\"__type\":\"x\"}");
    }

    #[tokio::test]
    async fn a_refused_connection_is_an_io_failure_and_a_cut_off_answer_an_error() {
        // Nothing listens on a port just freed: refused, an I/O failure the SDK retries.
        let free = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind").local_addr().expect("addr");
        let refused = connector().call(request(free, "{}")).await.expect_err("refused");
        assert!(refused.is_io(), "{refused:?}");
        // An answer cut off before its end is an error, not a short body.
        let addr = server(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nshort").await;
        let response = connector().call(request(addr, "{}")).await.expect("the head arrives");
        assert!(response.into_body().collect().await.is_err());
    }
}
