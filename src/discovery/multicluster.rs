//! llm-d-router's `multicluster-file-discovery` (v0.10, alpha): a hub's clusters from a file,
//! each one endpoint (the spoke's gateway). The format is `file-discovery`'s ([`super::file`]):
//!
//! ```yaml
//! endpoints:
//!   - name: us-east                  # required, unique (with its namespace)
//!     address: gw.us-east.example    # required: an IP, or a host name (DNS-1123 subdomain)
//!     port: "443"                    # required: 1-65535
//!     labels:
//!       metricsAddress: epp.us-east.example   # optional: where the spoke EPP's metrics are
//!       metricsPort: "9090"                   # optional (default: port)
//! ```
//!
//! As upstream: an address may be a host name, a bad entry is skipped with its reason, and the
//! spoke's metrics are at `metricsAddress:metricsPort` when labelled, else at the cluster's own
//! `address:port`, kept as written (a host name stays one, for its certificate).
//!
//! Beyond upstream: a host name is resolved when the file is read (at start-up and on each
//! reload). Envoy's `ORIGINAL_DST` cluster routes to the `ip:port` epp answers with and cannot
//! resolve a name, so upstream's hub answering `gw.us-east.example:443` is unroutable there;
//! epp answers the address the name resolved to (its first, IPv4 preferred). A name that does
//! not resolve skips its entry, logged, like any other bad entry.

use super::file::{self, Entry, FileError, Parsed, Skip};
use crate::endpoint::{Endpoint, EndpointId};
use std::net::{IpAddr, SocketAddr};

/// The label naming where a cluster's EPP serves its metrics (upstream's name).
pub(crate) const METRICS_ADDRESS: &str = "metricsAddress";
/// The label naming that port (default: the cluster's port).
pub(crate) const METRICS_PORT: &str = "metricsPort";

/// Resolves a host name to its addresses (the system's resolver; a table in tests).
pub(crate) type Resolve<'a> = &'a dyn Fn(&str, u16) -> std::io::Result<Vec<SocketAddr>>;

/// The system's resolver (blocking: the caller runs it off the request path).
pub(crate) fn system_resolver(host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
    use std::net::ToSocketAddrs;
    Ok((host, port).to_socket_addrs()?.collect())
}

/// Parses the clusters file's text, resolving host names with `resolve`.
pub(crate) fn parse(text: &str, resolve: Resolve<'_>) -> Result<Parsed, FileError> {
    file::parse_with(text, &|e| cluster(e, resolve))
}

/// One entry as a cluster endpoint, or why it is skipped.
fn cluster(e: &Entry, resolve: Resolve<'_>) -> Result<Endpoint, Skip> {
    let name = file::name(e)?;
    let port = file::port(e)?;
    let host = e.address.trim();
    let ip = match host.parse::<IpAddr>() {
        Ok(ip) => ip,
        Err(_) if is_dns_subdomain(host) => resolved(host, port, resolve)?,
        Err(_) => return Err(Skip::BadHost(e.address.clone())),
    };
    Ok(Endpoint {
        name: name.to_owned(),
        labels: e.labels.clone(),
        metrics_host: Some(metrics_host(host, port, e)),
        ..Endpoint::from_id(EndpointId(SocketAddr::new(ip, port)))
    })
}

/// The first address `host` resolves to, IPv4 first.
fn resolved(host: &str, port: u16, resolve: Resolve<'_>) -> Result<IpAddr, Skip> {
    let unresolved = |source| Skip::Unresolved {
        host: host.to_owned(),
        source,
    };
    let addrs = resolve(host, port).map_err(unresolved)?;
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .map(SocketAddr::ip)
        .ok_or_else(|| unresolved(std::io::ErrorKind::NotFound.into()))
}

/// `metricsAddress:metricsPort` when labelled (the port defaulting to the cluster's), else the
/// cluster's own address as written; IPv6 bracketed, as Go's `net.JoinHostPort`.
fn metrics_host(address: &str, port: u16, e: &Entry) -> String {
    let label = |k: &str| e.labels.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
    let Some(addr) = label(METRICS_ADDRESS) else {
        return join(address, &port.to_string());
    };
    let port = label(METRICS_PORT).map_or_else(|| port.to_string(), str::to_owned);
    join(addr, &port)
}

fn join(host: &str, port: &str) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Kubernetes' DNS-1123 subdomain: at most 253 characters of dot-separated lower-case
/// alphanumeric labels, `-` inside a label.
fn is_dns_subdomain(s: &str) -> bool {
    let label = |l: &str| {
        let b = l.as_bytes();
        let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
        b.first().is_some_and(alnum)
            && b.last().is_some_and(alnum)
            && b.iter().all(|c| alnum(c) || *c == b'-')
    };
    !s.is_empty() && s.len() <= 253 && s.split('.').all(label)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
        match host {
            "gw.east.example" => Ok(vec![
                SocketAddr::new("fd00::7".parse().unwrap(), port),
                SocketAddr::new("10.1.0.7".parse().unwrap(), port),
            ]),
            "gw6.example" => Ok(vec![SocketAddr::new("fd00::8".parse().unwrap(), port)]),
            _ => Err(std::io::ErrorKind::NotFound.into()),
        }
    }

    fn clusters(yaml: &str) -> Parsed {
        parse(yaml, &table).unwrap()
    }

    #[test]
    fn host_names_resolve_ipv4_first_and_keep_their_name_for_metrics() {
        let p = clusters(
            "endpoints:
- {name: east, address: gw.east.example, port: '443'}
- {name: v6, address: gw6.example, port: 443}
- {name: ip, address: 10.2.0.1, port: '8080', labels: {metricsAddress: epp.west.example, metricsPort: '9090'}}
- {name: ip-port, address: 10.2.0.2, port: '8080', labels: {metricsAddress: 'fd00::9'}}
",
        );
        assert!(p.skipped.is_empty(), "{:?}", p.skipped);
        let got: Vec<(String, Option<&str>)> = p
            .endpoints
            .iter()
            .map(|e| (e.id.to_string(), e.metrics_host.as_deref()))
            .collect();
        assert_eq!(
            got,
            [
                ("10.1.0.7:443".to_owned(), Some("gw.east.example:443")),
                ("[fd00::8]:443".to_owned(), Some("gw6.example:443")),
                ("10.2.0.1:8080".to_owned(), Some("epp.west.example:9090")),
                ("10.2.0.2:8080".to_owned(), Some("[fd00::9]:8080")),
            ]
        );
        assert_eq!(p.endpoints[2].labels[METRICS_PORT], "9090");
    }

    #[test]
    fn a_bad_or_unresolvable_host_skips_its_entry_only() {
        let p = clusters(
            "endpoints:
- {name: ok, address: 10.0.0.1, port: '80'}
- {name: upper, address: GW.example, port: '80'}
- {name: gone, address: nowhere.example, port: '80'}
- {name: under, address: gw_1.example, port: '80'}
- {address: 10.0.0.2, port: '80'}
",
        );
        assert_eq!(p.endpoints.len(), 1);
        let why = p.skipped.join("\n");
        for says in [
            "invalid host \"GW.example\"",
            "host \"nowhere.example\" does not resolve",
            "invalid host \"gw_1.example\"",
            "name is required",
        ] {
            assert!(why.contains(says), "{says:?} not in\n{why}");
        }
    }

    #[test]
    fn dns_subdomains_are_checked_as_kubernetes_does() {
        for ok in ["a", "gw.us-east-1.example", "0.x"] {
            assert!(is_dns_subdomain(ok), "{ok}");
        }
        let long = "a".repeat(254);
        for bad in ["", "-a", "a-", "a..b", "A", "a_b", long.as_str()] {
            assert!(!is_dns_subdomain(bad), "{bad}");
        }
    }
}
