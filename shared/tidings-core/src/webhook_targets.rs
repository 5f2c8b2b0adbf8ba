//! Where a webhook may be posted: public addresses only, and only the addresses that were
//! checked (docs/webhooks.md, "Targets and secrets").
//!
//! One rule, [`special_purpose`], a table of the IANA special-purpose registries' prefixes (IPv4
//! and IPv6) and of the older forms that carry an IPv4 inside an IPv6 address. Registration
//! (`webhooks::check_url`) refuses a literal address it matches; each post resolves the name
//! once, through the HTTP client's own resolver ([`WebhookClient`]), which refuses the post when
//! the lookup fails or any address it gives is special, and otherwise hands the client exactly
//! the checked addresses to connect to. The client never looks the name up again, so a name
//! that answers a public address to a check and 127.0.0.1 to the connect (DNS rebinding) has no
//! second answer to give.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use ipnet::{Ipv4Net, Ipv6Net};
use tracing::warn;

use crate::config::{UrlPolicy, WebhookConfig};

/// What an address in a row's prefix is, for a webhook target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rule {
    /// Not a target.
    Refuse,
    /// An IPv6 form that reaches the IPv4 address in its low 32 bits: as that address is.
    CarriesIpv4,
}

const fn v4(a: u8, b: u8, c: u8, d: u8, len: u8) -> Ipv4Net {
    Ipv4Net::new_assert(Ipv4Addr::new(a, b, c, d), len)
}

const fn v6(s: [u16; 8], len: u8) -> Ipv6Net {
    Ipv6Net::new_assert(Ipv6Addr::new(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]), len)
}

/// The IANA IPv4 Special-Purpose Address Registry, every block, whether or not the registry
/// calls it globally reachable (no shop's endpoint is an AS112 server or a relay anycast), and
/// multicast.
const IPV4: &[(Ipv4Net, &str)] = &[
    (v4(0, 0, 0, 0, 8), "this network"),
    (v4(10, 0, 0, 0, 8), "private-use"),
    (v4(100, 64, 0, 0, 10), "shared address space"),
    (v4(127, 0, 0, 0, 8), "loopback"),
    (v4(169, 254, 0, 0, 16), "link-local"),
    (v4(172, 16, 0, 0, 12), "private-use"),
    (v4(192, 0, 0, 0, 24), "IETF protocol assignments"),
    (v4(192, 0, 2, 0, 24), "documentation (TEST-NET-1)"),
    (v4(192, 31, 196, 0, 24), "AS112"),
    (v4(192, 52, 193, 0, 24), "AMT"),
    (v4(192, 88, 99, 0, 24), "6to4 relay anycast"),
    (v4(192, 168, 0, 0, 16), "private-use"),
    (v4(192, 175, 48, 0, 24), "AS112 direct delegation"),
    (v4(198, 18, 0, 0, 15), "benchmarking"),
    (v4(198, 51, 100, 0, 24), "documentation (TEST-NET-2)"),
    (v4(203, 0, 113, 0, 24), "documentation (TEST-NET-3)"),
    (v4(224, 0, 0, 0, 4), "multicast"),
    (v4(240, 0, 0, 0, 4), "reserved"),
    (v4(255, 255, 255, 255, 32), "limited broadcast"),
];

/// The IANA IPv6 Special-Purpose Address Registry, every block, the deprecated forms that are no
/// longer in it (IPv4-compatible, site-local) and multicast. The prefixes do not overlap except
/// where both rows refuse, so the first match is the answer.
///
/// Forms that carry an IPv4 address: IPv4-mapped (`::ffff:a.b.c.d`, what a dual-stack socket
/// connects to as a.b.c.d) and the NAT64 well-known prefix (`64:ff9b::a.b.c.d`, RFC 6052: a
/// NAT64 gateway connects to a.b.c.d) are checked as their IPv4, so a stack on an IPv6-only
/// network with DNS64 still reaches public IPv4-only endpoints. Refused whatever they carry:
/// IPv4-compatible (deprecated), local-use NAT64 (`64:ff9b:1::/48`: where the IPv4 sits depends
/// on the operator's prefix length), 6to4 (`2002::/16`, deprecated) and Teredo (`2001::/32`,
/// whose IPv4 is obfuscated), both inside rows that refuse anyway.
const IPV6: &[(Ipv6Net, &str, Rule)] = &[
    (v6([0, 0, 0, 0, 0, 0xffff, 0, 0], 96), "IPv4-mapped", Rule::CarriesIpv4),
    (v6([0, 0, 0, 0, 0, 0, 0, 0], 128), "unspecified", Rule::Refuse),
    (v6([0, 0, 0, 0, 0, 0, 0, 1], 128), "loopback", Rule::Refuse),
    (v6([0, 0, 0, 0, 0, 0, 0, 0], 96), "IPv4-compatible (deprecated)", Rule::Refuse),
    (v6([0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96), "NAT64 well-known prefix", Rule::CarriesIpv4),
    (v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48), "NAT64 local use", Rule::Refuse),
    (v6([0x100, 0, 0, 0, 0, 0, 0, 0], 64), "discard-only", Rule::Refuse),
    (v6([0x100, 0, 0, 1, 0, 0, 0, 0], 64), "dummy prefix", Rule::Refuse),
    (v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 23), "IETF protocol assignments (Teredo within)", Rule::Refuse),
    (v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32), "documentation", Rule::Refuse),
    (v6([0x2002, 0, 0, 0, 0, 0, 0, 0], 16), "6to4", Rule::Refuse),
    (v6([0x2620, 0x4f, 0x8000, 0, 0, 0, 0, 0], 48), "AS112 direct delegation", Rule::Refuse),
    (v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20), "documentation", Rule::Refuse),
    (v6([0x5f00, 0, 0, 0, 0, 0, 0, 0], 16), "segment routing SIDs", Rule::Refuse),
    (v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7), "unique-local", Rule::Refuse),
    (v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10), "link-local", Rule::Refuse),
    (v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10), "site-local (deprecated)", Rule::Refuse),
    (v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8), "multicast", Rule::Refuse),
];

/// The only IPv6 unicast space IANA has allocated to the internet; the rest is reserved by the
/// IETF, no endpoint's address.
const GLOBAL_UNICAST: Ipv6Net = v6([0x2000, 0, 0, 0, 0, 0, 0, 0], 3);

/// The special-purpose block `ip` is in (the table's name of it), or `None` for an address a
/// webhook may be posted to.
pub fn special_purpose(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => IPV4.iter().find(|(net, _)| net.contains(&v4)).map(|&(_, name)| name),
        IpAddr::V6(v6) => match IPV6.iter().find(|(net, _, _)| net.contains(&v6)) {
            Some(&(_, _, Rule::CarriesIpv4)) => {
                let [.., a, b, c, d] = v6.octets();
                special_purpose(IpAddr::V4(Ipv4Addr::new(a, b, c, d)))
            }
            Some(&(_, name, Rule::Refuse)) => Some(name),
            None if !GLOBAL_UNICAST.contains(&v6) => Some("reserved by the IETF"),
            None => None,
        },
    }
}

/// Why a post was not sent: what the endpoint's `last_attempt.refusal` says. Nothing in it comes
/// from the target, which was never contacted.
#[derive(Debug, thiserror::Error)]
pub enum TargetRefused {
    #[error("target_refused: resolves to a special-purpose address")]
    SpecialAddress,
    /// The lookup failed, or gave no address (`None`).
    #[error("target_refused: the name did not resolve")]
    Unresolved(#[source] Option<std::io::Error>),
    /// The URL itself no longer passes registration's check (one registered under an older
    /// rule, or a literal special-purpose address).
    #[error("target_refused: the URL is not an allowed target")]
    Url,
}

impl TargetRefused {
    /// Whether the post may be tried again later: a lookup that failed may answer next time.
    pub fn retryable(&self) -> bool {
        matches!(self, TargetRefused::Unresolved(_))
    }

    /// The refusal inside an HTTP client's error (the resolver's error travels up as a source).
    pub fn in_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a TargetRefused> {
        let mut next = Some(e);
        while let Some(err) = next {
            if let Some(refused) = err.downcast_ref::<TargetRefused>() {
                return Some(refused);
            }
            next = err.source();
        }
        None
    }
}

/// How a webhook target's name is looked up: the system's resolver in production; tests give
/// one that changes its answers or fails.
#[async_trait]
pub trait NameLookup: Send + Sync {
    /// The addresses of `host`, a name (an IP literal is never looked up).
    async fn lookup(&self, host: &str) -> std::io::Result<Vec<IpAddr>>;
}

/// The system's resolver (`getaddrinfo`, on a blocking thread).
pub struct SystemLookup;

#[async_trait]
impl NameLookup for SystemLookup {
    async fn lookup(&self, host: &str) -> std::io::Result<Vec<IpAddr>> {
        Ok(tokio::net::lookup_host((host, 0)).await?.map(|a| a.ip()).collect())
    }
}

/// The one lookup of a post, checked: every address, or the refusal. Refused when the lookup
/// fails or gives nothing, and when any address is special (a name with one public and one
/// internal address would otherwise reach the internal one as often as the connector tries it).
pub async fn checked_addresses(
    lookup: &dyn NameLookup,
    host: &str,
    policy: UrlPolicy,
) -> Result<Vec<IpAddr>, TargetRefused> {
    let addrs = lookup.lookup(host).await.map_err(|e| TargetRefused::Unresolved(Some(e)))?;
    if addrs.is_empty() {
        return Err(TargetRefused::Unresolved(None));
    }
    if !policy.allow_private && addrs.iter().any(|ip| special_purpose(*ip).is_some()) {
        return Err(TargetRefused::SpecialAddress);
    }
    Ok(addrs)
}

/// The HTTP client's resolver: the checked addresses are the only ones it connects to.
struct PinnedResolver {
    lookup: Arc<dyn NameLookup>,
    policy: UrlPolicy,
}

impl reqwest::dns::Resolve for PinnedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let (lookup, policy) = (self.lookup.clone(), self.policy);
        Box::pin(async move {
            match checked_addresses(lookup.as_ref(), name.as_str(), policy).await {
                // Port 0: the client puts the URL's port (or the scheme's) in.
                Ok(addrs) => Ok(Box::new(addrs.into_iter().map(|ip| SocketAddr::new(ip, 0))) as reqwest::dns::Addrs),
                Err(refused) => Err(Box::new(refused) as Box<dyn std::error::Error + Send + Sync>),
            }
        })
    }
}

/// The HTTP client of webhook posts with the lookup it resolves through, built on first use
/// (one per [`UrlPolicy`]: under `allow_private` its resolver checks nothing).
pub struct WebhookClient {
    lookup: Arc<dyn NameLookup>,
    local_address: Option<IpAddr>,
    built: [OnceLock<Option<reqwest::Client>>; 2],
}

impl WebhookClient {
    pub fn new(lookup: Arc<dyn NameLookup>) -> Self {
        Self { lookup, local_address: None, built: Default::default() }
    }

    /// The client every `Deps` starts with: the system's resolver, one per process.
    pub fn system() -> Arc<Self> {
        static SYSTEM: OnceLock<Arc<WebhookClient>> = OnceLock::new();
        SYSTEM.get_or_init(|| Arc::new(Self::new(Arc::new(SystemLookup)))).clone()
    }

    /// Connections from this source address. Tests bind 127.0.0.1: the kernel then refuses a
    /// connect to any other network's address (EINVAL) before a packet leaves, so a test's
    /// public answers go nowhere.
    pub fn with_local_address(mut self, ip: IpAddr) -> Self {
        self.local_address = Some(ip);
        self
    }

    /// The client (`None`: it could not be built; the post is retried).
    ///
    /// rustls; no redirects followed (a redirect to a private address would get around every
    /// check); no proxy (a proxy would resolve the name itself, after the check); the connect
    /// and total timeouts.
    pub fn client(&self, policy: UrlPolicy) -> Option<&reqwest::Client> {
        self.built[usize::from(policy.allow_private)]
            .get_or_init(|| {
                // The timeouts are no setting: one client serves the process.
                let c = WebhookConfig::default();
                let resolver = PinnedResolver { lookup: self.lookup.clone(), policy };
                reqwest::Client::builder()
                    .connect_timeout(c.connect_timeout)
                    .timeout(c.timeout)
                    .redirect(reqwest::redirect::Policy::none())
                    .no_proxy()
                    .dns_resolver(Arc::new(resolver))
                    .local_address(self.local_address)
                    .user_agent("tidings-webhooks/1")
                    .build()
                    .map_err(|e| warn!(error = %e, "no HTTP client for webhooks"))
                    .ok()
            })
            .as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// Row by row: the prefix as the registry writes it, an address inside (its last one where
    /// that is still in the row), and the address just outside it when that one is public.
    /// Written out by hand, not derived from the table under test.
    #[test]
    fn each_special_purpose_row_refuses_inside_and_not_just_outside() {
        let rows: &[(&str, &[&str], &[&str])] = &[
            ("0.0.0.0/8", &["0.0.0.0", "0.255.255.255"], &["1.0.0.0"]),
            ("10.0.0.0/8", &["10.0.0.0", "10.255.255.255"], &["9.255.255.255", "11.0.0.0"]),
            ("100.64.0.0/10", &["100.64.0.0", "100.127.255.255"], &["100.63.255.255", "100.128.0.0"]),
            ("127.0.0.0/8", &["127.0.0.1", "127.255.255.255"], &["126.255.255.255", "128.0.0.0"]),
            ("169.254.0.0/16", &["169.254.169.254", "169.254.255.255"], &["169.253.255.255", "169.255.0.0"]),
            ("172.16.0.0/12", &["172.16.0.0", "172.31.255.255"], &["172.15.255.255", "172.32.0.0"]),
            (
                "192.0.0.0/24",
                &["192.0.0.0", "192.0.0.9", "192.0.0.170", "192.0.0.255"],
                &["191.255.255.255", "192.0.1.0"],
            ),
            ("192.0.2.0/24", &["192.0.2.1", "192.0.2.255"], &["192.0.1.255", "192.0.3.0"]),
            ("192.31.196.0/24", &["192.31.196.1"], &["192.31.195.255", "192.31.197.0"]),
            ("192.52.193.0/24", &["192.52.193.1"], &["192.52.192.255", "192.52.194.0"]),
            ("192.88.99.0/24", &["192.88.99.1"], &["192.88.98.255", "192.88.100.0"]),
            ("192.168.0.0/16", &["192.168.0.1", "192.168.255.255"], &["192.167.255.255", "192.169.0.0"]),
            ("192.175.48.0/24", &["192.175.48.1"], &["192.175.47.255", "192.175.49.0"]),
            ("198.18.0.0/15", &["198.18.0.0", "198.19.255.255"], &["198.17.255.255", "198.20.0.0"]),
            ("198.51.100.0/24", &["198.51.100.1"], &["198.51.99.255", "198.51.101.0"]),
            ("203.0.113.0/24", &["203.0.113.1"], &["203.0.112.255", "203.0.114.0"]),
            ("224.0.0.0/4", &["224.0.0.1", "239.255.255.255"], &["223.255.255.255"]),
            ("240.0.0.0/4", &["240.0.0.1", "255.255.255.254"], &[]),
            ("255.255.255.255/32", &["255.255.255.255"], &[]),
            ("::/128", &["::"], &[]),
            ("::1/128", &["::1"], &[]),
            // IPv4-mapped: as the IPv4 inside.
            (
                "::ffff:0:0/96",
                &["::ffff:127.0.0.1", "::ffff:10.0.0.1", "::ffff:169.254.169.254"],
                &["::ffff:93.184.216.34"],
            ),
            // IPv4-compatible: refused whatever it carries.
            ("::/96", &["::127.0.0.1", "::93.184.216.34", "::ffff"], &[]),
            // NAT64 well-known: as the IPv4 inside.
            (
                "64:ff9b::/96",
                &["64:ff9b::127.0.0.1", "64:ff9b::a9fe:a9fe", "64:ff9b::10.1.2.3"],
                &["64:ff9b::93.184.216.34"],
            ),
            ("64:ff9b:1::/48", &["64:ff9b:1::5db8:d822", "64:ff9b:1:ffff:ffff:ffff:ffff:ffff"], &[]),
            ("100::/64", &["100::1", "100::ffff:ffff:ffff:ffff"], &[]),
            ("100:0:0:1::/64", &["100:0:0:1::1"], &[]),
            // Teredo 2001::/32 (client 127.0.0.1, obfuscated) and the rest of 2001::/23.
            ("2001::/23", &["2001:0:4136:e378:8000:63bf:80ff:fffe", "2001:1::1", "2001:1ff:ffff::"], &["2001:200::1"]),
            ("2001:db8::/32", &["2001:db8::1", "2001:db8:ffff::"], &["2001:db7:ffff::", "2001:db9::"]),
            ("2002::/16", &["2002:7f00:1::", "2002:a9fe:a9fe::1"], &["2001:ffff::", "2003::1"]),
            ("2620:4f:8000::/48", &["2620:4f:8000::1"], &["2620:4f:7fff::1", "2620:4f:8001::"]),
            ("3fff::/20", &["3fff::1", "3fff:fff:ffff::"], &["3ffe:ffff::", "3fff:1000::"]),
            ("5f00::/16", &["5f00::1"], &[]),
            ("fc00::/7", &["fc00::1", "fd00::1", "fdff:ffff::"], &[]),
            ("fe80::/10", &["fe80::1", "febf:ffff::"], &[]),
            ("fec0::/10", &["fec0::1", "feff:ffff::"], &[]),
            ("ff00::/8", &["ff02::1", "ffff::1"], &[]),
            // Outside 2000::/3 and every row: reserved by the IETF.
            ("outside 2000::/3", &["::ffff:0:7f00:1", "1::1", "4000::1", "e000::1"], &[]),
        ];
        for (row, inside, outside) in rows {
            for a in *inside {
                assert!(special_purpose(ip(a)).is_some(), "{a} is in {row}: refused");
            }
            for a in *outside {
                assert_eq!(special_purpose(ip(a)), None, "{a} is just outside {row}: a target");
            }
        }
    }

    #[test]
    fn public_addresses_are_targets() {
        for a in
            ["93.184.216.34", "1.1.1.1", "8.8.8.8", "2606:2800:220:1:248:1893:25c8:1946", "2a00:1450:4001:81c::200e"]
        {
            assert_eq!(special_purpose(ip(a)), None, "{a}");
        }
    }

    #[test]
    fn carried_ipv4_is_named_by_its_own_row() {
        assert_eq!(special_purpose(ip("::ffff:127.0.0.1")), Some("loopback"));
        assert_eq!(special_purpose(ip("64:ff9b::169.254.169.254")), Some("link-local"));
        assert_eq!(special_purpose(ip("::127.0.0.1")), Some("IPv4-compatible (deprecated)"));
    }

    /// Answers what it is told.
    struct Fixed(Result<Vec<IpAddr>, ()>);

    #[async_trait]
    impl NameLookup for Fixed {
        async fn lookup(&self, _: &str) -> std::io::Result<Vec<IpAddr>> {
            self.0.clone().map_err(|()| std::io::Error::other("SERVFAIL"))
        }
    }

    #[tokio::test]
    async fn a_lookup_is_refused_if_any_address_is_special_or_it_fails() {
        let prod = UrlPolicy { allow_private: false };
        let dev = UrlPolicy { allow_private: true };
        let mixed = Fixed(Ok(vec![ip("93.184.216.34"), ip("127.0.0.1")]));
        assert!(matches!(checked_addresses(&mixed, "h.example", prod).await, Err(TargetRefused::SpecialAddress)));
        assert_eq!(checked_addresses(&mixed, "h.example", dev).await.unwrap().len(), 2);
        let failed = Fixed(Err(()));
        let refused = checked_addresses(&failed, "h.example", dev).await.unwrap_err();
        assert!(matches!(refused, TargetRefused::Unresolved(Some(_))) && refused.retryable());
        let empty = Fixed(Ok(vec![]));
        assert!(matches!(checked_addresses(&empty, "h.example", prod).await, Err(TargetRefused::Unresolved(None))));
        let public = Fixed(Ok(vec![ip("93.184.216.34"), ip("2606:2800:220:1:248:1893:25c8:1946")]));
        assert_eq!(checked_addresses(&public, "h.example", prod).await.unwrap().len(), 2);
    }
}
