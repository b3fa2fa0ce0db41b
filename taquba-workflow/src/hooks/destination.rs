//! [`DestinationPolicy`]: where a
//! [`WebhookTerminalHook`](crate::webhooks::WebhookTerminalHook) may send
//! its callbacks, checked when a delivery is staged, when it is sent, and on
//! every connection the delivery's HTTP client opens.
//!
//! The callback URL comes from whoever submitted the run, so without a
//! policy anyone who can submit makes the service send requests to any
//! address it can reach (server-side request forgery): an admin port on
//! localhost, a database in the private network, the cloud's metadata
//! endpoint. The policy refuses those by default and lets the operator
//! narrow the rest to the receivers they expect.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use url::{Host, Url};

/// How long a name's resolution may take before the check gives up with a
/// (transient) [`DestinationError::Lookup`].
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// The most redirects a delivery follows (reqwest's own default), each one
/// checked.
const MAX_REDIRECTS: usize = 10;

/// Host names of cloud metadata services, refused by name whatever they
/// resolve to.
const METADATA_HOSTS: &[&str] = &["metadata.google.internal"];

/// IPv4 addresses of cloud metadata services: AWS, GCP, Azure and others
/// (169.254.169.254, also link-local), Alibaba Cloud (100.100.100.200, also
/// in the shared address space). Refused even with
/// [`DestinationPolicy::allow_private_networks`].
const METADATA_V4: [Ipv4Addr; 2] = [
    Ipv4Addr::new(169, 254, 169, 254),
    Ipv4Addr::new(100, 100, 100, 200),
];

/// IPv6 addresses of cloud metadata services: AWS's `fd00:ec2::254`
/// (otherwise a unique local, private, address).
const METADATA_V6: [Ipv6Addr; 1] = [Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254)];

/// What kind of address an IP address is, as [`DestinationPolicy`] sees
/// it ([`AddressClass::of`]).
///
/// An IPv6 address that carries an IPv4 address is classified by the IPv4
/// address: IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible
/// (`::a.b.c.d`), NAT64 (`64:ff9b::a.b.c.d`) and 6to4 (`2002:AABB:CCDD::`),
/// since a connection to it can reach the IPv4 host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AddressClass {
    /// Any other address: allowed.
    Public,
    /// `127.0.0.0/8`, `::1`: allowed only with
    /// [`DestinationPolicy::allow_loopback`].
    Loopback,
    /// `10.0.0.0/8`, `172.16.0.0/12`, `192.168.0.0/16`, `fc00::/7` (unique
    /// local) and `fec0::/10` (the deprecated site-local): allowed only with
    /// [`DestinationPolicy::allow_private_networks`].
    Private,
    /// `100.64.0.0/10`, the shared (carrier-grade NAT) address space:
    /// allowed only with [`DestinationPolicy::allow_private_networks`].
    SharedAddressSpace,
    /// `169.254.0.0/16`, `fe80::/10`: never allowed.
    LinkLocal,
    /// A cloud metadata service: `169.254.169.254`, `100.100.100.200`,
    /// `fd00:ec2::254`. Never allowed.
    Metadata,
    /// `0.0.0.0/8` ("this network"; `0.0.0.0` reaches the local host on
    /// Linux), `::`: never allowed.
    Unspecified,
    /// `224.0.0.0/4`, `ff00::/8`: never allowed.
    Multicast,
    /// `255.255.255.255`: never allowed.
    Broadcast,
    /// `240.0.0.0/4` (reserved, other than the broadcast address): never
    /// allowed.
    Reserved,
}

impl AddressClass {
    /// The class of `addr`.
    pub fn of(addr: IpAddr) -> Self {
        match addr {
            IpAddr::V4(v4) => classify_v4(v4),
            IpAddr::V6(v6) => classify_v6(v6),
        }
    }

    /// What the class is called in a refusal.
    fn describe(self) -> &'static str {
        match self {
            Self::Public => "a public address",
            Self::Loopback => "a loopback address",
            Self::Private => "a private-network address",
            Self::SharedAddressSpace => "a shared (carrier-grade NAT, 100.64.0.0/10) address",
            Self::LinkLocal => "a link-local address",
            Self::Metadata => "a cloud metadata address",
            Self::Unspecified => "an unspecified (this-network) address",
            Self::Multicast => "a multicast address",
            Self::Broadcast => "the broadcast address",
            Self::Reserved => "a reserved address",
        }
    }

    /// The policy option that allows the class, when one does.
    fn allowed_by(self) -> &'static str {
        match self {
            Self::Public => "",
            Self::Loopback => " (allowed only with `allow_loopback`)",
            Self::Private | Self::SharedAddressSpace => {
                " (allowed only with `allow_private_networks`)"
            }
            _ => " (never allowed)",
        }
    }
}

impl fmt::Display for AddressClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

fn classify_v4(ip: Ipv4Addr) -> AddressClass {
    if METADATA_V4.contains(&ip) {
        return AddressClass::Metadata;
    }
    let [a, b, _, _] = ip.octets();
    if a == 0 {
        AddressClass::Unspecified
    } else if a == 127 {
        AddressClass::Loopback
    } else if a == 10 || (a == 172 && (16..=31).contains(&b)) || (a == 192 && b == 168) {
        AddressClass::Private
    } else if a == 100 && (64..=127).contains(&b) {
        AddressClass::SharedAddressSpace
    } else if a == 169 && b == 254 {
        AddressClass::LinkLocal
    } else if ip == Ipv4Addr::BROADCAST {
        AddressClass::Broadcast
    } else if (224..=239).contains(&a) {
        AddressClass::Multicast
    } else if a >= 240 {
        AddressClass::Reserved
    } else {
        AddressClass::Public
    }
}

fn classify_v6(ip: Ipv6Addr) -> AddressClass {
    if let Some(v4) = embedded_v4(ip) {
        return classify_v4(v4);
    }
    if METADATA_V6.contains(&ip) {
        return AddressClass::Metadata;
    }
    let first = ip.segments()[0];
    if ip.is_unspecified() {
        AddressClass::Unspecified
    } else if ip.is_loopback() {
        AddressClass::Loopback
    } else if first & 0xff00 == 0xff00 {
        AddressClass::Multicast
    } else if first & 0xffc0 == 0xfe80 {
        AddressClass::LinkLocal
    } else if first & 0xffc0 == 0xfec0 || first & 0xfe00 == 0xfc00 {
        AddressClass::Private
    } else {
        AddressClass::Public
    }
}

/// The IPv4 address an IPv6 address carries, when a connection to it can
/// reach that IPv4 host.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4);
    }
    let s = ip.segments();
    let low = || Ipv4Addr::from((u32::from(s[6]) << 16) | u32::from(s[7]));
    if s[..6] == [0; 6] && !(s[6] == 0 && s[7] <= 1) {
        // IPv4-compatible `::a.b.c.d` (deprecated), other than `::` and `::1`.
        return Some(low());
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        // NAT64's well-known prefix.
        return Some(low());
    }
    if s[0] == 0x2002 {
        // 6to4: the IPv4 address follows the prefix.
        return Some(Ipv4Addr::from((u32::from(s[1]) << 16) | u32::from(s[2])));
    }
    None
}

/// An entry of the host allowlist.
#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    /// This name, exactly.
    Exact(String),
    /// Any name under this domain (`*.example.com`), not the domain itself.
    Subdomains(String),
    /// This IP address, written as the URL's host.
    Address(IpAddr),
    /// A pattern that is not a host (kept so that the allowlist stays
    /// restrictive); matches nothing.
    Invalid(String),
}

impl HostPattern {
    fn parse(pattern: &str) -> Self {
        let pattern = pattern.trim();
        let (wildcard, host) = match pattern.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, pattern),
        };
        match (wildcard, Host::parse(host)) {
            (false, Ok(Host::Domain(name))) => Self::Exact(normalize_name(&name)),
            (true, Ok(Host::Domain(name))) => Self::Subdomains(normalize_name(&name)),
            (false, Ok(Host::Ipv4(ip))) => Self::Address(IpAddr::V4(ip)),
            (false, Ok(Host::Ipv6(ip))) => Self::Address(IpAddr::V6(ip)),
            _ => Self::Invalid(pattern.to_string()),
        }
    }

    fn matches(&self, host: &TargetHost) -> bool {
        match (self, host) {
            (Self::Exact(name), TargetHost::Name(host)) => name == host,
            (Self::Subdomains(domain), TargetHost::Name(host)) => host
                .strip_suffix(domain.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            (Self::Address(ip), TargetHost::Ip(host)) => ip == host,
            _ => false,
        }
    }
}

/// A host name as the policy compares it: lower case (the URL parser has
/// already mapped international names to their ASCII form), without the
/// trailing dot of a fully qualified name.
fn normalize_name(name: &str) -> String {
    name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase()
}

/// The host of a URL, as checked.
#[derive(Debug, Clone, PartialEq, Eq)]
enum TargetHost {
    /// A name, normalized ([`normalize_name`]); resolved before it is checked.
    Name(String),
    /// An IP address written in the URL (in any form the URL parser
    /// accepts: `2130706433` and `0x7f.1` are `127.0.0.1`).
    Ip(IpAddr),
}

impl fmt::Display for TargetHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Name(name) => f.write_str(name),
            Self::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// What the checks before resolution found of a URL.
struct Target {
    host: TargetHost,
    port: u16,
    /// `http` without `allow_scheme("http")`: allowed only to loopback.
    plain_http: bool,
}

/// The rule of a [`DestinationPolicy`] that refused a destination
/// ([`DestinationError::Refused`]). Its `Display` names the rule and the
/// option that would allow the destination, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// The URL does not parse, or has no host.
    InvalidUrl {
        /// Why.
        reason: String,
    },
    /// The scheme is not allowed: only `https`, and `http` to loopback or
    /// with [`DestinationPolicy::allow_scheme`]`("http")`, are. No other
    /// scheme can be delivered, allowed or not.
    Scheme {
        /// The URL's scheme.
        scheme: String,
    },
    /// Plain `http` to a host that is not a loopback address, without
    /// [`DestinationPolicy::allow_scheme`]`("http")`.
    PlainHttp {
        /// The URL's host.
        host: String,
    },
    /// The host is not on the allowlist ([`DestinationPolicy::allow_host`]).
    Host {
        /// The URL's host.
        host: String,
    },
    /// The port is not on the allowlist ([`DestinationPolicy::allow_port`]).
    Port {
        /// The URL's port (the scheme's default when the URL names none).
        port: u16,
    },
    /// The host is the name of a cloud metadata service
    /// (`metadata.google.internal`); never allowed.
    MetadataHost {
        /// The URL's host.
        host: String,
    },
    /// The host is, or resolves to, an address of a refused
    /// [`AddressClass`].
    Address {
        /// The URL's host.
        host: String,
        /// The refused address.
        addr: IpAddr,
        /// Its class.
        class: AddressClass,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidUrl { reason } => write!(f, "rule `url`: not a valid URL ({reason})"),
            Self::Scheme { scheme } => write!(
                f,
                "rule `scheme`: scheme `{scheme}` is not allowed (only https, and http to \
                 loopback or with `allow_scheme(\"http\")`)"
            ),
            Self::PlainHttp { host } => write!(
                f,
                "rule `plain-http`: http to `{host}`, which is not a loopback address (http is \
                 allowed only to loopback unless `allow_scheme(\"http\")`)"
            ),
            Self::Host { host } => write!(
                f,
                "rule `host`: host `{host}` is not on the allowlist (`allow_host`)"
            ),
            Self::Port { port } => write!(
                f,
                "rule `port`: port {port} is not on the allowlist (`allow_port`)"
            ),
            Self::MetadataHost { host } => write!(
                f,
                "rule `metadata`: `{host}` is a cloud metadata service (never allowed)"
            ),
            Self::Address { host, addr, class } => {
                let rule = match class {
                    AddressClass::Public => "address",
                    AddressClass::Loopback => "loopback",
                    AddressClass::Private => "private",
                    AddressClass::SharedAddressSpace => "shared-address-space",
                    AddressClass::LinkLocal => "link-local",
                    AddressClass::Metadata => "metadata",
                    AddressClass::Unspecified => "unspecified",
                    AddressClass::Multicast => "multicast",
                    AddressClass::Broadcast => "broadcast",
                    AddressClass::Reserved => "reserved",
                };
                if host == &addr.to_string() {
                    write!(f, "rule `{rule}`: {addr} is {class}")?;
                } else {
                    write!(f, "rule `{rule}`: `{host}` resolves to {addr}, {class}")?;
                }
                f.write_str(class.allowed_by())
            }
        }
    }
}

/// Why a [`DestinationPolicy`] did not pass a destination.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DestinationError {
    /// A rule refused the destination. Permanent: the same URL is refused
    /// again on every retry, so the notification (or delivery) carrying it
    /// is dead-lettered with this message.
    #[error("webhook destination `{url}` refused: {refusal}")]
    Refused {
        /// The URL as given, or, when it holds a password, as parsed with
        /// the password replaced by `***`; for a redirect, the redirect's
        /// URL; at connect time, where only the host is known, the host.
        url: String,
        /// The rule that refused it.
        refusal: Refusal,
    },
    /// The host name did not resolve (in time, or to any address).
    /// Transient: the notification (or delivery) is retried.
    #[error("webhook destination `{url}`: cannot resolve `{host}`: {reason}")]
    Lookup {
        /// The URL, shown as in [`Self::Refused`].
        url: String,
        /// The host name.
        host: String,
        /// The resolver's error.
        reason: String,
    },
}

impl DestinationError {
    /// Whether a retry cannot help: `true` for [`Self::Refused`].
    pub fn is_permanent(&self) -> bool {
        matches!(self, Self::Refused { .. })
    }

    /// The rule that refused the destination, for [`Self::Refused`].
    pub fn refusal(&self) -> Option<&Refusal> {
        match self {
            Self::Refused { refusal, .. } => Some(refusal),
            Self::Lookup { .. } => None,
        }
    }
}

/// Where webhook callbacks may be sent: the operator's allowlists of
/// schemes, hosts and ports, and the addresses refused after resolution.
///
/// A [`WebhookTerminalHook`](crate::webhooks::WebhookTerminalHook) checks
/// each run's callback URL with its policy when it stages the delivery
/// ([`WebhookTerminalHook::with_policy`](crate::webhooks::WebhookTerminalHook::with_policy);
/// the default policy when none is given); a refused URL fails the run's
/// terminal notification with a permanent error, so it is dead-lettered
/// with the [`DestinationError`] as its message and never retried. The run's
/// own outcome has committed before and is not changed.
///
/// # The rules
///
/// A URL passes when all of these hold:
///
/// * **Scheme**: `https`; or `http` when every address the host resolves
///   to is a loopback address (so loopback must be allowed too), or
///   everywhere with [`allow_scheme`](Self::allow_scheme)`("http")`. No other
///   scheme can be delivered.
/// * **Host**: when [`allow_host`](Self::allow_host) was called, the host
///   matches an entry (exact, or `*.domain` for the domain's subdomains);
///   otherwise any host. `metadata.google.internal` is refused by name
///   whatever the allowlist says.
/// * **Port**: when [`allow_port`](Self::allow_port) was called, the port
///   (the URL's, or the scheme's default: 443, 80) is an entry; otherwise
///   any port.
/// * **Addresses**: the host (an IP address, or a name resolved once) gives
///   only addresses of allowed [`AddressClass`]es: public ones; loopback
///   with [`allow_loopback`](Self::allow_loopback); private networks and the
///   shared address space with
///   [`allow_private_networks`](Self::allow_private_networks). Link-local,
///   cloud metadata, unspecified, multicast, broadcast and reserved
///   addresses are never allowed, nor the IPv6 forms that carry them
///   (IPv4-mapped `::ffff:169.254.169.254` and the like). A name with one
///   refused address among several is refused.
///
/// # Defaults
///
/// [`DestinationPolicy::default()`] allows `https` to any public address on
/// any port, and nothing else: no loopback, no private network, no plain
/// `http` (which it allows only to loopback). Loopback is refused by
/// default because the service's own ports on localhost (an admin or
/// metrics endpoint, a sidecar) are the first thing a forged callback
/// aims at; local development and tests opt in with
/// [`allow_loopback`](Self::allow_loopback), which also lets `http` reach
/// loopback. Receivers inside the private network are allowed with
/// [`allow_private_networks`](Self::allow_private_networks), best combined
/// with a host allowlist.
///
/// # Resolution and connection
///
/// Names are resolved with the system resolver (`getaddrinfo`), bounded by
/// 5 s ([`DestinationError::Lookup`], transient, past it), or with a fixed
/// mapping set by [`resolve_to`](Self::resolve_to). The delivery must
/// connect to the addresses that were checked, not to what a second lookup
/// returns (a name whose DNS answer changes between the check and the
/// connection, DNS rebinding, would otherwise pass the check with a public
/// address and connect to a private one): the HTTP client of
/// [`http_client`](Self::http_client) (and so
/// [`WebhookDeliveryWorker`](crate::webhooks::WebhookDeliveryWorker)) resolves
/// every connection's host through the policy, which checks the addresses
/// of that resolution and hands only those to the connector. It follows at
/// most 10 redirects, each checked before it is followed (a redirect to a
/// name over plain `http` is refused, since it is not resolved before), and
/// ignores proxies from the environment (a proxy would resolve and connect
/// on its own, out of the policy's reach).
///
/// ```
/// use taquba_workflow::webhooks::{DestinationPolicy, WebhookTerminalHook};
///
/// let policy = DestinationPolicy::default()
///     .allow_host("hooks.example.com")
///     .allow_host("*.customers.example.net")
///     .allow_port(443)
///     .allow_port(8443);
/// let hook = WebhookTerminalHook::new("webhooks").with_policy(policy);
/// # let _ = hook;
/// ```
#[derive(Debug, Clone, Default)]
pub struct DestinationPolicy {
    /// Schemes allowed besides `https` (only `http` can be delivered).
    schemes: BTreeSet<String>,
    /// The host allowlist; empty: any host.
    hosts: Vec<HostPattern>,
    /// The port allowlist; empty: any port.
    ports: BTreeSet<u16>,
    allow_loopback: bool,
    allow_private_networks: bool,
    /// Fixed resolutions, by normalized name.
    resolved: BTreeMap<String, Vec<IpAddr>>,
}

impl DestinationPolicy {
    /// Allow the scheme `scheme` (case-insensitive) to any destination the
    /// other rules allow. `https` is always allowed; the one other scheme
    /// that can be delivered is `http` (to allow plain `http` beyond
    /// loopback). Any other scheme stays refused.
    pub fn allow_scheme(mut self, scheme: impl AsRef<str>) -> Self {
        self.schemes
            .insert(scheme.as_ref().trim().to_ascii_lowercase());
        self
    }

    /// Add `pattern` to the host allowlist; once the list has an entry,
    /// only the hosts it matches are allowed (and still only at allowed
    /// addresses). `pattern` is a host name matched exactly
    /// (case-insensitive, a trailing dot ignored, an international name as
    /// its ASCII form), `*.` and a domain, matching the domain's subdomains
    /// at any depth but not the domain itself (list both for both), or an
    /// IP address matching a URL that names that address. A pattern that
    /// is none of these matches nothing.
    pub fn allow_host(mut self, pattern: impl AsRef<str>) -> Self {
        self.hosts.push(HostPattern::parse(pattern.as_ref()));
        self
    }

    /// Add `port` to the port allowlist; once the list has an entry, only
    /// the ports on it are allowed. A URL without a port is on the scheme's
    /// default (443 for `https`, 80 for `http`), which must then be listed
    /// too.
    pub fn allow_port(mut self, port: u16) -> Self {
        self.ports.insert(port);
        self
    }

    /// Allow loopback addresses (`127.0.0.0/8`, `::1` and their IPv6
    /// forms), over `https` and also over plain `http`. For local
    /// development and tests: in production it lets a run's submitter
    /// reach every port of the service's own host.
    pub fn allow_loopback(mut self) -> Self {
        self.allow_loopback = true;
        self
    }

    /// Allow private-network addresses (`10.0.0.0/8`, `172.16.0.0/12`,
    /// `192.168.0.0/16`, `fc00::/7`) and the shared address space
    /// (`100.64.0.0/10`), for receivers inside the network. Cloud metadata
    /// addresses in those ranges stay refused. Combine it with
    /// [`allow_host`](Self::allow_host), or any host in the network can be
    /// reached.
    pub fn allow_private_networks(mut self) -> Self {
        self.allow_private_networks = true;
        self
    }

    /// Resolve `host` to `addrs` instead of asking the system resolver, for
    /// the checks and for the connections of [`http_client`](Self::http_client)
    /// (like an `/etc/hosts` entry, or curl's `--resolve`). The addresses
    /// are checked like any resolution's. An `addrs` without an address
    /// makes `host` fail to resolve.
    pub fn resolve_to(
        mut self,
        host: impl AsRef<str>,
        addrs: impl IntoIterator<Item = IpAddr>,
    ) -> Self {
        self.resolved
            .insert(normalize_name(host.as_ref()), addrs.into_iter().collect());
        self
    }

    /// Check `url` against the policy, resolving its host if it is a name,
    /// and return the checked addresses (with the URL's port).
    ///
    /// # Errors
    /// [`DestinationError::Refused`] naming the URL and the rule that
    /// refused it; [`DestinationError::Lookup`] when the name does not
    /// resolve.
    pub async fn check(&self, url: &str) -> Result<Vec<SocketAddr>, DestinationError> {
        let parsed = Url::parse(url).map_err(|e| DestinationError::Refused {
            url: url.to_string(),
            refusal: Refusal::InvalidUrl {
                reason: e.to_string(),
            },
        })?;
        // As submitted (what an operator searches for), unless it holds a
        // password.
        let shown = match parsed.password() {
            Some(_) => redacted(&parsed),
            None => url.to_string(),
        };
        let refused = |refusal| DestinationError::Refused {
            url: shown.clone(),
            refusal,
        };
        let target = self.check_before_resolution(&parsed).map_err(refused)?;
        let addrs = match &target.host {
            TargetHost::Ip(ip) => vec![*ip],
            TargetHost::Name(name) => {
                self.lookup(name, target.port)
                    .await
                    .map_err(|reason| DestinationError::Lookup {
                        url: shown.clone(),
                        host: name.clone(),
                        reason,
                    })?
            }
        };
        self.check_addresses(&target.host, &addrs, target.plain_http)
            .map_err(refused)?;
        Ok(addrs
            .into_iter()
            .map(|ip| SocketAddr::new(ip, target.port))
            .collect())
    }

    /// An HTTP client that keeps to the policy on every connection: it
    /// resolves each host through the policy (its fixed mappings, else the
    /// system resolver) and connects only to the addresses that passed;
    /// follows at most 10 redirects, each checked first; and uses no proxy.
    /// The client [`WebhookDeliveryWorker`](crate::webhooks::WebhookDeliveryWorker)
    /// delivers with; give it to
    /// [`WebhookWorker::with_client`](taquba_webhooks::WebhookWorker::with_client)
    /// to keep a plain worker to the policy at connection time (without the
    /// permanent refusals the delivery worker's check gives).
    ///
    /// A refusal at connection time (a name whose answer changed since
    /// the check) is a transport error of the request: the delivery is
    /// retried, and never reaches the refused address.
    ///
    /// # Errors
    /// When reqwest cannot build the client (its TLS backend fails to
    /// initialize).
    pub fn http_client(&self) -> Result<reqwest::Client, reqwest::Error> {
        let policy = Arc::new(self.clone());
        let redirects = Arc::clone(&policy);
        reqwest::Client::builder()
            .no_proxy()
            .dns_resolver(Arc::new(PolicyResolver { policy }))
            .redirect(reqwest::redirect::Policy::custom(move |attempt| {
                if attempt.previous().len() > MAX_REDIRECTS {
                    let error = format!("more than {MAX_REDIRECTS} redirects");
                    return attempt.error(error);
                }
                match redirects.check_redirect(attempt.url()) {
                    Ok(()) => attempt.follow(),
                    Err(refused) => attempt.error(refused),
                }
            }))
            .build()
    }

    /// The rules that need no resolution: scheme, metadata names, host and
    /// port allowlists.
    fn check_before_resolution(&self, url: &Url) -> Result<Target, Refusal> {
        let scheme = url.scheme();
        let plain_http = match scheme {
            "https" => false,
            "http" => !self.schemes.contains("http"),
            _ => {
                return Err(Refusal::Scheme {
                    scheme: scheme.to_string(),
                });
            }
        };
        let host = match url.host() {
            Some(Host::Domain(name)) => TargetHost::Name(normalize_name(name)),
            Some(Host::Ipv4(ip)) => TargetHost::Ip(IpAddr::V4(ip)),
            Some(Host::Ipv6(ip)) => TargetHost::Ip(IpAddr::V6(ip)),
            None => {
                return Err(Refusal::InvalidUrl {
                    reason: "no host".to_string(),
                });
            }
        };
        self.check_host(&host)?;
        let port = url
            .port_or_known_default()
            .ok_or_else(|| Refusal::InvalidUrl {
                reason: "no port".to_string(),
            })?;
        if !self.ports.is_empty() && !self.ports.contains(&port) {
            return Err(Refusal::Port { port });
        }
        Ok(Target {
            host,
            port,
            plain_http,
        })
    }

    /// The metadata names and the host allowlist.
    fn check_host(&self, host: &TargetHost) -> Result<(), Refusal> {
        if let TargetHost::Name(name) = host
            && METADATA_HOSTS.contains(&name.as_str())
        {
            return Err(Refusal::MetadataHost { host: name.clone() });
        }
        if !self.hosts.is_empty() && !self.hosts.iter().any(|p| p.matches(host)) {
            return Err(Refusal::Host {
                host: host.to_string(),
            });
        }
        Ok(())
    }

    /// Every address of `host` is of an allowed class, and a loopback
    /// address when the scheme is `http` restricted to loopback.
    fn check_addresses(
        &self,
        host: &TargetHost,
        addrs: &[IpAddr],
        plain_http: bool,
    ) -> Result<(), Refusal> {
        for &addr in addrs {
            let class = AddressClass::of(addr);
            let allowed = match class {
                AddressClass::Public => true,
                AddressClass::Loopback => self.allow_loopback,
                AddressClass::Private | AddressClass::SharedAddressSpace => {
                    self.allow_private_networks
                }
                _ => false,
            };
            if !allowed {
                return Err(Refusal::Address {
                    host: host.to_string(),
                    addr,
                    class,
                });
            }
            if plain_http && class != AddressClass::Loopback {
                return Err(Refusal::PlainHttp {
                    host: host.to_string(),
                });
            }
        }
        Ok(())
    }

    /// A redirect's target, checked before it is followed: everything but
    /// a name's addresses, which the client's resolver checks when it
    /// connects. Plain `http` restricted to loopback cannot be confirmed
    /// for a name here, so it is refused.
    fn check_redirect(&self, url: &Url) -> Result<(), DestinationError> {
        let refused = |refusal| DestinationError::Refused {
            url: redacted(url),
            refusal,
        };
        let target = self.check_before_resolution(url).map_err(refused)?;
        match &target.host {
            TargetHost::Ip(ip) => self
                .check_addresses(&target.host, &[*ip], target.plain_http)
                .map_err(refused),
            TargetHost::Name(_) if target.plain_http => Err(refused(Refusal::PlainHttp {
                host: target.host.to_string(),
            })),
            TargetHost::Name(_) => Ok(()),
        }
    }

    /// The addresses `host` resolves to, from the fixed mappings or the
    /// system resolver; an error when there are none.
    async fn lookup(&self, host: &str, port: u16) -> Result<Vec<IpAddr>, String> {
        let found: Vec<IpAddr> = match self.resolved.get(host) {
            Some(addrs) => addrs.clone(),
            None => tokio::time::timeout(LOOKUP_TIMEOUT, tokio::net::lookup_host((host, port)))
                .await
                .map_err(|_| format!("no answer within {LOOKUP_TIMEOUT:?}"))?
                .map_err(|e| e.to_string())?
                .map(|addr| addr.ip())
                .collect(),
        };
        // The resolver's order, each address once.
        let mut addrs = Vec::with_capacity(found.len());
        for addr in found {
            if !addrs.contains(&addr) {
                addrs.push(addr);
            }
        }
        if addrs.is_empty() {
            return Err("no addresses".to_string());
        }
        Ok(addrs)
    }

    /// The checks of a connection's host, by name: the metadata names, the
    /// host allowlist, and the addresses of one resolution, which are the
    /// ones returned (the port is the URL's, set by the connector).
    async fn resolve_checked(&self, name: &str) -> Result<Vec<IpAddr>, DestinationError> {
        let normalized = normalize_name(name);
        let host = TargetHost::Name(normalized.clone());
        let refused = |refusal| DestinationError::Refused {
            url: name.to_string(),
            refusal,
        };
        self.check_host(&host).map_err(refused)?;
        let addrs =
            self.lookup(&normalized, 0)
                .await
                .map_err(|reason| DestinationError::Lookup {
                    url: name.to_string(),
                    host: normalized.clone(),
                    reason,
                })?;
        self.check_addresses(&host, &addrs, false)
            .map_err(refused)?;
        Ok(addrs)
    }
}

/// `url` as an error shows it: its password replaced by `***`.
fn redacted(url: &Url) -> String {
    if url.password().is_none() {
        return url.to_string();
    }
    let mut shown = url.clone();
    // Only fails for a URL that cannot have credentials, which this one has.
    let _ = shown.set_password(Some("***"));
    shown.to_string()
}

/// The error type of a reqwest resolver.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The resolver of [`DestinationPolicy::http_client`]: every name the client
/// connects to is resolved and checked here, and only the checked addresses
/// go to the connector. (An IP address in a URL is never resolved; the
/// delivery worker's check and the redirect check cover it.)
struct PolicyResolver {
    /// Shared with the client's redirect check.
    policy: Arc<DestinationPolicy>,
}

impl reqwest::dns::Resolve for PolicyResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = Arc::clone(&self.policy);
        let name = name.as_str().to_string();
        Box::pin(async move {
            let resolved: Result<reqwest::dns::Addrs, BoxError> =
                match policy.resolve_checked(&name).await {
                    Ok(addrs) => Ok(Box::new(addrs.into_iter().map(|ip| SocketAddr::new(ip, 0)))),
                    Err(refused) => Err(Box::new(refused)),
                };
            resolved
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn class(text: &str) -> AddressClass {
        AddressClass::of(ip(text))
    }

    /// The refusal of `url` by `policy`, or `None` when it passes.
    async fn refusal(policy: &DestinationPolicy, url: &str) -> Option<Refusal> {
        match policy.check(url).await {
            Ok(_) => None,
            Err(DestinationError::Refused { refusal, .. }) => Some(refusal),
            Err(lookup) => panic!("{url}: {lookup}"),
        }
    }

    async fn passes(policy: &DestinationPolicy, url: &str) {
        if let Some(refusal) = refusal(policy, url).await {
            panic!("{url} refused: {refusal}");
        }
    }

    async fn refused_by_class(policy: &DestinationPolicy, url: &str, expected: AddressClass) {
        match refusal(policy, url).await {
            Some(Refusal::Address { class, .. }) => assert_eq!(class, expected, "{url}"),
            other => panic!("{url}: {other:?}"),
        }
    }

    #[test]
    fn ipv4_ranges_are_classified_with_their_boundaries() {
        use AddressClass::*;
        for (addr, expected) in [
            ("8.8.8.8", Public),
            ("203.0.113.10", Public),
            ("0.0.0.0", Unspecified),
            ("0.1.2.3", Unspecified),
            ("127.0.0.1", Loopback),
            ("127.255.255.254", Loopback),
            ("10.0.0.0", Private),
            ("10.255.255.255", Private),
            ("9.255.255.255", Public),
            ("11.0.0.0", Public),
            ("172.16.0.1", Private),
            ("172.31.255.255", Private),
            ("172.15.255.255", Public),
            ("172.32.0.0", Public),
            ("192.168.0.1", Private),
            ("192.169.0.1", Public),
            ("100.64.0.1", SharedAddressSpace),
            ("100.127.255.255", SharedAddressSpace),
            ("100.63.255.255", Public),
            ("100.128.0.0", Public),
            ("169.254.0.1", LinkLocal),
            ("169.254.169.254", Metadata),
            ("100.100.100.200", Metadata),
            ("169.255.0.1", Public),
            ("224.0.0.1", Multicast),
            ("239.255.255.255", Multicast),
            ("240.0.0.1", Reserved),
            ("255.255.255.255", Broadcast),
        ] {
            assert_eq!(class(addr), expected, "{addr}");
        }
    }

    #[test]
    fn ipv6_ranges_and_the_ipv4_they_carry_are_classified() {
        use AddressClass::*;
        for (addr, expected) in [
            ("2606:4700::1111", Public),
            ("::", Unspecified),
            ("::1", Loopback),
            ("fe80::1", LinkLocal),
            ("febf:ffff::1", LinkLocal),
            ("fec0::1", Private),
            ("fc00::1", Private),
            ("fdff:ffff::1", Private),
            ("fd00:ec2::254", Metadata),
            ("fd00:ec2::253", Private),
            ("ff02::1", Multicast),
            // IPv4-mapped.
            ("::ffff:127.0.0.1", Loopback),
            ("::ffff:10.0.0.1", Private),
            ("::ffff:169.254.169.254", Metadata),
            ("::ffff:169.254.1.1", LinkLocal),
            ("::ffff:100.64.0.1", SharedAddressSpace),
            ("::ffff:0.0.0.0", Unspecified),
            ("::ffff:8.8.8.8", Public),
            // IPv4-compatible, NAT64, 6to4.
            ("::10.0.0.1", Private),
            ("::127.0.0.1", Loopback),
            ("64:ff9b::a9fe:a9fe", Metadata),
            ("64:ff9b::c0a8:101", Private),
            ("64:ff9b::808:808", Public),
            ("2002:a00:1::", Private),
            ("2002:7f00:1::1", Loopback),
            ("2002:808:808::1", Public),
        ] {
            assert_eq!(class(addr), expected, "{addr}");
        }
    }

    #[tokio::test]
    async fn the_scheme_rule_allows_https_and_http_only_to_loopback_by_default() {
        let policy = DestinationPolicy::default();
        passes(&policy, "https://203.0.113.10/cb").await;
        assert_eq!(
            refusal(&policy, "ftp://203.0.113.10/cb").await,
            Some(Refusal::Scheme {
                scheme: "ftp".into()
            })
        );
        assert_eq!(
            refusal(&policy, "http://203.0.113.10/cb").await,
            Some(Refusal::PlainHttp {
                host: "203.0.113.10".into()
            })
        );
        // Loopback itself is refused until allowed; then http reaches it.
        refused_by_class(&policy, "http://127.0.0.1:8080/cb", AddressClass::Loopback).await;
        let local = DestinationPolicy::default().allow_loopback();
        passes(&local, "http://127.0.0.1:8080/cb").await;
        passes(&local, "http://[::1]:8080/cb").await;
        passes(&local, "https://127.0.0.1/cb").await;
        assert!(matches!(
            refusal(&local, "http://203.0.113.10/cb").await,
            Some(Refusal::PlainHttp { .. })
        ));
        // A name resolving to loopback and elsewhere is not loopback.
        let mixed = local
            .clone()
            .resolve_to("mixed.test", [ip("127.0.0.1"), ip("203.0.113.10")]);
        assert!(matches!(
            refusal(&mixed, "http://mixed.test/cb").await,
            Some(Refusal::PlainHttp { .. })
        ));
        // allow_scheme("http") lifts the loopback restriction, not others.
        let http = DestinationPolicy::default().allow_scheme("HTTP");
        passes(&http, "http://203.0.113.10/cb").await;
        refused_by_class(&http, "http://10.0.0.1/cb", AddressClass::Private).await;
        let ftp = DestinationPolicy::default().allow_scheme("ftp");
        assert!(matches!(
            refusal(&ftp, "ftp://203.0.113.10/cb").await,
            Some(Refusal::Scheme { .. })
        ));
    }

    #[tokio::test]
    async fn the_host_allowlist_matches_exact_names_and_subdomain_wildcards() {
        let public = [ip("203.0.113.10")];
        let policy = DestinationPolicy::default()
            .allow_host("Hooks.Example.com.")
            .allow_host("*.customers.example.net")
            .allow_host("198.51.100.7")
            .allow_host("[2001:db8::7]")
            .resolve_to("hooks.example.com", public)
            .resolve_to("other.example.com", public)
            .resolve_to("a.customers.example.net", public)
            .resolve_to("a.b.customers.example.net", public)
            .resolve_to("customers.example.net", public)
            .resolve_to("evilcustomers.example.net", public)
            .resolve_to("customers.example.net.evil.test", public);
        for url in [
            "https://hooks.example.com/cb",
            "https://HOOKS.example.com./cb",
            "https://a.customers.example.net/cb",
            "https://a.b.customers.example.net/cb",
            "https://198.51.100.7/cb",
            "https://[2001:db8::7]/cb",
        ] {
            passes(&policy, url).await;
        }
        for (url, host) in [
            ("https://other.example.com/cb", "other.example.com"),
            ("https://customers.example.net/cb", "customers.example.net"),
            (
                "https://evilcustomers.example.net/cb",
                "evilcustomers.example.net",
            ),
            (
                "https://customers.example.net.evil.test/cb",
                "customers.example.net.evil.test",
            ),
            ("https://198.51.100.8/cb", "198.51.100.8"),
        ] {
            assert_eq!(
                refusal(&policy, url).await,
                Some(Refusal::Host { host: host.into() }),
                "{url}"
            );
        }
        // An allowed host still resolves to allowed addresses only.
        let internal = DestinationPolicy::default()
            .allow_host("hooks.example.com")
            .resolve_to("hooks.example.com", [ip("10.1.2.3")]);
        refused_by_class(
            &internal,
            "https://hooks.example.com/cb",
            AddressClass::Private,
        )
        .await;
        passes(
            &internal.allow_private_networks(),
            "https://hooks.example.com/cb",
        )
        .await;
        // A pattern that is not a host matches nothing.
        let nonsense = DestinationPolicy::default().allow_host("*");
        assert!(matches!(
            refusal(&nonsense, "https://203.0.113.10/cb").await,
            Some(Refusal::Host { .. })
        ));
    }

    #[tokio::test]
    async fn the_port_allowlist_counts_the_schemes_default_port() {
        let open = DestinationPolicy::default();
        passes(&open, "https://203.0.113.10:9999/cb").await;
        let policy = DestinationPolicy::default().allow_port(8443);
        passes(&policy, "https://203.0.113.10:8443/cb").await;
        assert_eq!(
            refusal(&policy, "https://203.0.113.10/cb").await,
            Some(Refusal::Port { port: 443 })
        );
        assert_eq!(
            refusal(&policy, "https://203.0.113.10:9443/cb").await,
            Some(Refusal::Port { port: 9443 })
        );
        passes(&policy.allow_port(443), "https://203.0.113.10/cb").await;
    }

    #[tokio::test]
    async fn every_refused_range_is_refused_in_every_spelling() {
        use AddressClass::*;
        let policy = DestinationPolicy::default();
        for (url, expected) in [
            ("https://127.0.0.1/", Loopback),
            ("https://2130706433/", Loopback),
            ("https://0x7f.1/", Loopback),
            ("https://[::1]/", Loopback),
            ("https://[::ffff:127.0.0.1]/", Loopback),
            ("https://10.1.2.3/", Private),
            ("https://172.16.0.1/", Private),
            ("https://192.168.1.1/", Private),
            ("https://[fc00::1]/", Private),
            ("https://[fd12:3456::1]/", Private),
            ("https://[::ffff:10.0.0.1]/", Private),
            ("https://[::ffff:192.168.0.1]/", Private),
            ("https://100.64.0.1/", SharedAddressSpace),
            ("https://169.254.1.1/", LinkLocal),
            ("https://[fe80::1]/", LinkLocal),
            ("https://169.254.169.254/latest/meta-data/", Metadata),
            ("https://[::ffff:169.254.169.254]/", Metadata),
            ("https://[::ffff:a9fe:a9fe]/", Metadata),
            ("https://[fd00:ec2::254]/", Metadata),
            ("https://100.100.100.200/", Metadata),
            ("https://0.0.0.0/", Unspecified),
            ("https://[::]/", Unspecified),
            ("https://224.0.0.1/", Multicast),
            ("https://[ff02::1]/", Multicast),
            ("https://255.255.255.255/", Broadcast),
            ("https://240.0.0.1/", Reserved),
        ] {
            refused_by_class(&policy, url, expected).await;
        }
        // The options open their ranges and nothing else.
        let open = DestinationPolicy::default()
            .allow_loopback()
            .allow_private_networks();
        for url in [
            "https://127.0.0.1/",
            "https://[::1]/",
            "https://10.1.2.3/",
            "https://[fd12:3456::1]/",
            "https://[::ffff:192.168.0.1]/",
            "https://100.64.0.1/",
        ] {
            passes(&open, url).await;
        }
        for (url, expected) in [
            ("https://169.254.1.1/", LinkLocal),
            ("https://[fe80::1]/", LinkLocal),
            ("https://169.254.169.254/", Metadata),
            ("https://[fd00:ec2::254]/", Metadata),
            ("https://100.100.100.200/", Metadata),
            ("https://0.0.0.0/", Unspecified),
        ] {
            refused_by_class(&open, url, expected).await;
        }
    }

    #[tokio::test]
    async fn a_name_is_checked_by_what_it_resolves_to() {
        let policy = DestinationPolicy::default()
            .resolve_to("internal.test", [ip("10.0.0.7")])
            .resolve_to("sneaky.test", [ip("203.0.113.10"), ip("192.168.1.1")])
            .resolve_to("public.test", [ip("203.0.113.10")])
            .resolve_to("v6.test", [ip("::ffff:169.254.169.254")])
            .resolve_to("nowhere.test", []);
        assert_eq!(
            refusal(&policy, "https://internal.test/cb").await,
            Some(Refusal::Address {
                host: "internal.test".into(),
                addr: ip("10.0.0.7"),
                class: AddressClass::Private,
            })
        );
        refused_by_class(&policy, "https://sneaky.test/cb", AddressClass::Private).await;
        refused_by_class(&policy, "https://v6.test/cb", AddressClass::Metadata).await;
        assert_eq!(
            policy.check("https://public.test:8443/cb").await,
            Ok(vec!["203.0.113.10:8443".parse().unwrap()])
        );
        let lookup = policy.check("https://nowhere.test/cb").await.unwrap_err();
        assert!(!lookup.is_permanent(), "{lookup}");
        assert!(matches!(lookup, DestinationError::Lookup { .. }));
    }

    #[tokio::test]
    async fn a_metadata_name_is_refused_whatever_it_resolves_to() {
        let policy = DestinationPolicy::default()
            .allow_host("metadata.google.internal")
            .resolve_to("metadata.google.internal", [ip("203.0.113.10")]);
        for url in [
            "https://metadata.google.internal/computeMetadata/v1/",
            "https://METADATA.google.internal./",
        ] {
            assert_eq!(
                refusal(&policy, url).await,
                Some(Refusal::MetadataHost {
                    host: "metadata.google.internal".into()
                }),
                "{url}"
            );
        }
    }

    #[tokio::test]
    async fn the_error_names_the_url_and_the_rule_and_hides_a_password() {
        let policy = DestinationPolicy::default().resolve_to("internal.test", [ip("10.0.0.7")]);
        let error = policy
            .check("https://user:secret@internal.test/cb?x=1")
            .await
            .unwrap_err();
        assert!(error.is_permanent());
        assert!(matches!(error.refusal(), Some(Refusal::Address { .. })));
        let message = error.to_string();
        assert_eq!(
            message,
            "webhook destination `https://user:***@internal.test/cb?x=1` refused: rule \
             `private`: `internal.test` resolves to 10.0.0.7, a private-network address \
             (allowed only with `allow_private_networks`)"
        );
        let literal = policy.check("https://169.254.169.254/").await.unwrap_err();
        assert_eq!(
            literal.to_string(),
            "webhook destination `https://169.254.169.254/` refused: rule `metadata`: \
             169.254.169.254 is a cloud metadata address (never allowed)"
        );
        for url in ["not a url", "https://", "mailto:ops@example.com"] {
            let error = policy.check(url).await.unwrap_err();
            assert!(error.is_permanent(), "{url}: {error}");
            assert!(error.to_string().contains(url), "{error}");
        }
    }

    #[tokio::test]
    async fn the_clients_resolver_checks_every_resolution_it_hands_over() {
        use reqwest::dns::Resolve;
        let policy = Arc::new(
            DestinationPolicy::default()
                .allow_loopback()
                .resolve_to("internal.test", [ip("10.0.0.7")])
                .resolve_to("local.test", [ip("127.0.0.1"), ip("::1")])
                .resolve_to("metadata.google.internal", [ip("203.0.113.10")]),
        );
        let resolver = PolicyResolver {
            policy: Arc::clone(&policy),
        };
        let resolve = |name: &str| resolver.resolve(name.parse().unwrap());
        let addrs: Vec<SocketAddr> = resolve("local.test").await.unwrap().collect();
        assert_eq!(
            addrs,
            vec!["127.0.0.1:0".parse().unwrap(), "[::1]:0".parse().unwrap()]
        );
        for name in ["internal.test", "metadata.google.internal"] {
            let error = resolve(name).await.err().expect("refused");
            let refused = error
                .downcast_ref::<DestinationError>()
                .expect("the policy's error");
            assert!(refused.is_permanent(), "{refused}");
        }
    }

    #[test]
    fn a_redirect_is_checked_before_it_is_followed() {
        let policy = DestinationPolicy::default().allow_loopback();
        let check = |url: &str| policy.check_redirect(&Url::parse(url).unwrap());
        assert!(check("https://hooks.example.com/next").is_ok());
        assert!(check("http://127.0.0.1:8080/next").is_ok());
        for url in [
            "https://169.254.169.254/",
            "https://10.0.0.1/",
            "http://hooks.example.com/next",
            "ftp://203.0.113.10/",
            "https://metadata.google.internal/",
        ] {
            let error = check(url).unwrap_err();
            assert!(error.is_permanent(), "{url}: {error}");
        }
        let narrow = DestinationPolicy::default()
            .allow_host("hooks.example.com")
            .allow_port(443);
        let check = |url: &str| narrow.check_redirect(&Url::parse(url).unwrap());
        assert!(check("https://hooks.example.com/next").is_ok());
        assert!(check("https://elsewhere.example.com/").is_err());
        assert!(check("https://hooks.example.com:8443/").is_err());
    }
}
