//! HTTP side of the fake API server: URL → collection/object, verbs → store calls, and watch
//! streams as newline-delimited JSON events.

use super::store::{Event, Key, Store, StoreError};
use super::BOOKMARK_EVERY;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use serde_json::{json, Value};
use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

type Body = BoxBody<Bytes, Infallible>;

pub async fn serve(
    listener: TcpListener,
    store: Arc<Store>,
    tracker: TaskTracker,
    cancel: CancellationToken,
) {
    loop {
        let stream = tokio::select! {
            _ = cancel.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((s, _)) => s,
                Err(_) => continue,
            },
        };
        let (store, cancel) = (Arc::clone(&store), cancel.clone());
        tracker.spawn(async move {
            let stop = cancel.clone();
            let svc = hyper::service::service_fn(move |req| {
                let (store, cancel) = (Arc::clone(&store), cancel.clone());
                async move { Ok::<_, Infallible>(handle(req, &store, cancel).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
            tokio::select! {
                _ = conn => {}
                _ = stop.cancelled() => {}
            }
        });
    }
}

/// What a URL names.
struct Target {
    collection: String,
    namespace: Option<String>,
    name: Option<String>,
    status: bool,
}

fn parse_path(path: &str) -> Option<Target> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (gv, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => (format!("api/{v}"), rest),
        ["apis", g, v, rest @ ..] => (format!("apis/{g}/{v}"), rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some((*ns).to_owned()), rest),
        _ => (None, rest),
    };
    let (res, name, status) = match rest {
        [res] => (res, None, false),
        [res, name] => (res, Some((*name).to_owned()), false),
        [res, name, "status"] => (res, Some((*name).to_owned()), true),
        _ => return None,
    };
    Some(Target {
        collection: format!("{gv}/{res}"),
        namespace,
        name,
        status,
    })
}

fn query(req: &Request<Incoming>) -> BTreeMap<String, String> {
    inference_sim::http::query::pairs(req.uri().query()).collect()
}

fn respond(code: u16, body: &Value) -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::from(body.to_string())).boxed());
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

fn answer(result: Result<Value, StoreError>, ok: u16) -> Response<Body> {
    match result {
        Ok(v) => respond(ok, &v),
        Err(e) => respond(e.code(), &e.status()),
    }
}

async fn handle(
    req: Request<Incoming>,
    store: &Arc<Store>,
    cancel: CancellationToken,
) -> Response<Body> {
    if req.method() == Method::GET {
        if let Some(doc) = discovery(req.uri().path()) {
            return respond(200, &doc);
        }
    }
    let Some(t) = parse_path(req.uri().path()) else {
        return respond(
            404,
            &StoreError::NotFound(req.uri().path().to_owned()).status(),
        );
    };
    let q = query(&req);
    let method = req.method().clone();
    let bytes = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let body: Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(_) if bytes.is_empty() => Value::Null,
        Err(e) => return respond(400, &StoreError::Invalid(e.to_string()).status()),
    };
    let key = |name: String| Key {
        collection: t.collection.clone(),
        namespace: t.namespace.clone().unwrap_or_default(),
        name,
    };
    match (method, t.name.clone()) {
        (Method::GET, None) if q.get("watch").is_some_and(|w| w == "true" || w == "1") => {
            watch(store, &t, &q, cancel)
        }
        (Method::GET, None) => list(store, &t, &q),
        (Method::GET, Some(name)) => answer(store.get(&key(name)), 200),
        (Method::POST, None) => {
            let Some(name) = body
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .map(str::to_owned)
            else {
                return respond(
                    422,
                    &StoreError::Invalid("metadata.name is required".into()).status(),
                );
            };
            answer(store.create(key(name), body), 201)
        }
        (Method::PUT, Some(name)) => answer(store.replace(key(name), body, t.status), 200),
        (Method::PATCH, Some(name)) => answer(store.merge_patch(key(name), &body, t.status), 200),
        (Method::DELETE, Some(name)) => answer(store.delete(key(name)), 200),
        _ => respond(
            405,
            &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "MethodNotAllowed", "code": 405}),
        ),
    }
}

/// The resources the discovery documents announce: (group, version, plural, kind, namespaced).
/// Enough for clients that build a REST mapper from discovery (controller-runtime, as in the
/// upstream Go EPP); the store itself accepts any collection.
const RESOURCES: &[(&str, &str, &str, &str, bool)] = &[
    ("", "v1", "pods", "Pod", true),
    ("", "v1", "services", "Service", true),
    ("", "v1", "endpoints", "Endpoints", true),
    ("", "v1", "configmaps", "ConfigMap", true),
    ("", "v1", "secrets", "Secret", true),
    ("", "v1", "events", "Event", true),
    ("", "v1", "namespaces", "Namespace", false),
    ("coordination.k8s.io", "v1", "leases", "Lease", true),
    (
        "discovery.k8s.io",
        "v1",
        "endpointslices",
        "EndpointSlice",
        true,
    ),
    (
        "inference.networking.k8s.io",
        "v1",
        "inferencepools",
        "InferencePool",
        true,
    ),
    (
        "inference.networking.x-k8s.io",
        "v1alpha2",
        "inferencepools",
        "InferencePool",
        true,
    ),
    (
        "inference.networking.x-k8s.io",
        "v1alpha2",
        "inferenceobjectives",
        "InferenceObjective",
        true,
    ),
    (
        "inference.networking.x-k8s.io",
        "v1alpha2",
        "inferencemodelrewrites",
        "InferenceModelRewrite",
        true,
    ),
    (
        "inference.networking.x-k8s.io",
        "v1alpha2",
        "inferencemodels",
        "InferenceModel",
        true,
    ),
];

/// Legacy (unaggregated) discovery: `/version`, `/api`, `/api/v1`, `/apis`, `/apis/{g}/{v}`.
fn discovery(path: &str) -> Option<Value> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let resources = |group: &str, version: &str| -> Option<Value> {
        let list: Vec<Value> = RESOURCES
            .iter()
            .filter(|r| r.0 == group && r.1 == version)
            .flat_map(|&(_, _, plural, kind, namespaced)| {
                let verbs = json!(["create", "delete", "get", "list", "patch", "update", "watch"]);
                [
                    json!({"name": plural, "singularName": kind.to_lowercase(), "namespaced": namespaced,
                        "kind": kind, "verbs": verbs}),
                    json!({"name": format!("{plural}/status"), "singularName": "", "namespaced": namespaced,
                        "kind": kind, "verbs": ["get", "patch", "update"]}),
                ]
            })
            .collect();
        let gv = if group.is_empty() {
            version.to_owned()
        } else {
            format!("{group}/{version}")
        };
        (!list.is_empty()).then(|| {
            json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": list})
        })
    };
    match segs.as_slice() {
        ["version"] => Some(
            json!({"major": "1", "minor": "35", "gitVersion": "v1.35.0-fake",
            "platform": "linux/amd64"}),
        ),
        ["api"] => Some(json!({"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]})),
        ["api", v] => resources("", v),
        ["apis"] => {
            let mut groups: Vec<(&str, Vec<&str>)> = Vec::new();
            for &(g, v, ..) in RESOURCES.iter().filter(|r| !r.0.is_empty()) {
                match groups.iter_mut().find(|(name, _)| *name == g) {
                    Some((_, vs)) if !vs.contains(&v) => vs.push(v),
                    Some(_) => {}
                    None => groups.push((g, vec![v])),
                }
            }
            let groups: Vec<Value> = groups
                .into_iter()
                .map(|(g, vs)| {
                    let versions: Vec<Value> = vs
                        .iter()
                        .map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
                        .collect();
                    json!({"name": g, "versions": versions, "preferredVersion": versions[0]})
                })
                .collect();
            Some(json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}))
        }
        ["apis", g] => {
            let versions: Vec<Value> = RESOURCES
                .iter()
                .filter(|r| r.0 == *g)
                .map(|r| json!({"groupVersion": format!("{g}/{}", r.1), "version": r.1}))
                .collect();
            let first = versions.first()?.clone();
            Some(
                json!({"kind": "APIGroup", "apiVersion": "v1", "name": g, "versions": versions,
                "preferredVersion": first}),
            )
        }
        ["apis", g, v] => resources(g, v),
        _ => None,
    }
}

/// `k=v`, `k==v` and `k!=v` terms, all of which must hold.
fn matches_selector(obj: &Value, selector: Option<&String>) -> bool {
    let Some(sel) = selector.filter(|s| !s.is_empty()) else {
        return true;
    };
    let labels = obj.pointer("/metadata/labels");
    let label = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
    sel.split(',').all(|term| {
        if let Some((k, v)) = term.split_once("!=") {
            label(k.trim()) != Some(v.trim())
        } else if let Some((k, v)) = term.split_once('=') {
            label(k.trim()) == Some(v.trim_start_matches('=').trim())
        } else {
            label(term.trim()).is_some()
        }
    })
}

fn list(store: &Store, t: &Target, q: &BTreeMap<String, String>) -> Response<Body> {
    let (rv, items) = store.list(&t.collection, t.namespace.as_deref());
    let items: Vec<Value> = items
        .into_iter()
        .filter(|o| matches_selector(o, q.get("labelSelector")))
        .collect();
    respond(
        200,
        &json!({"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": rv.to_string()}, "items": items}),
    )
}

/// State of one open watch.
struct Watch {
    store: Arc<Store>,
    collection: String,
    namespace: Option<String>,
    selector: Option<String>,
    rx: broadcast::Receiver<Event>,
    pending: VecDeque<Value>,
    last_rv: u64,
    bookmarks: bool,
    deadline: tokio::time::Instant,
    cancel: CancellationToken,
    ended: bool,
}

impl Watch {
    fn wants(&self, e: &Event) -> bool {
        e.rv > self.last_rv
            && e.key.collection == self.collection
            && self
                .namespace
                .as_ref()
                .is_none_or(|n| *n == e.key.namespace)
    }

    fn push(&mut self, e: &Event) {
        let kind = if matches_selector(&e.object, self.selector.as_ref()) {
            e.kind
        } else {
            "DELETED"
        };
        self.last_rv = e.rv;
        self.pending
            .push_back(json!({"type": kind, "object": e.object}));
    }

    fn gone(&mut self, err: &StoreError) {
        self.pending
            .push_back(json!({"type": "ERROR", "object": err.status()}));
        self.ended = true;
    }

    /// The next line to send, or `None` when the watch ends.
    async fn next(&mut self) -> Option<Value> {
        let mut tick =
            tokio::time::interval_at(tokio::time::Instant::now() + BOOKMARK_EVERY, BOOKMARK_EVERY);
        loop {
            if let Some(line) = self.pending.pop_front() {
                return Some(line);
            }
            if self.ended {
                return None;
            }
            tokio::select! {
                _ = self.cancel.cancelled() => return None,
                _ = tokio::time::sleep_until(self.deadline) => return None,
                _ = tick.tick(), if self.bookmarks => {
                    let rv = self.store.revision().max(self.last_rv);
                    return Some(json!({"type": "BOOKMARK", "object": {"kind": "Bookmark", "apiVersion": "v1", "metadata": {"resourceVersion": rv.to_string()}}}));
                }
                event = self.rx.recv() => match event {
                    Ok(e) if self.wants(&e) => self.push(&e),
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(_)) => self.gone(&StoreError::Gone(self.last_rv, self.store.revision())),
                    Err(broadcast::error::RecvError::Closed) => return None,
                },
            }
        }
    }
}

fn watch(
    store: &Arc<Store>,
    t: &Target,
    q: &BTreeMap<String, String>,
    cancel: CancellationToken,
) -> Response<Body> {
    let rx = store.subscribe();
    let since: u64 = q
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1800u64);
    let mut w = Watch {
        store: Arc::clone(store),
        collection: t.collection.clone(),
        namespace: t.namespace.clone(),
        selector: q.get("labelSelector").cloned(),
        rx,
        pending: VecDeque::new(),
        last_rv: since,
        bookmarks: q.get("allowWatchBookmarks").is_some_and(|v| v == "true"),
        deadline: tokio::time::Instant::now() + std::time::Duration::from_secs(timeout),
        cancel,
        ended: false,
    };
    match store.events_since(&t.collection, since) {
        Ok(events) => {
            for e in &events {
                if w.wants(e) {
                    w.push(e);
                }
            }
        }
        Err(e) => w.gone(&e),
    }
    let stream = futures::stream::unfold(w, |mut w| async move {
        let line = w.next().await?;
        Some((
            Ok::<_, Infallible>(Frame::data(Bytes::from(format!("{line}\n")))),
            w,
        ))
    });
    let mut resp = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_names_pods_and_the_inference_pool_resources() {
        let v1 = discovery("/api/v1").unwrap();
        assert!(v1["resources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == "pods" && r["kind"] == "Pod"));
        let groups = discovery("/apis").unwrap();
        assert!(groups["groups"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["name"] == "inference.networking.k8s.io"));
        let pools = discovery("/apis/inference.networking.k8s.io/v1").unwrap();
        assert_eq!(pools["resources"][0]["kind"], "InferencePool");
        assert!(discovery("/api/v1/namespaces/ns/pods").is_none());
        assert!(discovery("/apis/nope/v1").is_none());
    }

    #[test]
    fn paths_name_collections_objects_and_status() {
        let t = parse_path("/api/v1/namespaces/ns/pods").unwrap();
        assert_eq!(
            (t.collection.as_str(), t.namespace.as_deref(), t.name),
            ("api/v1/pods", Some("ns"), None)
        );
        let t = parse_path("/apis/coordination.k8s.io/v1/namespaces/ns/leases/l/status").unwrap();
        assert_eq!(
            (t.collection.as_str(), t.name.as_deref(), t.status),
            ("apis/coordination.k8s.io/v1/leases", Some("l"), true)
        );
        assert_eq!(
            inference_sim::http::query::decode("app%3Dvllm%2Ctier%3Dx"),
            "app=vllm,tier=x"
        );
        let pod = json!({"metadata": {"labels": {"app": "vllm"}}});
        assert!(matches_selector(&pod, Some(&"app=vllm".to_owned())));
        assert!(!matches_selector(
            &pod,
            Some(&"app=vllm,tier==x".to_owned())
        ));
        assert!(matches_selector(&pod, Some(&"tier!=x".to_owned())));
    }
}
