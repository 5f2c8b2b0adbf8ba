//! The inbox's live feed over WebSocket (`GET /v1/ws?token=...`).

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use crate::server::{Backend, Options, Server};

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn token(s: &Server, user: &str) -> anyhow::Result<String> {
    let (st, v) = s.call("POST", &format!("/v1/users/{user}/inbox/token"), None).await?;
    assert_eq!(st, 200, "{v}");
    assert!(v["expires_at"].is_string());
    Ok(v["token"].as_str().unwrap().to_owned())
}

async fn connect(s: &Server, query: &str) -> anyhow::Result<Socket> {
    let url = format!("{}/v1/ws?{query}", s.base.replace("http://", "ws://"));
    let (socket, _) = tokio_tungstenite::connect_async(url).await?;
    Ok(socket)
}

async fn next_event(socket: &mut Socket) -> anyhow::Result<Value> {
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(60), socket.next())
            .await?
            .ok_or_else(|| anyhow::anyhow!("closed"))??;
        if let Message::Text(text) = msg {
            return Ok(serde_json::from_str(&text)?);
        }
    }
}

async fn nothing_arrives(socket: &mut Socket) -> bool {
    tokio::time::timeout(Duration::from_millis(800), socket.next()).await.is_err()
}

async fn send_inapp(s: &Server, key: &str, user: &str, n: &str) -> anyhow::Result<()> {
    let (st, v) = s
        .call(
            "POST",
            "/v1/notifications",
            Some(json!({"idempotency_key": key, "recipients": {"user_ids": [user]}, "template_id": "hello",
                        "params": {"n": n}, "category": "transactional", "channels": ["inapp"]})),
        )
        .await?;
    assert_eq!(st, 202, "{v}");
    Ok(())
}

pub async fn live_feed_reaches_every_connection_of_the_user_only(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, Options::default()).await?;
    let (st, v) = s
        .call(
            "PUT",
            "/v1/templates/hello",
            Some(json!({"default_locale": "en", "locales": {"en": {"inapp_title": "Hello", "inapp_body": "Message {{ n }}"}}})),
        )
        .await?;
    assert_eq!(st, 200, "{v}");
    let (ta, tb) = (token(&s, "alice").await?, token(&s, "bob").await?);
    let mut a1 = connect(&s, &format!("token={ta}")).await?;
    let mut a2 = connect(&s, &format!("token={ta}")).await?;
    let mut b1 = connect(&s, &format!("token={tb}")).await?;
    tokio::time::sleep(Duration::from_millis(200)).await;

    send_inapp(&s, "live-1", "alice", "1").await?;
    let mut message_id = String::new();
    for socket in [&mut a1, &mut a2] {
        let e = next_event(socket).await?;
        assert_eq!(e["type"], "inbox.message", "{e}");
        assert_eq!(e["message"]["title"], "Hello");
        assert_eq!(e["message"]["body"], "Message 1");
        assert_eq!(e["unread_count"], 1);
        message_id = e["message"]["message_id"].as_str().unwrap().to_owned();
    }
    assert!(nothing_arrives(&mut b1).await, "another user's connection gets nothing");

    let (st, _) = s.call("POST", &format!("/v1/users/alice/inbox/{message_id}/read"), None).await?;
    assert_eq!(st, 200);
    for socket in [&mut a1, &mut a2] {
        let e = next_event(socket).await?;
        assert_eq!(e, json!({"type": "inbox.read", "message_id": message_id, "unread_count": 0}));
    }

    // A client that reconnects asks for what it missed since the last message it saw.
    drop(a2);
    send_inapp(&s, "live-2", "alice", "2").await?;
    let e = next_event(&mut a1).await?;
    assert_eq!(e["message"]["body"], "Message 2");
    let mut again = connect(&s, &format!("token={ta}&since={message_id}")).await?;
    let e = next_event(&mut again).await?;
    assert_eq!(e["type"], "inbox.message");
    assert_eq!(e["message"]["body"], "Message 2", "the missed message is replayed");
    assert!(nothing_arrives(&mut again).await, "nothing older than `since` is replayed");
    Ok(())
}

pub async fn forged_or_missing_tokens_are_refused(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, Options::default()).await?;
    let good = token(&s, "alice").await?;
    for query in ["token=not-a-token".to_owned(), String::new(), format!("token={}x", good), good.replace('.', "..")] {
        let url = format!("{}/v1/ws?{query}", s.base.replace("http://", "ws://"));
        match tokio_tungstenite::connect_async(url).await {
            Err(tokio_tungstenite::tungstenite::Error::Http(res)) => assert_eq!(res.status(), 401),
            other => panic!("a bad token must be refused at connect: {:?}", other.map(|_| ())),
        }
    }
    // Tokens come only with an API key.
    let (st, _) = s.call_as("wrong", "POST", "/v1/users/alice/inbox/token", None).await?;
    assert_eq!(st, 401);
    Ok(())
}

pub async fn expired_tokens_are_refused(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, Options { manual_clock: true, ..Options::default() }).await?;
    let t = token(&s, "alice").await?;
    let (st, _) = s.call("POST", "/dev/clock/advance", Some(json!({"seconds": 16 * 60}))).await?;
    assert_eq!(st, 200);
    let url = format!("{}/v1/ws?token={t}", s.base.replace("http://", "ws://"));
    match tokio_tungstenite::connect_async(url).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(res)) => assert_eq!(res.status(), 401),
        other => panic!("an expired token must be refused: {:?}", other.map(|_| ())),
    }
    Ok(())
}
