//! Running one case: its pods (recording inference-sim pods with the case's forced states and
//! labels), then each EPP in turn behind its own real Envoy (the `Duplex` template: ext_proc
//! with the body streamed), loading the same configuration file, and the case's requests sent
//! through Envoy. epp runs in this process, llm-d's EPP as a child process
//! ([`harness::llmd_epp`]). A multi-cluster hub case adds its spokes' stand-ins
//! ([`crate::hub_support`]): the pods are then the clusters' gateways.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use harness::client;
use harness::envoy::{Envoy, EnvoyConfig};
use harness::llmd_epp::{self, FileEndpoint, LlmdEpp};
use harness::sim_pod::{test_pod_config, with_adapters, SimPod};
use harness::stack::Epp;
use http::Method;

use super::cases::{Case, Hub, PodState, Req};
use crate::hub_support::Spokes;

/// What one request (or one repeated request) got.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    pub status: u16,
    /// The pods that served (several for a repeated request that ties).
    pub pods: BTreeSet<String>,
    /// A refusal's class, `inference error: <Code>`: the start of upstream's message, which
    /// epp puts in an OpenAI-shaped JSON error (`src/extproc/status.rs`) and llm-d sends as
    /// the plain body. Compared; the bodies themselves are shown, not compared.
    pub error: String,
    /// The start of a refusal's body (not compared).
    pub body: String,
    /// The routing headers the serving pod received (`x-gateway-*`, `x-llm-d-*`, the sidecar's
    /// `x-prefiller-*` and `x-data-parallel-*`), addresses written as pod names; `*` where repeats differed.
    pub headers: BTreeMap<String, String>,
}

impl PartialEq for Outcome {
    fn eq(&self, o: &Self) -> bool {
        (self.status, &self.pods, &self.error, &self.headers)
            == (o.status, &o.pods, &o.error, &o.headers)
    }
}

/// `text` with each request ID llm-d's messages carry (`for request 670b…`) replaced by
/// `<id>`: the IDs are random, and the table must be the same from run to run.
fn without_request_ids(text: &str) -> String {
    const MARK: &str = "for request ";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(MARK) {
        out.push_str(&rest[..i + MARK.len()]);
        rest = &rest[i + MARK.len()..];
        let id_len = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .unwrap_or(rest.len());
        if id_len > 0 {
            out.push_str("<id>");
        }
        rest = &rest[id_len..];
    }
    out.push_str(rest);
    out
}

/// The `inference error: <Code>` a refusal's body starts with (inside a JSON `error.message`
/// or as the body itself); the body's start when it has none.
fn error_class(body: &str) -> String {
    let message = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| body.to_owned());
    message
        .split(" - ")
        .next()
        .unwrap_or_default()
        .chars()
        .take(80)
        .collect()
}

/// Which EPP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    Epp,
    Llmd,
}

enum Picker {
    Epp(Epp),
    Llmd(LlmdEpp),
}

impl Picker {
    async fn metrics_text(&self) -> anyhow::Result<String> {
        match self {
            Self::Epp(e) => e.metrics_text().await,
            Self::Llmd(l) => l.metrics_text().await,
        }
    }

    fn grpc(&self) -> SocketAddr {
        match self {
            Self::Epp(e) => e.grpc,
            Self::Llmd(l) => l.grpc,
        }
    }

    async fn stop(self) {
        match self {
            Self::Epp(e) => e.stop().await,
            Self::Llmd(l) => drop(l),
        }
    }
}

/// The case's pods, with their states forced (and a hub case's spokes).
pub struct Pods {
    pub pods: Vec<SimPod>,
    spokes: Option<Spokes>,
    dir: PathBuf,
}

/// The adapters every pod serves, so a LoRA request is answered wherever it lands.
const ADAPTERS: &[&str] = &["lora-a", "lora-b"];

impl Pods {
    pub async fn start(case: &Case, dir: &Path) -> anyhow::Result<Self> {
        let mut pods = Vec::new();
        for (i, state) in case.pods.iter().enumerate() {
            let mut cfg = with_adapters(test_pod_config(&format!("pod-{i}")), ADAPTERS);
            cfg.seed = i as u64;
            let pod = SimPod::bind(cfg).await?;
            force(&pod, state);
            pods.push(pod);
        }
        let spokes = match &case.hub {
            Some(hub) => Some(Spokes::start(&hub.pools, dir).await?),
            None => None,
        };
        Ok(Self {
            pods,
            spokes,
            dir: dir.to_owned(),
        })
    }

    /// The configuration file both EPPs load: `config` with the pods' file discovery (a hub
    /// case's names its own clusters file, written here).
    pub fn config_file(&self, case: &Case) -> anyhow::Result<PathBuf> {
        if let (Some(hub), Some(spokes)) = (&case.hub, &self.spokes) {
            return self.hub_config(case, hub, spokes);
        }
        let names: Vec<String> = self.pods.iter().map(|p| p.name().to_owned()).collect();
        let endpoints: Vec<FileEndpoint<'_>> = self
            .pods
            .iter()
            .zip(&case.pods)
            .zip(&names)
            .map(|((p, s), name)| FileEndpoint {
                name,
                addr: p.addr(),
                labels: &s.labels,
            })
            .collect();
        // `{port0}` in a configuration is pod 0's port (`data-parallel-profile-handler`).
        let port0 = self.pods.first().map(|p| p.addr().port().to_string());
        let config = format!(
            "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n{}",
            case.config
                .replace("{port0}", port0.as_deref().unwrap_or("0"))
        );
        llmd_epp::write_config(&config, &endpoints, &self.dir)
    }

    /// A hub case's clusters file (each pod a cluster's gateway, its spoke's metrics on the
    /// stand-in's port) and its configuration, the two files' paths filled in.
    fn hub_config(&self, case: &Case, hub: &Hub, spokes: &Spokes) -> anyhow::Result<PathBuf> {
        let mut file = String::from("endpoints:\n");
        for (i, p) in self.pods.iter().enumerate() {
            file += &format!(
                "- name: {}\n  address: {}\n  port: \"{}\"\n  labels: {{metricsAddress: {}, metricsPort: \"{}\"}}\n",
                p.name(),
                hub.address,
                p.addr().port(),
                hub.metrics_address,
                spokes.port(i)
            );
        }
        let clusters = self.dir.join("clusters.yaml");
        std::fs::write(&clusters, file)?;
        let config = format!(
            "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n{}",
            case.config
                .replace("CLUSTERS", &format!("{:?}", clusters.display().to_string()))
                .replace(
                    "SPOKES_CA",
                    &format!("{:?}", spokes.ca.display().to_string())
                )
        );
        let path = self.dir.join("hub-config.yaml");
        std::fs::write(&path, config)?;
        Ok(path)
    }

    fn name_of(&self, addr: &str) -> Option<String> {
        self.pods
            .iter()
            .find(|p| p.endpoint() == addr || p.addr().to_string() == addr)
            .map(|p| p.name().to_owned())
    }

    pub async fn shutdown(self) {
        for p in self.pods {
            p.shutdown().await;
        }
        if let Some(s) = self.spokes {
            s.shutdown().await;
        }
    }
}

fn force(pod: &SimPod, s: &PodState) {
    pod.hook().force(|f| {
        f.waiting = s.waiting;
        f.running = s.running;
        f.kv_usage = s.kv;
        f.running_adapters = s.running_loras.clone();
        f.waiting_adapters = s.running_loras.as_ref().map(|_| Vec::new());
    });
}

/// Runs `case`'s requests through `which` (loading `config`), in order.
pub async fn outcomes(
    which: Which,
    llmd: &Path,
    pods: &Pods,
    case: &Case,
    config: &Path,
) -> anyhow::Result<Vec<Outcome>> {
    for (p, s) in pods.pods.iter().zip(&case.pods) {
        force(p, s);
        p.hook().clear_requests();
    }
    if let (Some(spokes), Some(hub)) = (&pods.spokes, &case.hub) {
        spokes.set(&hub.pools);
    }
    let picker = match which {
        Which::Epp => Picker::Epp(Epp::start(&epp_flags(config)).await?),
        Which::Llmd => Picker::Llmd(LlmdEpp::start_file(llmd, config, &pods.dir).await?),
    };
    let envoy = EnvoyConfig::new(case.envoy.clone())
        .epp(picker.grpc())
        .epp_tls(false)
        .pool(pods.pods.iter().map(SimPod::addr))
        .start()
        .await?;
    let result = send_all(&picker, &envoy, pods, case).await;
    drop(envoy);
    picker.stop().await;
    result
}

/// Three scrape intervals (`--refresh-metrics-interval 50ms`).
const SCRAPES: Duration = Duration::from_millis(150);

fn epp_flags(config: &Path) -> Vec<String> {
    [
        "--config-file",
        &config.display().to_string(),
        "--secure-serving",
        "false",
        "--refresh-metrics-interval",
        "50ms",
        "--allow-experimental-plugins",
        "true",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

async fn send_all(
    picker: &Picker,
    envoy: &Envoy,
    pods: &Pods,
    case: &Case,
) -> anyhow::Result<Vec<Outcome>> {
    let waits: Vec<u64> = case.pods.iter().map(|s| s.waiting.unwrap_or(0)).collect();
    match &pods.spokes {
        Some(spokes) => spokes.scraped().await?,
        None => scraped(picker, &waits).await?,
    }
    let mut out = Vec::new();
    let mut session: Option<String> = None;
    let mut sent = 0;
    for r in &case.requests {
        match (&r.set_waiting, &pods.spokes) {
            (Some(w), Some(spokes)) => {
                spokes.set_queues(w);
                spokes.scraped().await?;
            }
            (Some(w), None) => {
                for (p, v) in pods.pods.iter().zip(w) {
                    p.hook().set_waiting(Some(*v));
                }
                scraped(picker, w).await?;
            }
            (None, _) => {}
        }
        let mut each = Vec::new();
        if r.concurrent {
            each = send_together(envoy, pods, r).await?;
            sent += r.repeat.max(1);
            tokio::time::sleep(SCRAPES).await;
        }
        for i in (0..r.repeat.max(1)).filter(|_| !r.concurrent) {
            let r = &numbered(r, i);
            let (mut outcome, token) = send_one(envoy, pods, r, session.as_deref()).await?;
            sent += 1;
            if r.cost {
                outcome
                    .headers
                    .insert(COST_KEY.into(), logged_cost(envoy, sent).await?);
            }
            session = token.or(session);
            each.push(outcome);
            // epp counts what it dispatched since a pod's last scrape as queued there
            // (scrapes lag; upstream reads the scrape alone): let a scrape (50 ms) pass, so the
            // next request meets the forced queues in both EPPs, not a tie only epp sees.
            tokio::time::sleep(SCRAPES).await;
        }
        out.push(merge(each));
    }
    Ok(out)
}

/// How an outcome names the cost metadata (`Req::cost`).
const COST_KEY: &str = "metadata x-gateway-inference-request-cost";

/// The `cost=` field of Envoy's access log line for the `n`th request sent (`-`: none).
async fn logged_cost(envoy: &Envoy, n: usize) -> anyhow::Result<String> {
    let entries = envoy.wait_for_access_log(n, Duration::from_secs(5)).await?;
    let line = &entries[n - 1].line;
    let cost = line.split(' ').find_map(|w| w.strip_prefix("cost="));
    cost.map(str::to_owned)
        .with_context(|| format!("no cost= in the access log line {line:?}"))
}

/// Repeat `i` of `r`: its body with `{n}` replaced by `i` (a distinct prompt each repeat), and
/// `{n%2}` by `i % 2` (two prompts, alternating).
fn numbered(r: &Req, i: usize) -> Req {
    Req {
        body: r
            .body
            .replace("{n%2}", &(i % 2).to_string())
            .replace("{n}", &i.to_string()),
        ..r.clone()
    }
}

/// `r`'s repeats sent all at once (a burst). Their routing headers are the burst's, on the
/// first outcome: what the pods received while it ran, a value that differs written `*`
/// (requests in flight together cannot be told apart by arrival).
async fn send_together(envoy: &Envoy, pods: &Pods, r: &Req) -> anyhow::Result<Vec<Outcome>> {
    let before: Vec<usize> = pods.pods.iter().map(|p| p.requests().len()).collect();
    let reqs: Vec<Req> = (0..r.repeat.max(1)).map(|i| numbered(r, i)).collect();
    let sent = reqs.iter().map(|r| send_one(envoy, pods, r, None));
    let mut each: Vec<Outcome> = futures::future::try_join_all(sent)
        .await?
        .into_iter()
        .map(|(o, _)| o)
        .collect();
    let mut headers: BTreeMap<String, String> = BTreeMap::new();
    for (p, n) in pods.pods.iter().zip(before) {
        for rec in p.requests().iter().skip(n) {
            for (name, value) in rec
                .headers
                .iter()
                .filter(|(n, _)| is_routing_header(n.as_str()))
            {
                let v = value.to_str().unwrap_or("<binary>");
                let v = pods.name_of(v).unwrap_or_else(|| v.to_owned());
                let e = headers
                    .entry(name.as_str().to_owned())
                    .or_insert_with(|| v.clone());
                if *e != v {
                    *e = "*".into();
                }
            }
        }
    }
    for (i, o) in each.iter_mut().enumerate() {
        o.headers.retain(|k, _| k.starts_with("response "));
        if i == 0 {
            o.headers.extend(headers.clone());
        }
    }
    Ok(each)
}

/// Waits (bounded: 10 s) until `picker` reports each pod's waiting queue as `waits`, then one
/// more scrape interval's worth, so every forced gauge of the same scrape is in.
async fn scraped(picker: &Picker, waits: &[u64]) -> anyhow::Result<()> {
    let mut want: Vec<u64> = waits.to_vec();
    want.sort_unstable();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = picker.metrics_text().await?;
        let mut seen: Vec<u64> = text
            .lines()
            .filter(|l| l.starts_with("inference_pool_per_pod_queue_size{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .map(|v| v as u64)
            .collect();
        seen.sort_unstable();
        if seen == want {
            tokio::time::sleep(Duration::from_millis(200)).await;
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the picker never reported the queues {want:?} (saw {seen:?})"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The request, with `{pod<i>}` in header values replaced by pod `i`'s address; on a Vertex AI
/// gRPC path the body is the JSON in an `HttpBody` in a request message, in one gRPC frame,
/// and on a vLLM gRPC path a `GenerateRequest` whose `text` it is (none when empty).
fn build(
    r: &Req,
    pods: &Pods,
    session: Option<&str>,
) -> anyhow::Result<http::Request<http_body_util::Full<bytes::Bytes>>> {
    let body = if r.path.contains("PredictionService/") {
        ::epp::request::vertex::frame(r.body.as_bytes())
    } else if r.path.contains("VllmEngine/") {
        vllm_generate(&r.body)
    } else {
        r.body.clone().into_bytes()
    };
    let mut req = client::request(Method::POST, r.path, body)?;
    for (name, value) in &r.headers {
        let mut v = value.clone();
        for (i, p) in pods.pods.iter().enumerate() {
            v = v.replace(&format!("{{pod{i}}}"), &p.addr().to_string());
        }
        req = client::with_header(req, name, &v)?;
    }
    if let (true, Some(token)) = (r.echo_session, session) {
        req = client::with_header(req, "x-session-token", token)?;
    }
    Ok(req)
}

/// A gRPC frame holding a vLLM `GenerateRequest` with `text` (field 3), or no input.
fn vllm_generate(text: &str) -> Vec<u8> {
    let mut message = Vec::new();
    if !text.is_empty() {
        message.push(0x1a);
        let mut len = text.len();
        while len >= 0x80 {
            message.push((len as u8) | 0x80);
            len >>= 7;
        }
        message.push(len as u8);
        message.extend_from_slice(text.as_bytes());
    }
    let mut out = vec![0];
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(&message);
    out
}

async fn send_one(
    envoy: &Envoy,
    pods: &Pods,
    r: &Req,
    session: Option<&str>,
) -> anyhow::Result<(Outcome, Option<String>)> {
    let before: Vec<usize> = pods.pods.iter().map(|p| p.requests().len()).collect();
    let resp = client::send(envoy.listener_addr(), build(r, pods, session)?)
        .await
        .context("sending through Envoy")?;
    let mut o = Outcome {
        status: resp.status.as_u16(),
        ..Outcome::default()
    };
    if let Some(pod) = resp.header("x-inference-pod") {
        o.pods.insert(pod.to_owned());
    }
    if !resp.status.is_success() {
        let text = resp.text();
        o.error = error_class(&text);
        o.body = without_request_ids(&text).chars().take(120).collect();
    }
    for (name, value) in &resp.headers {
        if is_compared_response_header(name.as_str()) {
            let v = value.to_str().unwrap_or("<binary>");
            let v = pods.name_of(v).unwrap_or_else(|| v.to_owned());
            o.headers.insert(format!("response {name}"), v);
        }
    }
    for (p, n) in pods.pods.iter().zip(before) {
        for rec in p.requests().iter().skip(n) {
            for (name, value) in &rec.headers {
                let name = name.as_str();
                if is_routing_header(name) {
                    let v = value.to_str().unwrap_or("<binary>");
                    let v = pods.name_of(v).unwrap_or_else(|| v.to_owned());
                    o.headers.insert(name.to_owned(), v);
                }
            }
        }
    }
    let token = resp.header("x-session-token").map(str::to_owned);
    Ok((o, token))
}

/// The response headers compared: llm-d's own, and the conformance verifier's echo of the
/// endpoint that served.
fn is_compared_response_header(name: &str) -> bool {
    name.starts_with("x-llm-d-") || name == "x-conformance-test-served-endpoint"
}

fn is_routing_header(name: &str) -> bool {
    name.starts_with("x-gateway-")
        || name.starts_with("x-llm-d-")
        || name.starts_with("x-prefiller")
        || name.starts_with("x-encoder")
        || name.starts_with("x-kv-cache-source")
        || name.starts_with("x-data-parallel")
}

/// One outcome of repeats: the statuses and bodies must agree, pods are united and header
/// values that differ become `*`.
fn merge(each: Vec<Outcome>) -> Outcome {
    let mut it = each.into_iter();
    let Some(mut first) = it.next() else {
        return Outcome::default();
    };
    for o in it {
        if o.status != first.status {
            first.status = 0;
        }
        first.pods.extend(o.pods);
        for (k, v) in o.headers {
            let e = first.headers.entry(k).or_insert_with(|| v.clone());
            if *e != v {
                *e = "*".into();
            }
        }
    }
    first
}

#[test]
fn request_ids_are_masked_and_the_rest_kept() {
    let body = "failed to run any scheduler profile for request 670b-9c1 (x); for request ";
    assert_eq!(
        without_request_ids(body),
        "failed to run any scheduler profile for request <id> (x); for request "
    );
}
