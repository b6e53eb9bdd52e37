//! What each apiVersion allows beyond the shared shape. llm-d v1.0's `llm-d.ai/v1` removed
//! v1alpha1's deprecated fields: in a v1 document each is an error naming where it moved
//! ([`Problem::Moved`]). v1's own fields are checked here too (their references and
//! durations); v1alpha1 documents may carry them as well (epp is lenient where upstream's older
//! decoder is strict: nothing there changes meaning).

use super::{EndpointPickerConfig, Problem, API_VERSION_V1};

/// The problems of `doc` that depend on its apiVersion, and of v1's own fields.
pub(crate) fn problems(doc: &EndpointPickerConfig) -> Vec<Problem> {
    let mut out = Vec::new();
    if doc.api_version == API_VERSION_V1 {
        out.extend(removed_in_v1(doc));
    }
    if let Some(dl) = &doc.data_layer {
        if let Some(d) = &dl.discovery {
            if d.plugin_ref.is_none() && d.endpoints.is_none() && d.peers.is_none() {
                out.push(Problem::Field {
                    path: "dataLayer.discovery".into(),
                    message: "names no plugin (v1: endpoints.pluginRef or peers.pluginRef)".into(),
                });
            }
            if d.plugin_ref.is_some() && d.endpoints.is_some() {
                out.push(Problem::Conflict(
                    "dataLayer.discovery: pluginRef and endpoints.pluginRef both name the endpoint discovery; keep endpoints.pluginRef".into(),
                ));
            }
        }
        out.extend(cross_replica_durations(dl));
    }
    out
}

/// v1alpha1's deprecated fields present in a v1 document, each with where it moved.
fn removed_in_v1(doc: &EndpointPickerConfig) -> Vec<Problem> {
    let mut out = Vec::new();
    let mut moved = |present: bool, field: &'static str, to: &'static str| {
        if present {
            out.push(Problem::Moved { field, to });
        }
    };
    moved(
        doc.saturation_detector.is_some(),
        "saturationDetector",
        "flowControl.saturationDetector.pluginRef",
    );
    moved(doc.parser.is_some(), "parser", "requestHandler.parsers");
    if let Some(dl) = &doc.data_layer {
        moved(
            dl.discovery
                .as_ref()
                .is_some_and(|d| d.plugin_ref.is_some()),
            "dataLayer.discovery.pluginRef",
            "dataLayer.discovery.endpoints.pluginRef",
        );
        moved(
            dl.cross_replica_syncer_plugin_ref.is_some(),
            "dataLayer.crossReplicaSyncerPluginRef",
            "dataLayer.crossReplica.syncerPluginRef",
        );
        moved(
            dl.cross_replica_sync_interval.is_some(),
            "dataLayer.crossReplicaSyncInterval",
            "dataLayer.crossReplica.syncInterval",
        );
    }
    out
}

/// The cross-replica durations (either shape) are Go durations.
fn cross_replica_durations(dl: &super::DataLayer) -> Vec<Problem> {
    let cr = dl.cross_replica.as_ref();
    let fields = [
        (
            "dataLayer.crossReplicaSyncInterval",
            dl.cross_replica_sync_interval.as_deref(),
        ),
        (
            "dataLayer.crossReplica.syncInterval",
            cr.and_then(|c| c.sync_interval.as_deref()),
        ),
        (
            "dataLayer.crossReplica.publishTimeout",
            cr.and_then(|c| c.publish_timeout.as_deref()),
        ),
    ];
    fields
        .into_iter()
        .filter_map(|(path, text)| {
            let e = crate::duration::parse(text?).err()?;
            Some(Problem::Field {
                path: path.into(),
                message: e.to_string(),
            })
        })
        .collect()
}
