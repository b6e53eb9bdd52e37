//! `InferencePoolImport` (`inference.networking.x-k8s.io/v1alpha1`), as GIE's
//! `apix/v1alpha1` defines it: a status-only object (no spec) a controller writes. The CRD is
//! GIE's (`config/crd/bases/inference.networking.x-k8s.io_inferencepoolimports.yaml`); epp does
//! not generate one, so these types only read and write objects of it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

pub(crate) const GROUP: &str = "inference.networking.x-k8s.io";
pub(crate) const VERSION: &str = "v1alpha1";
pub(crate) const KIND: &str = "InferencePoolImport";
const PLURAL: &str = "inferencepoolimports";

/// One InferencePoolImport: metadata and the status its controllers write.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct InferencePoolImport {
    #[serde(rename = "apiVersion", default)]
    pub(crate) api_version: String,
    #[serde(default)]
    pub(crate) kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ImportStatus>,
}

impl InferencePoolImport {
    /// An object without status, to create (the status is written through its subresource).
    pub(crate) fn new(metadata: ObjectMeta) -> Self {
        Self {
            api_version: format!("{GROUP}/{VERSION}"),
            kind: KIND.to_owned(),
            metadata,
            status: None,
        }
    }

    /// The status entries, empty when there is no status.
    pub fn controllers(&self) -> &[ImportController] {
        self.status.as_ref().map_or(&[], |s| &s.controllers)
    }
}

/// `status`: one entry per controller managing the import (a list-map keyed by `name`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ImportStatus {
    #[serde(default)]
    pub controllers: Vec<ImportController>,
}

/// One controller's entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImportController {
    /// `DOMAIN/PATH`, the controller's name.
    pub name: String,
    /// The clusters exporting the pool behind the import.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exporting_clusters: Vec<ExportingCluster>,
    /// Parent status (Gateways); written by the importing gateway's controller, kept as read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parents: Vec<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportingCluster {
    pub name: String,
}

impl kube::Resource for InferencePoolImport {
    type DynamicType = ();
    type Scope = kube::core::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(KIND)
    }
    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(GROUP)
    }
    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(VERSION)
    }
    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(PLURAL)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}
