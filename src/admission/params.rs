//! The `utilization-detector` plugin's parameters, as upstream's
//! `saturationdetector/utilization/config.go`: `queueDepthThreshold` (an integer above 0,
//! default 5), `kvCacheUtilThreshold` (in (0, 1], default 0.8), `metricsStalenessThreshold` (a
//! Go duration above 0) and `headroom` (at least 0, default 0). Unknown fields are errors, as
//! upstream's strict decoder; every invalid field is reported, by name.

use super::Thresholds;
use crate::plugin::Invalid;
use serde::Deserialize;

/// The `utilization-detector` plugin's parameters, as configured.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct UtilizationParams {
    queue_depth_threshold: Option<i64>,
    kv_cache_util_threshold: Option<f64>,
    metrics_staleness_threshold: Option<String>,
    headroom: Option<f64>,
}

impl Thresholds {
    /// The thresholds a `utilization-detector` with these parameters applies; every invalid
    /// parameter is reported.
    pub(crate) fn from_params(params: UtilizationParams) -> Result<Self, Vec<Invalid>> {
        let mut problems = Vec::new();
        let mut t = Thresholds::default();
        match params.queue_depth_threshold {
            Some(q) if q <= 0 => problems.push(Invalid::new(
                "queueDepthThreshold",
                format!("queueDepthThreshold must be strictly positive, got {q}"),
            )),
            Some(q) => t.queue_depth = q as f64,
            None => {}
        }
        match params.kv_cache_util_threshold {
            Some(k) if !(k > 0.0 && k <= 1.0) => problems.push(Invalid::new(
                "kvCacheUtilThreshold",
                format!("kvCacheUtilThreshold must be in (0.0, 1.0], got {k}"),
            )),
            Some(k) => t.kv_cache_util = k,
            None => {}
        }
        match params
            .metrics_staleness_threshold
            .as_deref()
            .map(crate::duration::parse)
        {
            Some(Ok(d)) if !d.is_zero() => t.staleness = Some(d),
            Some(Ok(_)) => problems.push(Invalid::new(
                "metricsStalenessThreshold",
                "metricsStalenessThreshold must be strictly positive",
            )),
            Some(Err(e)) => problems.push(Invalid::new(
                "metricsStalenessThreshold",
                format!("metricsStalenessThreshold: {e}"),
            )),
            None => {}
        }
        match params.headroom {
            Some(h) if !(h >= 0.0 && h.is_finite()) => problems.push(Invalid::new(
                "headroom",
                format!("headroom must be a non-negative value, got {h}"),
            )),
            Some(h) => t.headroom = h,
            None => {}
        }
        if problems.is_empty() {
            Ok(t)
        } else {
            Err(problems)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::config::{EndpointPickerConfig, Problem};

    fn doc(extra: &str) -> EndpointPickerConfig {
        crate::config::parse_document(&format!("apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n{extra}")).unwrap()
    }

    /// The thresholds the configuration decoder takes from a document.
    fn from_config(doc: &EndpointPickerConfig) -> Result<Thresholds, Vec<Problem>> {
        crate::config::Config::decode(doc, Default::default())
            .map(|c| c.thresholds)
            .map_err(|e| e.problems)
    }

    #[test]
    fn parameters_override_the_defaults() {
        let d = doc("plugins:\n- type: utilization-detector\n  parameters: {queueDepthThreshold: 10, kvCacheUtilThreshold: 0.9, metricsStalenessThreshold: 1m30s, headroom: 0.2}\n");
        let t = from_config(&d).unwrap();
        assert_eq!(
            t,
            Thresholds {
                queue_depth: 10.0,
                kv_cache_util: 0.9,
                staleness: Some(std::time::Duration::from_secs(90)),
                headroom: 0.2,
                concurrency: None,
            }
        );
        assert_eq!(
            from_config(&doc("plugins:\n- type: utilization-detector\n")).unwrap(),
            Thresholds::default()
        );
        assert_eq!(
            from_config(&doc("plugins: []\n")).unwrap(),
            Thresholds::default()
        );
    }

    #[test]
    fn the_saturation_detector_reference_picks_the_instance() {
        let d = doc("plugins:\n- type: utilization-detector\n  parameters: {queueDepthThreshold: 3}\n- name: strict\n  type: utilization-detector\n  parameters: {queueDepthThreshold: 1}\nsaturationDetector: {pluginRef: strict}\n");
        assert_eq!(from_config(&d).unwrap().queue_depth, 1.0);
    }

    #[test]
    fn invalid_parameters_name_the_field() {
        let d = doc("plugins:\n- name: sd\n  type: utilization-detector\n  parameters: {queueDepthThreshold: 0, kvCacheUtilThreshold: 1.5, metricsStalenessThreshold: 5 parsecs, headroom: -1}\n");
        let problems = from_config(&d).unwrap_err();
        let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert_eq!(text.len(), 4, "{text:?}");
        for (p, field) in text.iter().zip([
            "queueDepthThreshold",
            "kvCacheUtilThreshold",
            "metricsStalenessThreshold",
            "headroom",
        ]) {
            assert!(
                p.starts_with("plugin \"sd\" parameters: ") && p.contains(field),
                "{p}"
            );
        }
        let typo = doc("plugins:\n- type: utilization-detector\n  parameters: {queueDepth: 3}\n");
        assert!(from_config(&typo).unwrap_err()[0]
            .to_string()
            .contains("unknown field `queueDepth`"));
    }
}
