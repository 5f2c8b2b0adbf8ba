//! Webhook targets pinned (docs/webhooks.md, "Targets and secrets"): a post looks its name up
//! once and connects only to the addresses that lookup gave and the check passed, so a name that
//! flips between a public address and 127.0.0.1, or whose lookup fails, never gets a connection
//! to loopback; registration refuses internal addresses in IPv6 disguise.
//!
//! Offline: the loopback listener is the only thing listening, and the client under test binds
//! 127.0.0.1 as its source, so the kernel refuses a connect to the "public" answer (EINVAL)
//! before any packet leaves the machine.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;
use tidings_core::lanes::Lane;
use tidings_core::outcome::Outcome;
use tidings_core::ports::Received;
use tidings_core::router::route;
use tidings_core::webhook_targets::{NameLookup, WebhookClient};
use tidings_core::webhooks::{self, EndpointInput, Event, EventType, LastAttempt, Message};
use tidings_core::{CoreError, Deps, TenantId};
use tidings_embedded::test_world::TestWorld;

const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
/// A public address (example.com's old one). Never reached: the client's source is 127.0.0.1.
const PUBLIC: IpAddr = IpAddr::V4(Ipv4Addr::new(93, 184, 216, 34));

/// A name whose answers follow `answer(n)` for the n-th lookup (`None`: the lookup fails).
struct Scripted {
    lookups: AtomicUsize,
    answer: fn(usize) -> Option<IpAddr>,
}

#[async_trait]
impl NameLookup for Scripted {
    async fn lookup(&self, _: &str) -> std::io::Result<Vec<IpAddr>> {
        let n = self.lookups.fetch_add(1, Ordering::SeqCst);
        match (self.answer)(n) {
            Some(ip) => Ok(vec![ip]),
            None => Err(std::io::Error::other("SERVFAIL")),
        }
    }
}

/// A TCP listener on 127.0.0.1 that counts the connections it accepts (and drops them).
async fn loopback_listener() -> (u16, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind((LOOPBACK, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            drop(conn);
        }
    });
    (port, accepted)
}

struct Run {
    lookups: usize,
    /// The endpoint's `last_attempt` after each attempt.
    lasts: Vec<LastAttempt>,
    outcomes: Vec<Outcome>,
    accepted: usize,
}

/// `attempts` posts of distinct events to `https://rebind.example:{port}/hook` under the
/// production policy, the name answering as `answer` says.
async fn post_through(answer: fn(usize) -> Option<IpAddr>, attempts: usize) -> Run {
    let (port, accepted) = loopback_listener().await;
    let lookup = Arc::new(Scripted { lookups: AtomicUsize::new(0), answer });
    let world = TestWorld::builder().all_queues(5).build();
    assert!(!world.deps.config.webhooks.policy.allow_private, "the production policy");
    let client = WebhookClient::new(lookup.clone()).with_local_address(LOOPBACK);
    let deps = Deps { webhook_client: Arc::new(client), ..world.deps };
    let t = TenantId::parse("shop-a").unwrap();
    let input = EndpointInput {
        url: format!("https://rebind.example:{port}/hook"),
        events: vec![EventType::OrderExpired],
        rate_limit: Some(1000),
    };
    let endpoint = webhooks::create(&deps, &t, input).await.unwrap().endpoint;
    let mut run = Run { lookups: 0, lasts: Vec::new(), outcomes: Vec::new(), accepted: 0 };
    for i in 0..attempts {
        let event = Event::of(&deps, &t, EventType::OrderExpired, &[&i.to_string()], json!({"n": i}));
        let body = Message::Attempt { tenant: t.clone(), endpoint_id: endpoint.endpoint_id.clone(), event };
        let received = Received {
            message_id: format!("m-{i}"),
            receipt: format!("r-{i}"),
            body: serde_json::to_string(&body).unwrap(),
            receive_count: 1,
            sent_at_ms: 0,
            group: None,
        };
        run.outcomes.push(route(&deps, Lane::Webhooks, &received).await);
        let last = webhooks::get(&deps, &t, &endpoint.endpoint_id).await.unwrap().last_attempt.unwrap();
        run.lasts.push(last);
    }
    // A connection the kernel completed is accepted at once; give the accept loop its turn.
    tokio::time::sleep(Duration::from_millis(100)).await;
    run.lookups = lookup.lookups.load(Ordering::SeqCst);
    run.accepted = accepted.load(Ordering::SeqCst);
    run
}

const SPECIAL: &str = "target_refused: resolves to a special-purpose address";
const UNRESOLVED: &str = "target_refused: the name did not resolve";

#[tokio::test]
async fn a_name_flipping_to_loopback_never_gets_a_connection_to_it() {
    // Public for one lookup, 127.0.0.1 for the next: a check and a second lookup to connect
    // would get one of each, in that order, every attempt.
    let run = post_through(|n| Some(if n % 2 == 0 { PUBLIC } else { LOOPBACK }), 20).await;
    assert_eq!(run.accepted, 0, "no connection reached the loopback listener");
    assert_eq!(run.lookups, 20, "one lookup per attempt, the one the connect used");
    for (i, last) in run.lasts.iter().enumerate() {
        assert_eq!(last.status_code, None, "attempt {i}: no target answered: {last:?}");
        if i % 2 == 0 {
            // Connected to the public answer, as checked (refused by the kernel here).
            assert_eq!((last.outcome.as_str(), last.refusal.as_deref()), ("retrying", None), "attempt {i}");
            assert!(matches!(run.outcomes[i], Outcome::Retry(_)), "attempt {i}: {:?}", run.outcomes[i]);
        } else {
            assert_eq!((last.outcome.as_str(), last.refusal.as_deref()), ("failed", Some(SPECIAL)), "attempt {i}");
            assert!(matches!(run.outcomes[i], Outcome::Done), "attempt {i}: {:?}", run.outcomes[i]);
        }
    }
}

#[tokio::test]
async fn a_failed_lookup_is_refused_not_looked_up_again() {
    // Fails, then answers 127.0.0.1: a check that lets a failed lookup through, followed by the
    // client's own lookup, would connect to loopback every attempt.
    let run = post_through(|n| if n % 2 == 0 { None } else { Some(LOOPBACK) }, 10).await;
    assert_eq!(run.accepted, 0, "no connection reached the loopback listener");
    assert_eq!(run.lookups, 10, "one lookup per attempt");
    for (i, last) in run.lasts.iter().enumerate() {
        assert_eq!(last.status_code, None, "attempt {i}: {last:?}");
        let (outcome, refusal) = if i % 2 == 0 { ("retrying", UNRESOLVED) } else { ("failed", SPECIAL) };
        assert_eq!((last.outcome.as_str(), last.refusal.as_deref()), (outcome, Some(refusal)), "attempt {i}");
    }
    assert!(matches!(run.outcomes[0], Outcome::Retry(_)), "a failed lookup is tried again later");
}

#[tokio::test]
async fn registration_refuses_internal_addresses_in_disguise() {
    let world = TestWorld::builder().build();
    let t = TenantId::parse("shop-a").unwrap();
    let create = |url: &str| {
        let input = EndpointInput { url: url.into(), events: vec![EventType::OrderExpired], rate_limit: None };
        webhooks::create(&world.deps, &t, input)
    };
    for (form, url) in [
        ("NAT64 of loopback", "https://[64:ff9b::7f00:1]/h"),
        ("NAT64 of the metadata service", "https://[64:ff9b::169.254.169.254]/h"),
        ("NAT64 of a private address", "https://[64:ff9b::10.0.0.1]/h"),
        ("local-use NAT64", "https://[64:ff9b:1::5db8:d822]/h"),
        ("6to4 of loopback", "https://[2002:7f00:1::1]/h"),
        ("6to4 of the metadata service", "https://[2002:a9fe:a9fe::1]/h"),
        ("Teredo", "https://[2001:0:4136:e378:8000:63bf:80ff:fffe]/h"),
        ("IPv4-compatible loopback", "https://[::127.0.0.1]/h"),
        ("IPv4-mapped loopback", "https://[::ffff:127.0.0.1]/h"),
        ("IPv4-mapped metadata service", "https://[::ffff:169.254.169.254]/h"),
        ("IPv4-translated loopback", "https://[::ffff:0:7f00:1]/h"),
        ("site-local", "https://[fec0::1]/h"),
        ("unique-local", "https://[fd00::1]/h"),
        ("IPv6 link-local", "https://[fe80::1]/h"),
        ("IPv6 unspecified", "https://[::]/h"),
        ("IPv6 multicast", "https://[ff02::1]/h"),
        ("IPv6 documentation", "https://[2001:db8::1]/h"),
        ("IPv6 documentation 3fff::/20", "https://[3fff::1]/h"),
        ("discard-only", "https://[100::1]/h"),
        ("IETF protocol assignments", "https://192.0.0.170/h"),
        ("6to4 relay anycast", "https://192.88.99.1/h"),
        ("reserved 240/4", "https://240.0.0.1/h"),
        ("limited broadcast", "https://255.255.255.255/h"),
        ("this network", "https://0.0.0.0/h"),
        ("shared address space", "https://100.64.0.1/h"),
        ("benchmarking", "https://198.18.0.1/h"),
        ("TEST-NET-3", "https://203.0.113.7/h"),
        ("IPv4 multicast", "https://224.0.0.1/h"),
        ("loopback in hex", "https://0x7f000001/h"),
        ("loopback as one number", "https://2130706433/h"),
        ("loopback shortened", "https://127.1/h"),
        ("loopback in octal", "https://0177.0.0.1/h"),
        ("localhost", "https://localhost./h"),
    ] {
        match create(url).await {
            Err(CoreError::Invalid { field, detail }) => {
                assert_eq!(field, "url", "{form}");
                assert!(detail.contains("special-purpose") && detail.contains("public"), "{form}: {detail}");
            }
            other => panic!("{form} ({url}) is refused with a 422 naming url, got {other:?}"),
        }
    }
    // What carries a public IPv4, and public addresses, are targets.
    for url in [
        "https://[::ffff:93.184.216.34]/h",
        "https://[64:ff9b::93.184.216.34]/h",
        "https://93.184.216.34/h",
        "https://[2606:2800:220:1:248:1893:25c8:1946]/h",
        "https://shop.example.com/h",
    ] {
        assert!(create(url).await.is_ok(), "{url}");
    }
}
