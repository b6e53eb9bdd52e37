//! Flow control as the document configures it: `featureGates: [flowControl]` turns it on (as
//! upstream), and the `flowControl` section's limits override the command line's
//! (`--flow-control-*`). Both reload: the extproc adapter reads `enabled` per stream, and the
//! live configuration hands the limits to the queue when it is swapped.
//!
//! Quantities are Kubernetes quantities as upstream reads them (`500`, `10Gi`, `1G`); the TTL is
//! a Go duration (`30s`, `1m30s`). What epp's single queue does not model (per-band policies,
//! eviction) is accepted and not read.

use super::{FeatureGates, FlowControlSpec, Problem};
use std::time::Duration;

/// Whether requests wait in epp while the pool is saturated, and the limits the document sets
/// (`None`: the command line's value applies).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowSettings {
    /// The `flowControl` feature gate.
    pub enabled: bool,
    /// `flowControl.maxRequests`.
    pub max_requests: Option<u64>,
    /// `flowControl.maxBytes`.
    pub max_bytes: Option<u64>,
    /// `flowControl.defaultPriorityBand.maxBytes`.
    pub band_max_bytes: Option<u64>,
    /// `flowControl.defaultRequestTTL`.
    pub ttl: Option<Duration>,
}

impl FlowSettings {
    /// The settings of a document's gates and `flowControl` section; every bad value reported.
    pub fn decode(
        gates: FeatureGates,
        spec: Option<&FlowControlSpec>,
    ) -> Result<Self, Vec<Problem>> {
        let mut out = Self {
            enabled: gates.flow_control,
            ..Self::default()
        };
        let Some(spec) = spec else {
            return Ok(out);
        };
        let mut problems = Vec::new();
        let mut read = |path: &str, v: Option<&serde_yaml::Value>| -> Option<u64> {
            let v = v?;
            quantity(v)
                .map_err(|message| {
                    problems.push(Problem::Field {
                        path: format!("flowControl.{path}"),
                        message,
                    })
                })
                .ok()
        };
        out.max_requests = read("maxRequests", spec.max_requests.as_ref());
        out.max_bytes = read("maxBytes", spec.max_bytes.as_ref());
        let band = spec.default_priority_band.as_ref();
        out.band_max_bytes = read(
            "defaultPriorityBand.maxBytes",
            band.and_then(|b| b.max_bytes.as_ref()),
        );
        if let Some(ttl) = &spec.default_request_ttl {
            match crate::plugin::go_duration(ttl) {
                Ok(d) if !d.is_zero() => out.ttl = Some(d),
                Ok(_) => problems.push(Problem::Field {
                    path: "flowControl.defaultRequestTTL".into(),
                    message: "must be greater than zero".into(),
                }),
                Err(message) => problems.push(Problem::Field {
                    path: "flowControl.defaultRequestTTL".into(),
                    message,
                }),
            }
        }
        if problems.is_empty() {
            Ok(out)
        } else {
            Err(problems)
        }
    }
}

/// A non-negative Kubernetes quantity without fractions: an integer, optionally with a binary
/// (`Ki` … `Ei`) or decimal (`k` … `E`) suffix.
fn quantity(v: &serde_yaml::Value) -> Result<u64, String> {
    if let Some(n) = v.as_u64() {
        return Ok(n);
    }
    let text = match v {
        serde_yaml::Value::String(s) => s.trim(),
        other => {
            return Err(format!(
                "expected a quantity such as 500 or 10Gi, got {other:?}"
            ))
        }
    };
    let invalid = || format!("invalid quantity {text:?} (expected e.g. 500, 512Mi, 10Gi, 1G)");
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, suffix) = text.split_at(split);
    let n: u64 = digits.parse().map_err(|_| invalid())?;
    let scale: u64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        _ => return Err(invalid()),
    };
    n.checked_mul(scale).ok_or_else(invalid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(yaml: &str) -> Result<FlowSettings, Vec<Problem>> {
        let doc = super::super::parse(yaml).map_err(|e| e.problems)?;
        let gates = FeatureGates::parse(&doc.feature_gates)?;
        FlowSettings::decode(gates, doc.flow_control.as_ref())
    }

    #[test]
    fn the_gate_turns_it_on_and_the_section_sets_the_limits() {
        assert_eq!(settings("plugins: []").unwrap(), FlowSettings::default());
        let s = settings("featureGates: [flowControl]\nflowControl: {maxRequests: 500, maxBytes: 10Gi, defaultRequestTTL: 1m30s, defaultPriorityBand: {maxBytes: \"512Mi\"}}").unwrap();
        assert_eq!(
            s,
            FlowSettings {
                enabled: true,
                max_requests: Some(500),
                max_bytes: Some(10 << 30),
                band_max_bytes: Some(512 << 20),
                ttl: Some(Duration::from_secs(90)),
            }
        );
        let off =
            settings("featureGates: [flowControl=false]\nflowControl: {maxBytes: 1G}").unwrap();
        assert_eq!((off.enabled, off.max_bytes), (false, Some(1_000_000_000)));
    }

    #[test]
    fn every_bad_value_is_named_by_its_path() {
        let problems =
            settings("flowControl: {maxRequests: -1, maxBytes: 10Gb, defaultRequestTTL: soon}")
                .unwrap_err();
        let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert_eq!(text.len(), 3, "{text:?}");
        for (t, path) in text.iter().zip([
            "flowControl.maxRequests: ",
            "flowControl.maxBytes: ",
            "flowControl.defaultRequestTTL: ",
        ]) {
            assert!(t.starts_with(path), "{t}");
        }
    }
}
