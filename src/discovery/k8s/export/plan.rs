//! What the export controller wants, computed from what it listed: which pools are exported by
//! which clusters, the status entry each import should carry, what to do with each import, and
//! the `Exported` parent entry of each pool. No I/O: the controller lists, asks, and writes.

use super::types::{ExportingCluster, ImportController, InferencePoolImport};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

/// The annotation that exports an InferencePool (GIE `apix/v1alpha1.ExportAnnotationKey`).
pub const EXPORT_ANNOTATION: &str = "inference.networking.x-k8s.io/export";
/// Its one supported value: export to every member of the ClusterSet.
pub const CLUSTER_SET: &str = "ClusterSet";
/// The label on imports this controller created; only those does it delete.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "epp-pool-import");

/// An object's identity across the ClusterSet: namespace sameness, as the proposal asks.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What a pool's export annotation asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Export {
    /// No annotation: not exported.
    None,
    /// `ClusterSet`: exported to every member.
    ClusterSet,
    /// Any other value: not exported, and said so on the pool's status.
    Unsupported(String),
}

pub(crate) fn export_of(annotations: Option<&BTreeMap<String, String>>) -> Export {
    match annotations.and_then(|a| a.get(EXPORT_ANNOTATION)) {
        None => Export::None,
        Some(v) if v == CLUSTER_SET => Export::ClusterSet,
        Some(v) => Export::Unsupported(v.clone()),
    }
}

/// The exported pools, each with the (sorted) names of the clusters exporting it.
pub(crate) fn exports<'a>(
    pools: impl IntoIterator<Item = (&'a str, Key, Export)>,
) -> BTreeMap<Key, BTreeSet<String>> {
    let mut out: BTreeMap<Key, BTreeSet<String>> = BTreeMap::new();
    for (cluster, key, export) in pools {
        if export == Export::ClusterSet {
            out.entry(key).or_default().insert(cluster.to_owned());
        }
    }
    out
}

/// The CRDs' limit on a condition's message (bytes).
pub(crate) const MESSAGE_MAX: usize = 32768;

/// `message` cut to [`MESSAGE_MAX`] on a character boundary, marked with "...".
fn bounded(mut message: String) -> String {
    if message.len() > MESSAGE_MAX {
        let mut cut = MESSAGE_MAX - 3;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
        message.push_str("...");
    }
    message
}

/// A condition; its transition time is kept from `previous` when the status did not change.
pub(crate) fn condition(
    kind: &str,
    status: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    previous: Option<&Condition>,
    now: Timestamp,
) -> Condition {
    let status = if status { "True" } else { "False" }.to_owned();
    let since = previous
        .filter(|p| p.status == status)
        .map_or(Time(now), |p| p.last_transition_time.clone());
    Condition {
        type_: kind.to_owned(),
        status,
        reason: reason.to_owned(),
        message: bounded(message),
        observed_generation: generation,
        last_transition_time: since,
    }
}

/// Equal but for the transition time (a rewrite with a new time alone is churn).
pub(crate) fn same_condition(a: &Condition, b: &Condition) -> bool {
    (
        &a.type_,
        &a.status,
        &a.reason,
        &a.message,
        a.observed_generation,
    ) == (
        &b.type_,
        &b.status,
        &b.reason,
        &b.message,
        b.observed_generation,
    )
}

fn same_conditions(a: &[Condition], b: &[Condition]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same_condition(x, y))
}

/// This controller's entry of an import exported by `clusters`: `Accepted` True.
pub(crate) fn import_entry(
    controller: &str,
    clusters: &BTreeSet<String>,
    previous: Option<&ImportController>,
    now: Timestamp,
) -> ImportController {
    let names: Vec<&str> = clusters.iter().map(String::as_str).collect();
    let before = previous.and_then(|p| p.conditions.iter().find(|c| c.type_ == "Accepted"));
    let accepted = condition(
        "Accepted",
        true,
        "Accepted",
        format!("exported by {}", names.join(", ")),
        None,
        before,
        now,
    );
    ImportController {
        name: controller.to_owned(),
        exporting_clusters: clusters
            .iter()
            .map(|name| ExportingCluster { name: name.clone() })
            .collect(),
        parents: Vec::new(),
        conditions: vec![accepted],
    }
}

/// What to do with one import in one cluster.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Action {
    /// Create the object, then write the entry.
    Create(ImportController),
    /// Write (server-side apply) this controller's entry.
    Apply(ImportController),
    /// Withdraw this controller's entry; the object stays (another controller still has one,
    /// or this controller did not create it).
    Withdraw,
    /// Delete the object: this controller created it and no other controller has an entry.
    Delete,
}

/// Compares the wanted entry (None: the pool is no longer exported) with the import as listed.
pub(crate) fn import_action(
    controller: &str,
    wanted: Option<ImportController>,
    existing: Option<&InferencePoolImport>,
) -> Option<Action> {
    let Some(existing) = existing else {
        return wanted.map(Action::Create);
    };
    let ours = existing.controllers().iter().find(|c| c.name == controller);
    match wanted {
        Some(w) => match ours {
            Some(o) if same_entry(o, &w) => None,
            _ => Some(Action::Apply(w)),
        },
        None => {
            let others = existing.controllers().iter().any(|c| c.name != controller);
            if created_by_us(existing) && !others {
                Some(Action::Delete)
            } else if ours.is_some() {
                Some(Action::Withdraw)
            } else {
                None
            }
        }
    }
}

fn same_entry(a: &ImportController, b: &ImportController) -> bool {
    a.exporting_clusters == b.exporting_clusters && same_conditions(&a.conditions, &b.conditions)
}

pub(crate) fn created_by_us(import: &InferencePoolImport) -> bool {
    let (key, value) = MANAGED_BY;
    import
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(key))
        .is_some_and(|v| v == value)
}

/// How the export of one pool went, for its `Exported` condition.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Outcome {
    /// Every member holds the import.
    Exported,
    /// These members do not (the reason of each).
    Failed(Vec<String>),
}

/// The pool's `status.parents` with this controller's entry set (exported, or an unsupported
/// value) or removed (not exported); `None` when the list is already so.
pub(crate) fn pool_parents(
    controller: &str,
    key: &Key,
    parents: &[Value],
    export: &Export,
    outcome: &Outcome,
    generation: Option<i64>,
    now: Timestamp,
) -> Option<Vec<Value>> {
    let is_ours = |p: &&Value| {
        p["controllerName"] == controller && p["parentRef"]["kind"] == super::types::KIND
    };
    let ours = parents.iter().find(is_ours);
    let previous = ours.and_then(exported_condition);
    let wanted = match export {
        Export::None => None,
        Export::ClusterSet => Some(match outcome {
            Outcome::Exported => (
                true,
                "Exported",
                "exported to every member of the ClusterSet".to_owned(),
            ),
            Outcome::Failed(why) => (
                false,
                "ImportFailed",
                format!("not imported everywhere: {}", why.join("; ")),
            ),
        }),
        Export::Unsupported(v) => Some((
            false,
            "UnsupportedValue",
            format!("the export annotation is {v:?}; the supported value is {CLUSTER_SET:?}"),
        )),
    };
    let wanted = wanted.map(|(status, reason, message)| {
        condition(
            "Exported",
            status,
            reason,
            message,
            generation,
            previous.as_ref(),
            now,
        )
    });
    match (&wanted, &previous) {
        (None, None) if ours.is_none() => return None,
        (Some(w), Some(p)) if same_condition(w, p) => return None,
        _ => {}
    }
    let mut out: Vec<Value> = parents.iter().filter(|p| !is_ours(p)).cloned().collect();
    if let Some(c) = wanted {
        out.push(json!({
            "parentRef": {
                "group": super::types::GROUP,
                "kind": super::types::KIND,
                "name": key.name,
                "namespace": key.namespace,
            },
            "controllerName": controller,
            "conditions": [c],
        }));
    }
    Some(out)
}

fn exported_condition(parent: &Value) -> Option<Condition> {
    let conditions = parent.get("conditions")?.as_array()?;
    conditions
        .iter()
        .filter_map(|c| serde_json::from_value::<Condition>(c.clone()).ok())
        .find(|c| c.type_ == "Exported")
}
