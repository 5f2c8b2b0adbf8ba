//! The shop's own site (docs/site.md): the user-token routes `/v1/me/*`, what they let a token
//! reach and refuse, read-all and archive pushed on the live feed, CORS for the tenant's allowed
//! origins only, and the hosted preferences page a marketing email links to.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use crate::server::{Backend, Options, Server};

const WAIT: Duration = Duration::from_secs(90);

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Opens the live feed at `url` as a browser page of `origin` would (its `Origin` header): the
/// socket, or the handshake's refusal status.
pub async fn feed_from(url: &str, origin: Option<&str>) -> anyhow::Result<Result<Socket, u16>> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut req = url.into_client_request()?;
    if let Some(o) = origin {
        req.headers_mut().insert("origin", o.parse()?);
    }
    match tokio_tungstenite::connect_async(req).await {
        Ok((socket, _)) => Ok(Ok(socket)),
        Err(tokio_tungstenite::tungstenite::Error::Http(res)) => Ok(Err(res.status().as_u16())),
        Err(e) => Err(e.into()),
    }
}

/// A user token of `user`, got with `key` (a tenant's API key).
async fn user_token(s: &Server, key: &str, user: &str) -> anyhow::Result<String> {
    let (st, v) = s.call_as(key, "POST", &format!("/v1/users/{user}/inbox/token"), None).await?;
    assert_eq!(st, 200, "{v}");
    Ok(v["token"].as_str().unwrap().to_owned())
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

/// Sends `n` in-app messages to `user` and waits until its inbox holds `total`.
async fn inbox_of(s: &Server, user: &str, tag: &str, n: usize, total: usize) -> anyhow::Result<()> {
    for i in 0..n {
        let (st, v) = s
            .call(
                "POST",
                "/v1/notifications",
                Some(json!({"idempotency_key": format!("{tag}-{user}-{i}"), "recipients": {"user_ids": [user]},
                    "template_id": "hello", "params": {"n": format!("{tag}{i}")}, "category": "transactional", "channels": ["inapp"]})),
            )
            .await?;
        assert_eq!(st, 202, "{v}");
    }
    s.eventually(WAIT, &format!("{total} messages in {user}'s inbox"), || async {
        let (_, v) = s.call("GET", &format!("/v1/users/{user}/inbox"), None).await?;
        Ok((v["items"].as_array().map_or(0, Vec::len) >= total).then_some(()))
    })
    .await
}

async fn hello_template(s: &Server, key: &str) -> anyhow::Result<()> {
    let body =
        json!({"default_locale": "en", "locales": {"en": {"inapp_title": "Hello", "inapp_body": "Message {{ n }}"}}});
    let (st, v) = s.call_as(key, "PUT", "/v1/templates/hello", Some(body)).await?;
    assert_eq!(st, 200, "{v}");
    Ok(())
}

fn is_problem(v: &Value, code: &str) -> bool {
    v["code"] == code && v["status"].is_u64() && v["title"].is_string()
}

/// Every user-token route with the token of its user; paging; read, read-all and archive move
/// the unread count and are pushed live to every connection of the user; archived messages are
/// no longer listed.
pub async fn a_user_token_reaches_its_users_inbox_and_the_changes_are_live(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, Options::default()).await?;
    hello_template(&s, &s.key).await?;
    inbox_of(&s, "alice", "a", 4, 4).await?;
    let token = user_token(&s, &s.key, "alice").await?;

    // Paged, newest first, with the unread count.
    let (st, page) = s.call_as(&token, "GET", "/v1/me/inbox?limit=3", None).await?;
    assert_eq!(st, 200, "{page}");
    assert_eq!(page["unread_count"], 4, "{page}");
    let items = page["items"].as_array().unwrap().clone();
    assert_eq!(items.len(), 3, "{page}");
    let ids: Vec<String> = items.iter().map(|m| m["message_id"].as_str().unwrap().to_owned()).collect();
    assert!(ids.windows(2).all(|w| w[0] > w[1]), "newest first: {ids:?}");
    let cursor = page["next_cursor"].as_str().unwrap().to_owned();
    let (_, rest) = s.call_as(&token, "GET", &format!("/v1/me/inbox?limit=3&cursor={cursor}"), None).await?;
    assert_eq!(rest["items"].as_array().unwrap().len(), 1, "{rest}");
    let oldest = rest["items"][0]["message_id"].as_str().unwrap().to_owned();
    let (tenant_view_st, tenant_view) = s.call("GET", "/v1/users/alice/inbox", None).await?;
    assert_eq!(tenant_view_st, 200);
    assert_eq!(tenant_view["items"][0]["message_id"], ids[0].as_str(), "the same inbox as the tenant's route");

    // Two tabs of the user on the live feed.
    let ws = |t: &str| format!("{}/v1/ws?token={t}", s.base.replace("http://", "ws://"));
    let (mut tab1, _) = tokio_tungstenite::connect_async(ws(&token)).await?;
    // A tenant without allowed origins: a page of any origin opens the feed (as before lists).
    let mut tab2 = feed_from(&ws(&token), Some("https://anywhere.example")).await?.expect("no list: any origin");
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Read one.
    let (st, v) = s.call_as(&token, "POST", &format!("/v1/me/inbox/{}/read", ids[0]), None).await?;
    assert_eq!((st, &v["unread_count"]), (200, &json!(3)), "{v}");
    for tab in [&mut tab1, &mut tab2] {
        assert_eq!(next_event(tab).await?, json!({"type": "inbox.read", "message_id": ids[0], "unread_count": 3}));
    }

    // Archive an unread one: counted down, pushed, no longer listed; again changes nothing.
    let (st, v) = s.call_as(&token, "POST", &format!("/v1/me/inbox/{}/archive", ids[1]), None).await?;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v, json!({"message_id": ids[1], "changed": 1, "unread_count": 2}));
    for tab in [&mut tab1, &mut tab2] {
        assert_eq!(next_event(tab).await?, json!({"type": "inbox.archived", "message_id": ids[1], "unread_count": 2}));
    }
    let (_, v) = s.call_as(&token, "POST", &format!("/v1/me/inbox/{}/archive", ids[1]), None).await?;
    assert_eq!(v, json!({"message_id": ids[1], "changed": 0, "unread_count": 2}), "archiving twice");
    let (_, page) = s.call_as(&token, "GET", "/v1/me/inbox?limit=3", None).await?;
    let listed: Vec<&str> =
        page["items"].as_array().unwrap().iter().map(|m| m["message_id"].as_str().unwrap()).collect();
    assert_eq!(listed, vec![ids[0].as_str(), ids[2].as_str(), oldest.as_str()], "the archived one is hidden: {page}");
    assert!(page["items"].as_array().unwrap().iter().all(|m| m.get("archived").is_none()), "{page}");
    // A page that skipped an archived message still ends where the inbox does.
    let (_, two) = s.call_as(&token, "GET", "/v1/me/inbox?limit=2", None).await?;
    let next = two["next_cursor"].as_str().unwrap().to_owned();
    let (_, after) = s.call_as(&token, "GET", &format!("/v1/me/inbox?limit=2&cursor={next}"), None).await?;
    assert_eq!(after["items"][0]["message_id"], oldest.as_str(), "{two} then {after}");

    // Read all: the two left unread, each pushed, the count down to 0.
    let (st, v) = s.call_as(&token, "POST", "/v1/me/inbox/read-all", None).await?;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v, json!({"changed": 2, "unread_count": 0}));
    for tab in [&mut tab1, &mut tab2] {
        let mut counts = Vec::new();
        for _ in 0..2 {
            let e = next_event(tab).await?;
            assert_eq!(e["type"], "inbox.read", "{e}");
            counts.push(e["unread_count"].as_i64().unwrap());
        }
        assert_eq!(counts.last(), Some(&0), "the last push says 0: {counts:?}");
    }
    let (_, page) = s.call_as(&token, "GET", "/v1/me/inbox", None).await?;
    assert_eq!(page["unread_count"], 0);
    assert!(page["items"].as_array().unwrap().iter().all(|m| m["read"] == true), "{page}");

    // The tenant's routes do the same for the tenant's backend.
    inbox_of(&s, "alice", "b", 2, 5).await?;
    let (_, page) = s.call("GET", "/v1/users/alice/inbox", None).await?;
    assert_eq!(page["unread_count"], 2, "{page}");
    let newest = page["items"][0]["message_id"].as_str().unwrap().to_owned();
    let (st, v) = s.call("POST", &format!("/v1/users/alice/inbox/{newest}/archive"), None).await?;
    assert_eq!((st, &v["unread_count"]), (200, &json!(1)), "{v}");
    let (st, v) = s.call("POST", "/v1/users/alice/inbox/read-all", None).await?;
    assert_eq!((st, &v["changed"], &v["unread_count"]), (200, &json!(1), &json!(0)), "{v}");
    let (st, v) = s.call("POST", "/v1/users/alice/inbox/no-such-message/archive", None).await?;
    assert_eq!(st, 404, "{v}");
    Ok(())
}

/// A user token reaches its own user only: not another user's messages, not another tenant's
/// user of the same id, no API-key route; an API key does not open `/v1/me`; forged, tampered
/// and expired tokens are refused. Every refusal is problem JSON naming `Authorization`.
pub async fn a_user_token_reaches_nothing_else(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, Options { manual_clock: true, ..Options::default() }).await?;
    let globex = s.other_tenant_key();
    hello_template(&s, &s.key).await?;
    hello_template(&s, &globex).await?;
    inbox_of(&s, "alice", "a", 1, 1).await?;
    inbox_of(&s, "bob", "b", 1, 1).await?;
    let (_, alice_inbox) = s.call("GET", "/v1/users/alice/inbox", None).await?;
    let alices = alice_inbox["items"][0]["message_id"].as_str().unwrap().to_owned();
    let alice = user_token(&s, &s.key, "alice").await?;
    let bob = user_token(&s, &s.key, "bob").await?;
    let globex_alice = user_token(&s, &globex, "alice").await?;

    // Bob's token: Bob's inbox only; Alice's message is not found for it.
    let (_, page) = s.call_as(&bob, "GET", "/v1/me/inbox", None).await?;
    assert_eq!(page["items"].as_array().unwrap().len(), 1);
    assert_ne!(page["items"][0]["message_id"], alices.as_str());
    for path in [format!("/v1/me/inbox/{alices}/read"), format!("/v1/me/inbox/{alices}/archive")] {
        let (st, v) = s.call_as(&bob, "POST", &path, None).await?;
        assert_eq!(st, 404, "{path} with another user's token: {v}");
        assert!(is_problem(&v, "not_found"), "{v}");
    }
    // Another tenant's user of the same id: its own, empty inbox and default preferences.
    let (_, page) = s.call_as(&globex_alice, "GET", "/v1/me/inbox", None).await?;
    assert_eq!((page["items"].as_array().map(Vec::len), &page["unread_count"]), (Some(0), &json!(0)), "{page}");
    let (st, v) = s.call_as(&globex_alice, "POST", "/v1/me/inbox/read-all", None).await?;
    assert_eq!((st, &v["changed"]), (200, &json!(0)), "{v}");
    let (_, p) =
        s.call_as(&globex_alice, "PUT", "/v1/me/preferences", Some(json!({"channels": {"sms": false}}))).await?;
    assert_eq!(p["channels"]["sms"], false, "{p}");
    let (_, p) = s.call("GET", "/v1/users/alice/preferences", None).await?;
    assert_ne!(p["channels"]["sms"], false, "another tenant's token changed acme's alice: {p}");
    let (_, page) = s.call("GET", "/v1/users/alice/inbox", None).await?;
    assert_eq!(page["unread_count"], 1, "no other token read Alice's message: {page}");

    // An API key does not open /v1/me; a user token opens no API-key route.
    for key in [&s.key, &globex, &s.ops_key] {
        let (st, v) = s.call_as(key, "GET", "/v1/me/inbox", None).await?;
        assert_eq!(st, 401, "an API key on /v1/me: {v}");
        assert!(is_problem(&v, "invalid_token") && v["field"] == "Authorization", "{v}");
    }
    for (method, path) in [
        ("GET", "/v1/users/alice/inbox".to_owned()),
        ("GET", "/v1/users/alice/preferences".to_owned()),
        ("POST", format!("/v1/users/alice/inbox/{alices}/read")),
        ("POST", "/v1/users/alice/inbox/token".to_owned()),
        ("GET", "/v1/settings/allowed-origins".to_owned()),
        ("GET", "/v1/workflows".to_owned()),
        ("GET", "/v1/ops/queues".to_owned()),
    ] {
        let (st, v) = s.call_as(&alice, method, &path, None).await?;
        assert_eq!(st, 401, "{method} {path} with a user token: {v}");
        assert!(is_problem(&v, "unauthorized") && v["field"] == "Authorization", "{v}");
        assert!(v["detail"].as_str().unwrap().contains("/v1/me"), "it says what a user token opens: {v}");
    }
    // Forged, tampered, missing.
    let tampered = format!("{}x", alice);
    for token in ["not-a-token", tampered.as_str(), &alice.replace('.', "..")] {
        let (st, v) = s.call_as(token, "GET", "/v1/me/inbox", None).await?;
        assert_eq!(st, 401, "{token}: {v}");
        assert!(is_problem(&v, "invalid_token"), "{v}");
    }
    let res = s.http.get(format!("{}/v1/me/preferences", s.base)).send().await?;
    assert_eq!(res.status().as_u16(), 401);
    let v: Value = res.json().await?;
    assert!(is_problem(&v, "unauthorized") && v["field"] == "Authorization", "{v}");
    // Expired: the token lives 15 minutes. A page of an allowed origin can read that 401 (and
    // get a new token); another origin cannot.
    let (st, v) =
        s.call("PUT", "/v1/settings/allowed-origins", Some(json!({"origins": ["https://shop.example"]}))).await?;
    assert_eq!(st, 200, "{v}");
    s.advance_and_tick(16 * 60).await?;
    let (st, v) = s.call_as(&alice, "GET", "/v1/me/inbox", None).await?;
    assert_eq!(st, 401, "an expired token: {v}");
    assert!(v["detail"].as_str().unwrap().contains("expired"), "{v}");
    let res = s
        .http
        .get(format!("{}/v1/me/inbox", s.base))
        .bearer_auth(&alice)
        .header("origin", "https://shop.example")
        .send()
        .await?;
    assert_eq!(res.status().as_u16(), 401);
    assert_eq!(
        res.headers().get("access-control-allow-origin").and_then(|v| v.to_str().ok()),
        Some("https://shop.example")
    );
    let res = s
        .http
        .get(format!("{}/v1/me/inbox", s.base))
        .bearer_auth(&alice)
        .header("origin", "https://evil.example")
        .send()
        .await?;
    assert_eq!(res.status().as_u16(), 403);
    assert!(res.headers().get("access-control-allow-origin").is_none());
    Ok(())
}

/// `GET|PUT /v1/me/preferences`: the preferences in the tenant route's shape, and the catalog
/// with the tenant's workflows, required ones marked; a required workflow cannot be turned off;
/// a workflow turned off on a channel stops the next send on it.
pub async fn my_preferences_show_the_workflows_and_lock_required_ones(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, Options::default()).await?;
    let tpl = json!({"default_locale": "en", "locales": {"en": {"inapp_title": "Hi", "inapp_body": "Hi",
        "email_subject": "Hi", "email_body": "Hi"}}});
    assert_eq!(s.call("PUT", "/v1/templates/t", Some(tpl)).await?.0, 200);
    // In-app, then email: two send steps, each on its own channel.
    let wf = |name: &str, required: bool| {
        json!({"name": name, "category": "transactional", "required": required,
            "steps": [{"type": "send", "channel": "inapp", "template_id": "t"}, {"type": "send", "channel": "email", "template_id": "t"}]})
    };
    assert_eq!(s.call("PUT", "/v1/workflows/comments", Some(wf("Comments", false))).await?.0, 200);
    assert_eq!(s.call("PUT", "/v1/workflows/otp", Some(wf("Sign-in codes", true))).await?.0, 200);
    let (st, v) = s.call("PUT", "/v1/users/carol", Some(json!({"email": "carol@example.com"}))).await?;
    assert_eq!(st, 200, "{v}");
    let token = user_token(&s, &s.key, "carol").await?;

    let (st, mine) = s.call_as(&token, "GET", "/v1/me/preferences", None).await?;
    assert_eq!(st, 200, "{mine}");
    let (_, theirs) = s.call("GET", "/v1/users/carol/preferences", None).await?;
    for (k, v) in theirs.as_object().unwrap() {
        assert_eq!(&mine[k], v, "{k}: the tenant route's shape");
    }
    assert_eq!(mine["catalog"]["channels"], json!(["email", "sms", "push", "inapp"]));
    assert_eq!(
        mine["catalog"]["categories"],
        json!([{"category": "transactional", "required": true}, {"category": "marketing", "required": false}])
    );
    assert_eq!(
        mine["catalog"]["workflows"],
        json!([
            {"workflow_id": "comments", "name": "Comments", "category": "transactional", "required": false, "channels": ["email", "inapp"]},
            {"workflow_id": "otp", "name": "Sign-in codes", "category": "transactional", "required": true, "channels": ["email", "inapp"]},
        ])
    );

    let (st, v) =
        s.call_as(&token, "PUT", "/v1/me/preferences", Some(json!({"workflows": {"otp": {"email": false}}}))).await?;
    assert_eq!(st, 422, "{v}");
    assert_eq!((v["code"].as_str(), v["field"].as_str()), (Some("invalid_field"), Some("workflows.otp")), "{v}");
    let (st, v) = s.call_as(&token, "PUT", "/v1/me/preferences", Some(json!({"colour": "red"}))).await?;
    assert_eq!((st, v["field"].as_str()), (400, Some("colour")), "{v}");
    let (st, v) = s
        .call_as(&token, "PUT", "/v1/me/preferences", Some(json!({"workflows": {"comments": {"email": false}}})))
        .await?;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["workflows"]["comments"], json!({"email": false}), "{v}");
    assert!(v["catalog"]["workflows"].is_array(), "{v}");
    let (_, theirs) = s.call("GET", "/v1/users/carol/preferences", None).await?;
    assert_eq!(theirs["workflows"]["comments"], json!({"email": false}), "the tenant sees the user's choice");

    // The next send of that workflow skips email and goes in-app; the required one still emails.
    let send = |wf: &str| {
        let s = &s;
        let wf = wf.to_owned();
        async move {
            let (st, v) = s
                .call(
                    "POST",
                    "/v1/notifications",
                    Some(json!({"recipients": {"user_ids": ["carol"]}, "workflow_id": wf})),
                )
                .await?;
            assert_eq!(st, 202, "{v}");
            anyhow::Ok(v["notification_id"].as_str().unwrap().to_owned())
        }
    };
    let comments = send("comments").await?;
    let otp = send("otp").await?;
    let mut channels_of = Vec::new();
    for id in [&comments, &otp] {
        s.eventually(WAIT, &format!("{id} ended"), || async {
            let (_, v) = s.call("GET", &format!("/v1/notifications/{id}"), None).await?;
            Ok(["completed", "completed_with_failures", "failed"]
                .contains(&v["status"].as_str().unwrap_or(""))
                .then_some(()))
        })
        .await?;
        let (_, d) = s.call("GET", &format!("/v1/notifications/{id}/deliveries"), None).await?;
        let items = d["items"].as_array().cloned().unwrap_or_default();
        let sent = items.iter().filter(|x| x["status"] == "sent");
        let mut channels: Vec<String> = sent.filter_map(|x| x["channel"].as_str().map(str::to_owned)).collect();
        channels.sort();
        channels_of.push(channels);
    }
    assert_eq!(channels_of[0], vec!["inapp"], "the workflow the user turned off on email: in-app only");
    assert_eq!(channels_of[1], vec!["email", "inapp"], "the required workflow: every channel");
    Ok(())
}

fn header(res: &reqwest::Response, name: &str) -> Option<String> {
    res.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
}

fn has_cors(res: &reqwest::Response) -> bool {
    res.headers().keys().any(|k| k.as_str().starts_with("access-control-"))
}

/// `PUT /v1/settings/allowed-origins` names a bad origin; `/v1/me` answers CORS to the
/// tenant's origins only; another origin, or another tenant's origin, gets no CORS header and
/// its request does not run; no other route ever answers CORS.
pub async fn cors_answers_only_the_tenants_origins_on_the_user_routes(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, Options::default()).await?;
    let globex = s.other_tenant_key();
    let (st, v) = s
        .call(
            "PUT",
            "/v1/settings/allowed-origins",
            Some(json!({"origins": ["https://shop.example", "https://shop.example/app"]})),
        )
        .await?;
    assert_eq!(st, 422, "{v}");
    assert_eq!(v["field"], "origins[1]", "{v}");
    for bad in ["*", "https://*.shop.example", "shop.example", "ftp://shop.example"] {
        let (st, v) = s.call("PUT", "/v1/settings/allowed-origins", Some(json!({"origins": [bad]}))).await?;
        assert_eq!((st, v["field"].as_str()), (422, Some("origins[0]")), "{bad}: {v}");
    }
    let (st, v) = s
        .call(
            "PUT",
            "/v1/settings/allowed-origins",
            Some(json!({"origins": ["https://Shop.Example:443", "http://localhost:8080"]})),
        )
        .await?;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["origins"], json!(["https://shop.example", "http://localhost:8080"]));
    let (_, v) = s.call("GET", "/v1/settings/allowed-origins", None).await?;
    assert_eq!(v["origins"], json!(["https://shop.example", "http://localhost:8080"]));
    let (_, v) = s.call_as(&globex, "GET", "/v1/settings/allowed-origins", None).await?;
    assert_eq!(v["origins"], json!([]), "another tenant's list is its own");
    let (st, v) = s
        .call_as(&globex, "PUT", "/v1/settings/allowed-origins", Some(json!({"origins": ["https://globex.example"]})))
        .await?;
    assert_eq!(st, 200, "{v}");

    hello_template(&s, &s.key).await?;
    inbox_of(&s, "alice", "a", 1, 1).await?;
    let token = user_token(&s, &s.key, "alice").await?;
    let globex_token = user_token(&s, &globex, "alice").await?;
    let url = |p: &str| format!("{}{p}", s.base);

    // The preflight: no token, so the methods and headers for a well-formed origin.
    let res = s
        .http
        .request(reqwest::Method::OPTIONS, url("/v1/me/inbox/read-all"))
        .header("origin", "https://shop.example")
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "authorization, content-type")
        .send()
        .await?;
    assert_eq!(res.status().as_u16(), 204);
    assert_eq!(header(&res, "access-control-allow-origin").as_deref(), Some("https://shop.example"));
    let methods = header(&res, "access-control-allow-methods").unwrap();
    assert!(methods.contains("POST") && methods.contains("PUT") && methods.contains("GET"), "{methods}");
    let headers = header(&res, "access-control-allow-headers").unwrap().to_ascii_lowercase();
    assert!(headers.contains("authorization") && headers.contains("content-type"), "{headers}");
    assert_eq!(header(&res, "access-control-max-age").as_deref(), Some("600"));
    assert!(header(&res, "vary").unwrap().contains("Origin"));

    // The request: the allowed origin reads the answer.
    for origin in ["https://shop.example", "http://localhost:8080"] {
        let res = s.http.get(url("/v1/me/inbox")).bearer_auth(&token).header("origin", origin).send().await?;
        assert_eq!(res.status().as_u16(), 200);
        assert_eq!(header(&res, "access-control-allow-origin").as_deref(), Some(origin));
        assert!(header(&res, "vary").unwrap().contains("Origin"));
        let v: Value = res.json().await?;
        assert_eq!(v["unread_count"], 1);
    }
    // A refusal of an allowed origin's request is readable too (a 404 here; an expired token's
    // 401 in a_user_token_reaches_nothing_else).
    let res = s
        .http
        .post(url("/v1/me/inbox/nope/read"))
        .bearer_auth(&token)
        .header("origin", "https://shop.example")
        .send()
        .await?;
    assert_eq!(res.status().as_u16(), 404);
    assert_eq!(header(&res, "access-control-allow-origin").as_deref(), Some("https://shop.example"));

    // Another origin, or another tenant's origin with this tenant's token: refused before the
    // route runs, no CORS header; read-all changed nothing.
    for (origin, tok) in [
        ("https://evil.example", &token),
        ("https://globex.example", &token),
        ("https://shop.example", &globex_token),
        ("null", &token),
    ] {
        let res = s.http.post(url("/v1/me/inbox/read-all")).bearer_auth(tok).header("origin", origin).send().await?;
        assert_eq!(res.status().as_u16(), 403, "{origin}");
        assert!(!has_cors(&res), "{origin}: {:?}", res.headers());
        let v: Value = res.json().await?;
        assert!(is_problem(&v, "origin_not_allowed") && v["field"] == "Origin", "{v}");
    }
    let (_, v) = s.call("GET", "/v1/users/alice/inbox", None).await?;
    assert_eq!(v["unread_count"], 1, "a refused origin's read-all did not run");
    // A forged token: the route's 401, without CORS.
    let res =
        s.http.get(url("/v1/me/inbox")).bearer_auth("forged").header("origin", "https://shop.example").send().await?;
    assert_eq!(res.status().as_u16(), 401);
    assert!(!has_cors(&res));
    // A server's request (no Origin) passes as it is, without CORS.
    let res = s.http.get(url("/v1/me/inbox")).bearer_auth(&token).send().await?;
    assert_eq!(res.status().as_u16(), 200);
    assert!(!has_cors(&res));

    // The live feed's handshake (a WebSocket: no CORS) checks the origin once the tenant has
    // a list: its origins and non-browser clients get in, another origin's page is refused.
    let ws = format!("{}/v1/ws?token={token}", s.base.replace("http://", "ws://"));
    assert!(feed_from(&ws, Some("https://shop.example")).await?.is_ok(), "an allowed origin");
    assert!(feed_from(&ws, None).await?.is_ok(), "no Origin: not a browser");
    assert_eq!(feed_from(&ws, Some("https://evil.example")).await?.err(), Some(403), "another origin");
    let globex_ws = format!("{}/v1/ws?token={globex_token}", s.base.replace("http://", "ws://"));
    assert_eq!(feed_from(&globex_ws, Some("https://shop.example")).await?.err(), Some(403), "another tenant's origin");

    // Every other route: no CORS, even for an allowed origin; its OPTIONS stays 405.
    for path in ["/v1/users/alice/inbox", "/v1/settings/allowed-origins", "/openapi.json", "/healthz", "/u/x", "/p/x"] {
        let res = s.http.get(url(path)).bearer_auth(&s.key).header("origin", "https://shop.example").send().await?;
        assert!(!has_cors(&res), "GET {path}: {:?}", res.headers());
        let res = s
            .http
            .request(reqwest::Method::OPTIONS, url(path))
            .header("origin", "https://shop.example")
            .header("access-control-request-method", "GET")
            .send()
            .await?;
        assert!(!has_cors(&res), "OPTIONS {path}: {:?}", res.headers());
        assert_eq!(res.status().as_u16(), 405, "OPTIONS {path}");
    }
    let res = s
        .http
        .post(url("/v1/users/alice/inbox/token"))
        .bearer_auth(&s.key)
        .header("origin", "https://shop.example")
        .send()
        .await?;
    assert_eq!(res.status().as_u16(), 200);
    assert!(!has_cors(&res), "the token route is the shop backend's, never a page's");
    Ok(())
}

/// The preferences link of a marketing email, beside the unchanged RFC 8058 headers.
fn preferences_path(send: &Value, base_hint: &str) -> String {
    let body = send["body"].as_str().unwrap_or_default();
    let at = body.find("/p/").unwrap_or_else(|| panic!("{base_hint}: no preferences link in the text part: {body}"));
    let token: String = body[at + 3..].chars().take_while(|c| !c.is_whitespace()).collect();
    let html = send["html"].as_str().unwrap_or_default();
    assert!(html.contains(&format!("/p/{token}\"")), "the HTML part has the same link: {html}");
    format!("/p/{token}")
}

/// Every marketing email carries a signed link to the hosted preferences page beside the
/// one-click unsubscribe; the page shows the user's choices (required workflows locked, the
/// tenant's words escaped), saves the form, and answers a forged or expired link with a page
/// that says so.
pub async fn the_hosted_preferences_page_renders_saves_and_refuses_forged_links(
    backend: Backend,
) -> anyhow::Result<()> {
    let s = Server::start(backend, Options::default()).await?;
    let tpl = json!({"default_locale": "en", "locales": {"en": {"email_subject": "Sale", "email_body": "Big sale at https://shop.example/sale",
        "inapp_title": "Hi", "inapp_body": "Hi"}}});
    assert_eq!(s.call("PUT", "/v1/templates/promo", Some(tpl)).await?.0, 200);
    let wf = |name: &str, required: bool| {
        json!({"name": name, "category": "transactional", "required": required,
            "steps": [{"type": "send", "channels": ["inapp", "email"], "template_id": "promo"}]})
    };
    assert_eq!(s.call("PUT", "/v1/workflows/news", Some(wf("News <b>&</b> \"tips\"", false))).await?.0, 200);
    assert_eq!(s.call("PUT", "/v1/workflows/otp", Some(wf("Codes", true))).await?.0, 200);
    assert_eq!(s.call("PUT", "/v1/users/dan", Some(json!({"email": "dan@example.com"}))).await?.0, 200);
    let send = |key: &str, category: &str| {
        let s = &s;
        let body = json!({"idempotency_key": key, "recipients": {"user_ids": ["dan"]}, "template_id": "promo",
            "category": category, "channels": ["email"]});
        async move {
            let (st, v) = s.call("POST", "/v1/notifications", Some(body)).await?;
            assert_eq!(st, 202, "{v}");
            let id = v["notification_id"].as_str().unwrap().to_owned();
            s.eventually(WAIT, "the email sent", || async {
                Ok(s.sends(&id).await?.into_iter().find(|x| x["channel"] == "email"))
            })
            .await
        }
    };
    let mail = send("promo-1", "marketing").await?;
    let headers = mail["headers"].as_array().cloned().unwrap_or_default();
    let h = |name: &str| headers.iter().find(|x| x[0] == name).and_then(|x| x[1].as_str()).map(str::to_owned);
    assert_eq!(h("List-Unsubscribe-Post").as_deref(), Some("List-Unsubscribe=One-Click"), "RFC 8058 stays");
    assert!(h("List-Unsubscribe").is_some_and(|l| l.contains("/u/")), "{headers:?}");
    let page_path = preferences_path(&mail, "marketing");
    let transactional = send("receipt-1", "transactional").await?;
    assert!(!transactional["body"].as_str().unwrap_or_default().contains("/p/"), "only marketing carries it");

    // The page: every category, channel and workflow × channel, the required workflow locked.
    let res = s.http.get(format!("{}{page_path}", s.base)).send().await?;
    assert_eq!(res.status().as_u16(), 200);
    assert!(header(&res, "content-type").unwrap().starts_with("text/html"));
    assert_eq!(header(&res, "referrer-policy").as_deref(), Some("no-referrer"), "the path holds the token");
    assert!(header(&res, "content-security-policy").unwrap().contains("form-action 'self'"));
    assert!(!has_cors(&res));
    let html = res.text().await?;
    assert!(html.contains("News &lt;b&gt;&amp;&lt;/b&gt; &quot;tips&quot;"), "the tenant's words escaped: {html}");
    assert!(!html.contains("<b>&</b>"), "{html}");
    assert!(html.contains("name=\"category.marketing\" aria-label=\"marketing\" checked>"), "{html}");
    assert!(
        html.contains("name=\"category.transactional\" aria-label=\"transactional\" checked disabled>"),
        "locked: {html}"
    );
    assert!(html.contains("name=\"workflow.news.email\" aria-label=\"News &lt;b&gt;&amp;&lt;/b&gt; &quot;tips&quot; by email\" checked>"), "{html}");
    assert!(
        html.contains("name=\"workflow.otp.email\" aria-label=\"Codes by email\" checked disabled>"),
        "locked: {html}"
    );
    assert!(html.contains("<form method=post>"), "{html}");

    // Saving: a box not sent is off; the required workflow stays on whatever is posted.
    let form = "save=1&channel.email=on&channel.sms=on&channel.push=on&channel.inapp=on\
                &workflow.news.inapp=on&workflow.otp.email=on";
    let res = s
        .http
        .post(format!("{}{page_path}", s.base))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form.replace("workflow.otp.email=on", ""))
        .send()
        .await?;
    assert_eq!(res.status().as_u16(), 200);
    let html = res.text().await?;
    assert!(html.contains("Saved."), "{html}");
    assert!(html.contains("name=\"category.marketing\" aria-label=\"marketing\">"), "now off: {html}");
    let (_, p) = s.call("GET", "/v1/users/dan/preferences", None).await?;
    assert_eq!(p["categories"]["marketing"], false, "{p}");
    assert!(p["categories"].get("transactional").is_none(), "a locked category is never written: {p}");
    assert_eq!(p["workflows"]["news"], json!({"email": false, "inapp": true}), "{p}");
    assert!(p["workflows"].get("otp").is_none(), "a required workflow is never written: {p}");
    // The marketing category off stops the next marketing email.
    let (st, v) = s
        .call(
            "POST",
            "/v1/notifications",
            Some(json!({"idempotency_key": "promo-2", "recipients": {"user_ids": ["dan"]}, "template_id": "promo",
                "category": "marketing", "channels": ["email"]})),
        )
        .await?;
    assert_eq!(st, 202, "{v}");
    let id = v["notification_id"].as_str().unwrap().to_owned();
    let d = s
        .eventually(WAIT, "the marketing email suppressed", || async {
            let (_, v) = s.call("GET", &format!("/v1/notifications/{id}/deliveries"), None).await?;
            Ok(v["items"].as_array().and_then(|i| i.first()).filter(|d| d["status"] == "suppressed").cloned())
        })
        .await?;
    assert_eq!(d["reason"], "category_off", "{d}");

    // Not the form: 400, a page, nothing changed.
    let res = s.http.post(format!("{}{page_path}", s.base)).body("x=1").send().await?;
    assert_eq!(res.status().as_u16(), 400);
    assert!(header(&res, "content-type").unwrap().starts_with("text/html"));
    // Forged, tampered, another kind's token (the unsubscribe link's): a clear page, never a 500.
    let unsubscribe_token = h("List-Unsubscribe").unwrap();
    let unsubscribe_token = unsubscribe_token.trim_end_matches('>').rsplit("/u/").next().unwrap().to_owned();
    for path in ["/p/forged".to_owned(), format!("{page_path}x"), format!("/p/{unsubscribe_token}")] {
        for method in [reqwest::Method::GET, reqwest::Method::POST] {
            let res = s.http.request(method.clone(), format!("{}{path}", s.base)).body("save=1").send().await?;
            assert_eq!(res.status().as_u16(), 404, "{method} {path}");
            assert!(header(&res, "content-type").unwrap().starts_with("text/html"));
            let html = res.text().await?;
            assert!(html.contains("This link is not valid"), "{html}");
        }
    }
    let (_, after) = s.call("GET", "/v1/users/dan/preferences", None).await?;
    assert_eq!(after, p, "the refused posts changed nothing");
    Ok(())
}
