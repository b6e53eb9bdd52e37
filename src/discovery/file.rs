//! llm-d-router's endpoints file (`file-discovery`, v0.10): endpoints without Kubernetes.
//!
//! ```yaml
//! endpoints:
//!   - name: vllm-0            # required, unique (with its namespace)
//!     namespace: default      # optional
//!     address: "10.0.0.1"     # required: an IP literal, no host names
//!     port: "8000"            # required: 1-65535 (upstream writes it as a string)
//!     labels: {k: v}          # optional
//! ```
//!
//! YAML or JSON (JSON is YAML). As upstream: a file that cannot be read or parsed, or is over
//! 1 MiB, is an error (start-up fails; a reload keeps the last good endpoints), while a bad
//! entry is skipped with a reason that is logged. Unknown keys are ignored, as upstream's
//! decoder does. Two entries with the same namespace and name: the later wins (upstream
//! upserts by that key). Where epp accepts more than upstream: IPv6 addresses and an integer
//! `port`; a second entry at the same `address:port` (two names for one server) is skipped.

use crate::endpoint::{Endpoint, EndpointId};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};

/// Upstream's size cap.
pub(crate) const MAX_BYTES: usize = 1 << 20;

/// Why one entry is skipped (the rest of the file still counts).
#[derive(Debug, thiserror::Error)]
pub(crate) enum Skip {
    #[error("name is required")]
    NoName,
    #[error("address {0:?} is not an IP address")]
    NotIp(String),
    #[error("port is required")]
    NoPort,
    #[error("port must be an integer in 1-65535, got {0}")]
    BadPort(String),
    /// A cluster's address that is neither an IP nor a DNS-1123 subdomain (upstream's words).
    #[error("invalid host {0:?}")]
    BadHost(String),
    /// A cluster's host name that has no address.
    #[error("host {host:?} does not resolve: {source}")]
    Unresolved {
        host: String,
        #[source]
        source: std::io::Error,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("endpoints file is {0} bytes, over the 1 MiB limit")]
    TooLarge(usize),
    #[error("endpoints file: {0}")]
    Parse(#[from] serde_norway::Error),
}

#[derive(Deserialize)]
struct Document {
    #[serde(default)]
    endpoints: Option<Vec<serde_norway::Value>>,
}

/// One entry of the file, as written (shared with `multicluster-file-discovery`, whose
/// entries are clusters).
#[derive(Deserialize)]
pub(super) struct Entry {
    #[serde(default)]
    pub(crate) name: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    pub(crate) address: String,
    #[serde(default)]
    port: Option<Port>,
    #[serde(default)]
    pub(crate) labels: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum Port {
    Text(String),
    Number(i64),
}

/// The endpoints of one read of the file, and why each skipped entry was skipped.
#[derive(Debug, Default)]
pub struct Parsed {
    pub endpoints: Vec<Endpoint>,
    pub(crate) skipped: Vec<String>,
}

/// Parses the file's text.
pub fn parse(text: &str) -> Result<Parsed, FileError> {
    parse_with(text, &endpoint)
}

/// Parses the file's text, each entry made an endpoint by `build` (or skipped with its reason).
pub(super) fn parse_with(
    text: &str,
    build: &dyn Fn(&Entry) -> Result<Endpoint, Skip>,
) -> Result<Parsed, FileError> {
    if text.len() > MAX_BYTES {
        return Err(FileError::TooLarge(text.len()));
    }
    let doc: Option<Document> = serde_norway::from_str(text)?;
    let entries = doc.and_then(|d| d.endpoints).unwrap_or_default();
    let mut out = Parsed::default();
    // namespace/name -> position in `kept` (the later entry replaces the earlier).
    let mut by_key: HashMap<(String, String), usize> = HashMap::new();
    let mut kept: Vec<Option<Endpoint>> = Vec::new();
    for (i, value) in entries.into_iter().enumerate() {
        let entry = match serde_norway::from_value::<Entry>(value) {
            Ok(e) => e,
            Err(e) => {
                out.skipped.push(format!("endpoints[{i}]: {e}"));
                continue;
            }
        };
        match build(&entry) {
            Ok(ep) => {
                let namespace = match entry.namespace.trim() {
                    "" => "default".to_owned(),
                    ns => ns.to_owned(),
                };
                let key = (namespace, entry.name.trim().to_owned());
                if let Some(&at) = by_key.get(&key) {
                    kept[at] = None;
                }
                by_key.insert(key, kept.len());
                kept.push(Some(ep));
            }
            Err(why) => out
                .skipped
                .push(format!("endpoints[{i}] ({:?}): {why}", entry.name)),
        }
    }
    let mut seen = HashSet::new();
    for ep in kept.into_iter().flatten() {
        if seen.insert(ep.id) {
            out.endpoints.push(ep);
        } else {
            out.skipped.push(format!(
                "{:?}: {} is already the address of an earlier entry",
                ep.name, ep.id
            ));
        }
    }
    Ok(out)
}

/// One entry as an endpoint, or why it is skipped.
fn endpoint(e: &Entry) -> Result<Endpoint, Skip> {
    let name = name(e)?;
    let address: IpAddr = e
        .address
        .trim()
        .parse()
        .map_err(|_| Skip::NotIp(e.address.clone()))?;
    let id = EndpointId(SocketAddr::new(address, port(e)?));
    Ok(Endpoint {
        name: name.to_owned(),
        labels: e.labels.clone(),
        ..Endpoint::from_id(id)
    })
}

/// The entry's name (required).
pub(super) fn name(e: &Entry) -> Result<&str, Skip> {
    match e.name.trim() {
        "" => Err(Skip::NoName),
        name => Ok(name),
    }
}

/// The entry's port (required, 1-65535, a string or a number).
pub(super) fn port(e: &Entry) -> Result<u16, Skip> {
    let port = match &e.port {
        None => return Err(Skip::NoPort),
        Some(Port::Text(t)) => t.trim().parse::<i64>().ok(),
        Some(Port::Number(n)) => Some(*n),
    }
    .and_then(|p| u16::try_from(p).ok())
    .filter(|p| *p != 0);
    let Some(port) = port else {
        return Err(Skip::BadPort(match &e.port {
            Some(Port::Text(t)) => format!("{t:?}"),
            Some(Port::Number(n)) => n.to_string(),
            None => String::new(),
        }));
    };
    Ok(port)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(p: &Parsed) -> Vec<(String, String)> {
        p.endpoints
            .iter()
            .map(|e| (e.name.clone(), e.id.to_string()))
            .collect()
    }

    #[test]
    fn reads_upstreams_example_in_yaml_and_json() {
        let yaml = "endpoints:\n  - name: vllm-0\n    address: \"10.0.0.1\"\n    port: \"8000\"\n  - name: vllm-1\n    namespace: prod\n    address: \"10.0.0.2\"\n    port: \"8000\"\n    labels: {llm-d.ai/engine-type: sglang, zone: a}\n";
        let p = parse(yaml).unwrap();
        assert!(p.skipped.is_empty(), "{:?}", p.skipped);
        assert_eq!(
            names(&p),
            vec![
                ("vllm-0".to_owned(), "10.0.0.1:8000".to_owned()),
                ("vllm-1".to_owned(), "10.0.0.2:8000".to_owned())
            ]
        );
        assert_eq!(p.endpoints[1].labels["zone"], "a");
        assert_eq!(p.endpoints[1].weight, 1);
        let json = r#"{"endpoints":[{"name":"a","address":"127.0.0.1","port":"9000"},{"name":"b","address":"::1","port":9001}]}"#;
        let p = parse(json).unwrap();
        assert_eq!(
            names(&p),
            vec![
                ("a".to_owned(), "127.0.0.1:9000".to_owned()),
                ("b".to_owned(), "[::1]:9001".to_owned())
            ]
        );
    }

    #[test]
    fn a_bad_entry_is_skipped_with_its_reason_and_the_rest_kept() {
        let yaml = "endpoints:
  - {name: ok, address: 10.0.0.1, port: '8000'}
  - {address: 10.0.0.2, port: '8000'}
  - {name: host, address: vllm.local, port: '8000'}
  - {name: zero, address: 10.0.0.3, port: '0'}
  - {name: big, address: 10.0.0.3, port: '70000'}
  - {name: word, address: 10.0.0.3, port: http}
  - {name: noport, address: 10.0.0.3}
  - {name: labels, address: 10.0.0.4, port: '8000', labels: [a]}
  - {name: same-address, address: 10.0.0.1, port: '8000'}
  - {name: extra, address: 10.0.0.5, port: '8000', weight: 3}
";
        let p = parse(yaml).unwrap();
        assert_eq!(
            names(&p),
            vec![
                ("ok".to_owned(), "10.0.0.1:8000".to_owned()),
                ("extra".to_owned(), "10.0.0.5:8000".to_owned())
            ],
            "unknown keys are ignored, as upstream's decoder does"
        );
        let why = p.skipped.join("\n");
        for needle in [
            "endpoints[1] (\"\"): name is required",
            "\"vllm.local\" is not an IP address",
            "got \"0\"",
            "got \"70000\"",
            "got \"http\"",
            "\"noport\"): port is required",
            "endpoints[7]",
            "\"same-address\": 10.0.0.1:8000 is already the address",
        ] {
            assert!(why.contains(needle), "{needle:?} not in:\n{why}");
        }
        assert_eq!(p.skipped.len(), 8);
    }

    #[test]
    fn the_later_of_two_entries_with_one_name_wins() {
        let yaml = "endpoints:
  - {name: a, address: 10.0.0.1, port: '8000'}
  - {name: b, address: 10.0.0.2, port: '8000'}
  - {name: a, address: 10.0.0.3, port: '8000'}
  - {name: a, namespace: other, address: 10.0.0.4, port: '8000'}
";
        let p = parse(yaml).unwrap();
        assert_eq!(
            names(&p),
            vec![
                ("b".to_owned(), "10.0.0.2:8000".to_owned()),
                ("a".to_owned(), "10.0.0.3:8000".to_owned()),
                ("a".to_owned(), "10.0.0.4:8000".to_owned())
            ]
        );
    }

    #[test]
    fn file_level_problems_are_errors() {
        assert!(matches!(
            parse("endpoints: [").unwrap_err(),
            FileError::Parse(_)
        ));
        assert!(parse("endpoints: {name: a}").is_err(), "a map, not a list");
        let big = format!("# {}\nendpoints: []\n", "x".repeat(MAX_BYTES));
        assert!(matches!(parse(&big).unwrap_err(), FileError::TooLarge(_)));
        for empty in ["", "endpoints: []", "endpoints:"] {
            let p = parse(empty).unwrap();
            assert!(p.endpoints.is_empty() && p.skipped.is_empty(), "{empty:?}");
        }
    }
}
