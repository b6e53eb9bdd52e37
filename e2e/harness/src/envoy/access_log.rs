//! Parsing of the access log lines written by the `config/envoy/` templates:
//!
//! ```text
//! [START] METHOD PATH CODE flags=F details=D upstream=U hdr=H md=M served=S dur=Nms
//! ```
//!
//! (`duplex.yaml` also writes `scores=` and `cost=` before `dur=`: the `--emit-endpoint-scores`
//! struct as JSON, and `request-attribute-reporter`'s `x-gateway-inference-request-cost`; read
//! from `line` by the tests that need them.)
//!
//! `hdr` is the `x-gateway-destination-endpoint` request header as the router saw it, `md` the
//! EPP's `envoy.lb` metadata and `served` the host override_host chose. Envoy writes `-` for an
//! absent value; here that becomes `None`.

/// One access log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessLogEntry {
    pub method: String,
    pub path: String,
    /// The response code Envoy sent (0 if the downstream went away before a response).
    pub status: u16,
    /// `%RESPONSE_FLAGS%`, e.g. `UF`, `UH`, `DC`; `-` when none.
    pub flags: String,
    /// `%RESPONSE_CODE_DETAILS%`, e.g. `via_upstream` or `ext_proc_error_gRPC_error_14{…}`.
    pub details: String,
    /// The upstream host Envoy connected to.
    pub upstream: Option<String>,
    /// The `x-gateway-destination-endpoint` header after ext_proc.
    pub header: Option<String>,
    /// `envoy.lb` / `x-gateway-destination-endpoint` dynamic metadata.
    pub metadata: Option<String>,
    /// `envoy.lb` / `x-gateway-destination-endpoint-served` (override_host only).
    pub served: Option<String>,
    pub duration_ms: Option<u64>,
    /// The raw line, for assertion messages.
    pub line: String,
}

impl AccessLogEntry {
    /// Parses one line; `None` if it does not have the template's shape.
    pub fn parse(line: &str) -> Option<Self> {
        let rest = line.trim_end();
        let rest = rest.strip_prefix('[')?;
        let (_, rest) = rest.split_once("] ")?;
        let mut words = rest.split(' ');
        let method = words.next()?.to_owned();
        let path = words.next()?.to_owned();
        let status = words.next()?.parse().ok()?;
        let mut entry = Self {
            method,
            path,
            status,
            flags: String::new(),
            details: String::new(),
            upstream: None,
            header: None,
            metadata: None,
            served: None,
            duration_ms: None,
            line: line.trim_end().to_owned(),
        };
        for word in words {
            let (key, value) = word.split_once('=')?;
            entry.set(key, value);
        }
        Some(entry)
    }

    fn set(&mut self, key: &str, value: &str) {
        let optional = || (value != "-").then(|| value.to_owned());
        match key {
            "flags" => self.flags = value.to_owned(),
            "details" => self.details = value.to_owned(),
            "upstream" => self.upstream = optional(),
            "hdr" => self.header = optional(),
            "md" => self.metadata = optional(),
            "served" => self.served = optional(),
            "dur" => self.duration_ms = value.trim_end_matches("ms").parse().ok(),
            _ => {}
        }
    }
}

/// Parses every well-formed line of an access log.
pub fn parse_all(text: &str) -> Vec<AccessLogEntry> {
    text.lines().filter_map(AccessLogEntry::parse).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_routed_request() {
        let line = "[2026-01-01T00:00:00.000Z] POST /v1/completions 200 flags=- details=via_upstream \
                    upstream=127.0.0.1:18001 hdr=127.0.0.1:18001 md=127.0.0.1:18001 served=- dur=4ms\n";
        let e = AccessLogEntry::parse(line).unwrap();
        assert_eq!(e.method, "POST");
        assert_eq!(e.path, "/v1/completions");
        assert_eq!(e.status, 200);
        assert_eq!(e.flags, "-");
        assert_eq!(e.details, "via_upstream");
        assert_eq!(e.upstream.as_deref(), Some("127.0.0.1:18001"));
        assert_eq!(e.header.as_deref(), Some("127.0.0.1:18001"));
        assert_eq!(e.metadata.as_deref(), Some("127.0.0.1:18001"));
        assert_eq!(e.served, None);
        assert_eq!(e.duration_ms, Some(4));
    }

    #[test]
    fn parses_an_ext_proc_failure() {
        let line = "[t] POST /v1/completions 500 flags=- details=ext_proc_error_gRPC_error_14{x} \
                    upstream=- hdr=- md=- served=- dur=1ms";
        let e = AccessLogEntry::parse(line).unwrap();
        assert_eq!(e.status, 500);
        assert_eq!(e.details, "ext_proc_error_gRPC_error_14{x}");
        assert_eq!(e.upstream, None);
    }

    #[test]
    fn skips_lines_of_another_shape() {
        assert_eq!(parse_all("hello\n[t] GET / 200 flags=- dur=0ms\n").len(), 1);
    }
}
