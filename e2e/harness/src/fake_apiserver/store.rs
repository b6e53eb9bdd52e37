//! The fake API server's object store: one resourceVersion counter for everything (as etcd's
//! revision), an event log that watches replay from, and compaction that makes old versions
//! answer `410 Gone`.

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Mutex;
use tokio::sync::broadcast;

/// Where an object lives: its collection path (`api/v1/pods`, `apis/g/v/res`), namespace, name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    pub collection: String,
    pub namespace: String,
    pub name: String,
}

/// One change, as a watch sends it.
#[derive(Clone, Debug)]
pub struct Event {
    pub rv: u64,
    pub kind: &'static str,
    pub key: Key,
    pub object: Value,
}

/// Why a request failed, as a Kubernetes `Status`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StoreError {
    #[error("{0} not found")]
    NotFound(String),
    #[error("{0} already exists")]
    AlreadyExists(String),
    #[error("the object has been modified; please apply your changes to the latest version and try again")]
    Conflict,
    #[error("too old resource version: {0} ({1})")]
    Gone(u64, u64),
    #[error("invalid object: {0}")]
    Invalid(String),
}

impl StoreError {
    pub fn code(&self) -> u16 {
        match self {
            Self::NotFound(_) => 404,
            Self::AlreadyExists(_) | Self::Conflict => 409,
            Self::Gone(..) => 410,
            Self::Invalid(_) => 422,
        }
    }

    pub fn status(&self) -> Value {
        let reason = match self {
            Self::NotFound(_) => "NotFound",
            Self::AlreadyExists(_) => "AlreadyExists",
            Self::Conflict => "Conflict",
            Self::Gone(..) => "Expired",
            Self::Invalid(_) => "Invalid",
        };
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": self.to_string(), "reason": reason, "code": self.code()})
    }
}

#[derive(Default)]
struct Inner {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    log: Vec<Event>,
    /// Versions at or below this are compacted away: watches from them get 410.
    compacted: u64,
}

/// Objects and their history, shared by every incarnation of the server (a restart keeps them).
pub struct Store {
    inner: Mutex<Inner>,
    events: broadcast::Sender<Event>,
}

impl Default for Store {
    fn default() -> Self {
        Self {
            inner: Mutex::default(),
            events: broadcast::channel(4096).0,
        }
    }
}

fn rv_of(obj: &Value) -> Option<u64> {
    obj.pointer("/metadata/resourceVersion")?
        .as_str()?
        .parse()
        .ok()
}

impl Store {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The current resourceVersion.
    pub fn revision(&self) -> u64 {
        self.lock().rv
    }

    /// Forgets history: watches from any version before now get `410 Gone` and must re-list.
    pub fn compact(&self) {
        let mut inner = self.lock();
        inner.compacted = inner.rv;
        inner.log.clear();
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// Objects of a collection (all namespaces when `namespace` is `None`) and the list's version.
    pub fn list(&self, collection: &str, namespace: Option<&str>) -> (u64, Vec<Value>) {
        let inner = self.lock();
        let items = inner
            .objects
            .iter()
            .filter(|(k, _)| {
                k.collection == collection && namespace.is_none_or(|n| n == k.namespace)
            })
            .map(|(_, v)| v.clone())
            .collect();
        (inner.rv, items)
    }

    /// Events after `since` for a collection, or `Gone` when that history was compacted.
    pub fn events_since(&self, collection: &str, since: u64) -> Result<Vec<Event>, StoreError> {
        let inner = self.lock();
        if since < inner.compacted {
            return Err(StoreError::Gone(since, inner.compacted));
        }
        Ok(inner
            .log
            .iter()
            .filter(|e| e.rv > since && e.key.collection == collection)
            .cloned()
            .collect())
    }

    pub fn get(&self, key: &Key) -> Result<Value, StoreError> {
        self.lock()
            .objects
            .get(key)
            .cloned()
            .ok_or_else(|| StoreError::NotFound(key.name.clone()))
    }

    pub fn create(&self, key: Key, mut obj: Value) -> Result<Value, StoreError> {
        let mut inner = self.lock();
        if inner.objects.contains_key(&key) {
            return Err(StoreError::AlreadyExists(key.name));
        }
        let meta = obj
            .get_mut("metadata")
            .and_then(Value::as_object_mut)
            .ok_or_else(|| StoreError::Invalid("no metadata".into()))?;
        meta.insert(
            "uid".into(),
            json!(format!("uid-{}-{}", key.name, inner.rv + 1)),
        );
        meta.insert("creationTimestamp".into(), json!(now_rfc3339()));
        meta.entry("generation").or_insert(json!(1));
        self.commit(&mut inner, "ADDED", key, obj)
    }

    /// Replaces an object. A `resourceVersion` in the new object must match the stored one
    /// (optimistic concurrency); `status_only` keeps the stored spec (the status subresource).
    pub fn replace(
        &self,
        key: Key,
        mut obj: Value,
        status_only: bool,
    ) -> Result<Value, StoreError> {
        let mut inner = self.lock();
        let old = inner
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| StoreError::NotFound(key.name.clone()))?;
        if rv_of(&obj).is_some_and(|rv| Some(rv) != rv_of(&old)) {
            return Err(StoreError::Conflict);
        }
        if status_only {
            let mut merged = old.clone();
            merged["status"] = obj.get("status").cloned().unwrap_or(Value::Null);
            obj = merged;
        } else if let Some(status) = old.get("status").filter(|_| obj.get("status").is_none()) {
            obj["status"] = status.clone();
        }
        for field in ["uid", "creationTimestamp", "generation"] {
            if let Some(v) = old.pointer(&format!("/metadata/{field}")) {
                obj["metadata"][field] = v.clone();
            }
        }
        self.commit(&mut inner, "MODIFIED", key, obj)
    }

    /// Applies a JSON merge patch (RFC 7386).
    pub fn merge_patch(
        &self,
        key: Key,
        patch: &Value,
        status_only: bool,
    ) -> Result<Value, StoreError> {
        let mut obj = self.get(&key)?;
        merge(&mut obj, patch);
        if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("resourceVersion");
        }
        self.replace(key, obj, status_only)
    }

    pub fn delete(&self, key: Key) -> Result<Value, StoreError> {
        let mut inner = self.lock();
        let old = inner
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| StoreError::NotFound(key.name.clone()))?;
        self.commit(&mut inner, "DELETED", key, old)
    }

    fn commit(
        &self,
        inner: &mut Inner,
        kind: &'static str,
        key: Key,
        mut obj: Value,
    ) -> Result<Value, StoreError> {
        inner.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(inner.rv.to_string());
        obj["metadata"]["namespace"] = json!(key.namespace);
        obj["metadata"]["name"] = json!(key.name);
        if kind == "DELETED" {
            inner.objects.remove(&key);
        } else {
            inner.objects.insert(key.clone(), obj.clone());
        }
        let event = Event {
            rv: inner.rv,
            kind,
            key,
            object: obj.clone(),
        };
        inner.log.push(event.clone());
        let _ = self.events.send(event);
        Ok(obj)
    }
}

fn merge(target: &mut Value, patch: &Value) {
    let Some(p) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let Some(t) = target.as_object_mut() else {
        return;
    };
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .map_or_else(|_| "1970-01-01T00:00:00Z".to_owned(), |t| t.to_string())
}
