//! Rate limits on the API (`TIDINGS_API_RATES`) and who may use `/dev/*`, through a real
//! `tidings serve` on both backends (on AWS the buckets are items of the table, as in Lambda).

use std::time::Duration;

use futures::future::join_all;
use serde_json::{Value, json};

use crate::server::{Backend, Options, Server};

const WAIT: Duration = Duration::from_secs(120);

fn with_rates(rates: &str) -> Options {
    let mut o = Options::default();
    o.env.retain(|(k, _)| *k != "TIDINGS_API_RATES");
    o.env.push(("TIDINGS_API_RATES", rates.into()));
    o
}

async fn otp_template_and_user(s: &Server, key: &str, user: &str) -> anyhow::Result<()> {
    let template = json!({"default_locale": "en", "locales": {"en": {
        "email_subject": "Your code", "email_body": "Your code is {{ code }}"}}});
    let (st, v) = s.call_as(key, "PUT", "/v1/templates/otp", Some(template)).await?;
    assert_eq!(st, 200, "{v}");
    let (st, v) = s.call_as(key, "PUT", &format!("/v1/users/{user}"), Some(json!({"email": "a@example.com"}))).await?;
    assert_eq!(st, 200, "{v}");
    Ok(())
}

fn otp(i: usize, user: &str) -> Value {
    json!({
        "idempotency_key": format!("otp-{user}-{i}"),
        "recipients": {"user_ids": [user]},
        "template_id": "otp",
        "params": {"code": format!("{:06}", 100_000 + i)},
        "category": "transactional",
        "channels": ["email"],
    })
}

/// Tenant acme sends ten times its rate of 5 a second: at most its bucket and a second's refill
/// are accepted, the rest answered 429 `rate_limited` with `Retry-After`, `RateLimit-Policy` and
/// `RateLimit`. Meanwhile tenant globex's OTPs are all accepted (202) and sent.
pub async fn one_tenant_over_its_rate_is_refused_while_another_tenants_otps_are_sent(
    backend: Backend,
) -> anyhow::Result<()> {
    let s = Server::start(backend, with_rates("send:5")).await?;
    let globex = s.other_tenant_key();
    otp_template_and_user(&s, &s.key, "flooder").await?;
    otp_template_and_user(&s, &globex, "shopper").await?;

    let flood = (0..50).map(|i| {
        let s = &s;
        async move {
            // 50 over about a second: ten times the rate.
            tokio::time::sleep(Duration::from_millis(20 * i as u64)).await;
            s.call_with_headers("POST", "/v1/notifications", otp(i, "flooder")).await
        }
    });
    let others = (0..3).map(|i| {
        let (s, globex) = (&s, &globex);
        async move {
            tokio::time::sleep(Duration::from_millis(300 * i as u64)).await;
            s.call_as(globex, "POST", "/v1/notifications", Some(otp(i, "shopper"))).await
        }
    });
    let (flood, others) = tokio::join!(join_all(flood), join_all(others));

    let mut accepted = 0;
    let mut refused = 0;
    for r in flood {
        let (st, headers, body) = r?;
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
        // An accepted send also took its recipients (one unit, from a bucket of 1,000).
        assert!(header("ratelimit-policy").starts_with("\"send\";q=5;w=1"), "{st} {body}");
        match st {
            202 => accepted += 1,
            429 => {
                refused += 1;
                assert_eq!(body["code"], "rate_limited", "{body}");
                let wait: u64 = header("retry-after").parse()?;
                assert!((1..=2).contains(&wait), "Retry-After {wait}");
                assert!(header("ratelimit").starts_with("\"send\";r=0;t="), "{}", header("ratelimit"));
            }
            other => panic!("a flood request answered {other}: {body}"),
        }
    }
    // The bucket of 5 and about a second's refill; the rest refused.
    assert!((5..=15).contains(&accepted), "{accepted} of 50 accepted at 5 a second");
    assert_eq!(accepted + refused, 50);

    let mut ids = Vec::new();
    for r in others {
        let (st, v) = r?;
        assert_eq!(st, 202, "globex's OTP: {v}");
        ids.push(v["notification_id"].as_str().unwrap_or_default().to_owned());
    }
    s.eventually(WAIT, "globex's three codes sent", || async {
        let mut sent = 0;
        for id in &ids {
            sent += usize::from(!s.sends(id).await?.is_empty());
        }
        Ok((sent == ids.len()).then_some(()))
    })
    .await?;
    Ok(())
}

/// One address requesting the tracking and unsubscribe routes many times over their limit of 5
/// a second is refused (429 with `Retry-After`), while the tenants' API calls from that same
/// address are not.
pub async fn a_public_route_flood_from_one_address_is_refused_and_the_api_is_not(
    backend: Backend,
) -> anyhow::Result<()> {
    let s = Server::start(backend, with_rates("public:5")).await?;
    let flood = (0..60).map(|i| {
        let s = &s;
        async move {
            let path = if i % 2 == 0 { "/t/o/forged-token" } else { "/u/forged-token" };
            let res = s.http.get(format!("{}{path}", s.base)).send().await?;
            let retry_after = res.headers().get("retry-after").is_some();
            let policy = res.headers().get("ratelimit-policy").and_then(|v| v.to_str().ok()).map(str::to_owned);
            anyhow::Ok((res.status().as_u16(), retry_after, policy))
        }
    });
    let api = (0..10).map(|i| {
        let s = &s;
        async move {
            let key = if i % 2 == 0 { s.key.clone() } else { s.other_tenant_key() };
            s.call_as(&key, "GET", "/v1/users/nobody", None).await
        }
    });
    let (flood, api) = tokio::join!(join_all(flood), join_all(api));
    let mut refused = 0;
    for r in flood {
        let (st, retry_after, policy) = r?;
        assert_eq!(policy.as_deref(), Some("\"public\";q=5;w=1"));
        if st == 429 {
            refused += 1;
            assert!(retry_after);
        }
    }
    assert!(refused >= 40, "only {refused} of 60 refused at 5 a second");
    for r in api {
        let (st, v) = r?;
        assert_eq!(st, 404, "the tenants' API is not limited by the address's flood: {v}");
    }
    Ok(())
}

/// Without `--dev`, `/dev/*` answers 401 without a key and 403 to a tenant's key on the embedded
/// backend (it shows every tenant's sent bodies), and does not exist on the AWS backend (404), not even with a
/// key. With `--dev` on loopback it answers without a key.
pub async fn dev_routes_need_a_key_or_dev_and_do_not_exist_on_aws_without_it(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, Options { dev: false, ..Options::default() }).await?;
    let (st, _, body) = s.raw("GET", "/dev/deliveries", "", None).await?;
    match backend {
        Backend::Embedded => {
            assert_eq!(st, 401, "{body}");
            let (st, _, body) = s.raw("GET", "/dev/deliveries", "", Some("not-a-key")).await?;
            assert_eq!(st, 401, "{body}");
            let (st, _, body) = s.raw("PUT", "/dev/providers/email", r#"{"mode":"fail_5xx"}"#, None).await?;
            assert_eq!(st, 401, "{body}");
            let (st, v) = s.call("GET", "/dev/deliveries", None).await?;
            assert_eq!(
                (st, v["code"].as_str()),
                (403, Some("operator_only")),
                "a tenant key saw every tenant's sends: {v}"
            );
            let (st, v) = s.ops("GET", "/dev/deliveries", None).await?;
            assert_eq!(st, 200, "an operator key may: {v}");
        }
        Backend::Aws => {
            assert_eq!(st, 404, "{body}");
            let (st, v) = s.call("GET", "/dev/deliveries", None).await?;
            assert_eq!(st, 404, "not even with a key: {v}");
            let (st, v) = s.call("PUT", "/dev/providers/email", Some(json!({"mode": "fail_5xx"}))).await?;
            assert_eq!(st, 404, "{v}");
        }
    }
    drop(s);
    let s = Server::start(backend, Options::default()).await?;
    let (st, _, body) = s.raw("GET", "/dev/deliveries", "", None).await?;
    assert_eq!(st, 200, "--dev on loopback: {body}");
    Ok(())
}

/// `serve --backend aws --dev` against an endpoint that is not on this machine refuses to
/// start, saying why; so does `--manual-clock` without `--dev` on AWS.
pub async fn aws_dev_against_a_remote_endpoint_refuses_to_start() -> anyhow::Result<()> {
    for (args, endpoint) in [
        (vec!["--dev"], Some("https://dynamodb.eu-west-1.amazonaws.com")),
        (vec!["--dev"], None),
        (vec!["--manual-clock"], Some("http://127.0.0.1:1")),
    ] {
        let dir = tempfile::tempdir()?;
        let mut cmd = tokio::process::Command::new(crate::server::binary()?);
        cmd.arg("serve").arg("--addr").arg("127.0.0.1:0").arg("--data-dir").arg(dir.path());
        cmd.arg("--backend").arg("aws").args(&args);
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("AWS_ENDPOINT_URL")) {
            cmd.env_remove(k);
        }
        if let Some(e) = endpoint {
            cmd.env("AWS_ENDPOINT_URL", e);
        }
        cmd.env("AWS_REGION", "eu-west-1").env("TIDINGS_TABLE", "never-created").kill_on_drop(true);
        let out = tokio::time::timeout(Duration::from_secs(60), cmd.output()).await??;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} {endpoint:?} started: {stderr}");
        assert!(stderr.contains("--dev"), "{args:?} {endpoint:?}: {stderr}");
    }
    Ok(())
}
