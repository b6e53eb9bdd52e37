//! Helpers of the KV-event tests: a scriptable fake publisher (PUB + replay ROUTER), simulator
//! pods with event streams, and an in-process epp replica (datastore + director + the
//! `kvevents` supervisor) whose precise index the tests read.

#![allow(dead_code)]

use bytes::Bytes;
use epp::datastore::Datastore;
use epp::director::Director;
use epp::endpoint::{Endpoint, EndpointId};
use epp::kvevents::{self, KvEventsOptions};
use epp::prefix::source::Indexes;
use epp::replicas;
use epp::request::tokenize::{Tokenizer, Vocabulary};
use inference_sim::kv_cache::KvEvent;
use inference_sim::kv_events::encode_batch;
use inference_sim::{
    Cluster, ClusterError, EngineConfig, EventEncoding, KvEventsConfig, PodConfig, SocketMode,
};
use rand::{rngs::SmallRng, SeedableRng};
use serde_json::json;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::process::Command;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

pub const MODEL: &str = "sim-model";

/// Queue, KV-cache and precise prefix scorers: the recommended precise profile.
pub const PRECISE_CONFIG: &str = "apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: precise-prefix-cache-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 1
  - pluginRef: kv-cache-utilization-scorer
    weight: 1
  - pluginRef: precise-prefix-cache-scorer
    weight: 2
  - pluginRef: max-score-picker
";

/// Runs `script` from tests/kvevents_py with the venv of tests/sim_py/venv.sh (pyzmq, msgpack).
pub async fn python_output(script: &str) -> String {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let venv = Command::new("bash")
        .arg(dir.join("tests/sim_py/venv.sh"))
        .arg(dir.join("../target"))
        .output()
        .await
        .expect("venv.sh runs");
    assert!(venv.status.success(), "venv.sh failed");
    let python = String::from_utf8(venv.stdout)
        .expect("utf-8")
        .trim()
        .to_owned();
    let out = Command::new(python)
        .arg(dir.join("tests/kvevents_py").join(script))
        .output()
        .await
        .expect("python runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// Polls `cond` every 10 ms for up to 15 s (events cross real sockets).
pub async fn wait_for(mut cond: impl FnMut() -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A port that was free a moment ago, for a simulator's ZMQ socket to bind later
/// ([`harness::ports`]: below the kernel's ephemeral range, never handed out twice).
pub fn free_port() -> u16 {
    harness::ports::free_port().expect("a free port")
}

fn labelled(id: EndpointId, port: u16, replay: Option<u16>) -> Endpoint {
    let mut e = Endpoint::from_id(id);
    e.labels
        .insert(kvevents::PORT_LABEL.into(), port.to_string());
    if let Some(r) = replay {
        e.labels
            .insert(kvevents::REPLAY_PORT_LABEL.into(), r.to_string());
    }
    e
}

/// Tokens of the first `n` blocks of the synthetic chain (16 tokens each).
pub fn chain_tokens(n: usize) -> Vec<u32> {
    (0..n as u32 * 16).map(|t| 1000 + t).collect()
}

pub fn other_tokens() -> Vec<u32> {
    (0..16).map(|t| 5000 + t).collect()
}

/// BlockStored of synthetic block `i` with engine hash `hash`.
pub fn block(i: usize, parent: Option<u64>, hash: u64) -> KvEvent {
    let tokens = chain_tokens(i + 1)[i * 16..].to_vec();
    KvEvent::BlockStored {
        block_hashes: vec![hash],
        parent_block_hash: parent,
        token_ids: tokens,
        block_size: 16,
        lora_id: None,
        lora_name: None,
    }
}

pub fn other_block(hash: u64) -> KvEvent {
    KvEvent::BlockStored {
        block_hashes: vec![hash],
        parent_block_hash: None,
        token_ids: other_tokens(),
        block_size: 16,
        lora_id: None,
        lora_name: None,
    }
}

pub fn keys_of(tokens: &[u32]) -> Vec<u64> {
    epp::prefix::block_hashes(MODEL, None, tokens, 16, 1000)
}

type Buffer = Arc<Mutex<Vec<(u64, Bytes)>>>;

/// A publisher the test scripts batch by batch, with a replay ROUTER when asked.
pub struct FakePod {
    publisher: tokio::sync::Mutex<PubSocket>,
    buffer: Buffer,
    port: u16,
    replay: Option<u16>,
    id: EndpointId,
    stop: CancellationToken,
    _tasks: TaskTracker,
}

impl FakePod {
    pub async fn start(with_replay: bool) -> Self {
        let mut publisher = PubSocket::new();
        let port = match publisher.bind("tcp://127.0.0.1:0").await.expect("bind PUB") {
            zeromq::Endpoint::Tcp(_, port) => port,
            other => panic!("unexpected endpoint {other}"),
        };
        let buffer: Buffer = Arc::default();
        let stop = CancellationToken::new();
        let tasks = TaskTracker::new();
        let replay = if with_replay {
            let mut router = RouterSocket::new();
            let port = match router.bind("tcp://127.0.0.1:0").await.expect("bind ROUTER") {
                zeromq::Endpoint::Tcp(_, port) => port,
                other => panic!("unexpected endpoint {other}"),
            };
            tasks.spawn(serve_replay(router, Arc::clone(&buffer), stop.clone()));
            Some(port)
        } else {
            None
        };
        let id: EndpointId = format!("127.0.0.1:{}", free_port()).parse().expect("id");
        Self {
            publisher: tokio::sync::Mutex::new(publisher),
            buffer,
            port,
            replay,
            id,
            stop,
            _tasks: tasks,
        }
    }

    pub fn id(&self) -> EndpointId {
        self.id
    }

    pub fn endpoint(&self) -> Endpoint {
        labelled(self.id, self.port, self.replay)
    }

    /// Keeps the batch for replay without publishing it (a message the subscriber missed).
    pub fn buffer(&self, seq: u64, event: KvEvent) {
        let payload = Bytes::from(encode_batch(1.0, &[event], EventEncoding::Array, 0));
        self.buffer.lock().expect("lock").push((seq, payload));
    }

    pub async fn send(&self, seq: u64, event: KvEvent) {
        self.buffer(seq, event);
        let payload = self
            .buffer
            .lock()
            .expect("lock")
            .last()
            .map(|(_, p)| p.clone())
            .expect("just buffered");
        let frames = vec![
            Bytes::from_static(b"kv@127.0.0.1:1@sim-model"),
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            payload,
        ];
        let msg = ZmqMessage::try_from(frames).expect("frames");
        self.publisher
            .lock()
            .await
            .send(msg)
            .await
            .expect("publish");
    }

    /// Publishes `seq` until the replica has indexed something (a SUB socket joins late).
    pub async fn publish_until_seen(&self, replica: &Replica, seq: u64, event: KvEvent) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while replica.indexes.precise.entries() == 0 {
            assert!(
                Instant::now() < deadline,
                "subscriber never received seq {seq}"
            );
            self.buffer.lock().expect("lock").retain(|(s, _)| *s != seq);
            self.send(seq, event.clone()).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for FakePod {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn serve_replay(mut router: RouterSocket, buffer: Buffer, stop: CancellationToken) {
    loop {
        let msg = tokio::select! {
            m = router.recv() => m,
            () = stop.cancelled() => return,
        };
        let Ok(msg) = msg else { return };
        let frames = msg.into_vec();
        let id = frames[0].clone();
        let start = u64::from_be_bytes(
            <[u8; 8]>::try_from(frames.last().expect("seq").as_ref()).expect("8 bytes"),
        );
        let batches: Vec<(u64, Bytes)> = buffer
            .lock()
            .expect("lock")
            .iter()
            .filter(|(s, _)| *s >= start)
            .cloned()
            .collect();
        let mut batches = batches;
        batches.sort_by_key(|(s, _)| *s);
        for (seq, payload) in batches {
            let reply = vec![
                id.clone(),
                Bytes::new(),
                Bytes::copy_from_slice(&seq.to_be_bytes()),
                payload,
            ];
            router
                .send(ZmqMessage::try_from(reply).expect("frames"))
                .await
                .expect("reply");
        }
        let end = vec![
            id.clone(),
            Bytes::new(),
            Bytes::from_static(&[0xff; 8]),
            Bytes::new(),
        ];
        router
            .send(ZmqMessage::try_from(end).expect("frames"))
            .await
            .expect("reply");
    }
}

/// Simulator pods publishing KV events on fixed ports (so a restarted pod publishes on the same
/// port); even pods use positional arrays, odd pods maps.
pub struct SimPods {
    pub cluster: Cluster,
    ports: Vec<(u16, u16)>,
}

impl SimPods {
    pub async fn start(n: usize, num_gpu_blocks: usize) -> Self {
        Self::start_with(
            n,
            EngineConfig {
                model: MODEL.into(),
                num_gpu_blocks,
                max_num_seqs: 8,
                ..EngineConfig::default()
            },
        )
        .await
    }

    pub async fn start_with(n: usize, engine: EngineConfig) -> Self {
        let mut configs = Vec::new();
        let mut ports = Vec::new();
        for i in 0..n {
            let (port, replay) = (free_port(), free_port());
            let cfg = PodConfig {
                engine: engine.clone(),
                pod_name: format!("sim-{i}"),
                prompt_tokens_details: true,
                seed: i as u64,
                kv_events: Some(KvEventsConfig {
                    endpoint: format!("tcp://127.0.0.1:{port}"),
                    mode: SocketMode::Bind,
                    replay_endpoint: Some(format!("tcp://127.0.0.1:{replay}")),
                    topic: format!("kv@127.0.0.1:{port}@{MODEL}"),
                    encoding: if i % 2 == 0 {
                        EventEncoding::Array
                    } else {
                        EventEncoding::Map
                    },
                    buffer_steps: 1000,
                    dp_rank: 0,
                }),
                ..PodConfig::default()
            };
            configs.push(cfg);
            ports.push((port, replay));
        }
        let addrs: Vec<SocketAddr> = configs
            .iter()
            .map(|_| SocketAddr::from(([127, 0, 0, 1], 0)))
            .collect();
        let cluster = Cluster::start(configs, &addrs)
            .await
            .expect("cluster starts");
        Self { cluster, ports }
    }

    /// One pod with `ranks` data-parallel ranks, as vLLM `--data-parallel-size` deploys them:
    /// rank `r` serves HTTP on the pod's port + `r` and offsets its KV-event PUB and replay
    /// ports by `r` from the `--kv-events-config` ones (stamping `data_parallel_rank` = `r`).
    /// [`Self::rank_endpoints`] are epp's endpoints for it: one per rank, carrying the pod's
    /// rank-0 event ports as a pod label would.
    ///
    /// The ports are drawn free and bound a moment later; another process can take one in
    /// between (CI once saw `AddrInUse` here), so a failed bind draws them again, up to 5 times.
    pub async fn start_ranks(ranks: usize, num_gpu_blocks: usize) -> Self {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match Self::try_start_ranks(ranks, num_gpu_blocks).await {
                Ok(pods) => return pods,
                Err(ClusterError::Bind { addr, source })
                    if source.kind() == std::io::ErrorKind::AddrInUse && attempt < 5 =>
                {
                    eprintln!("{addr} was taken between the draw and the bind; drawing again");
                }
                Err(e) => panic!("cluster starts: {e:?}"),
            }
        }
    }

    async fn try_start_ranks(ranks: usize, num_gpu_blocks: usize) -> Result<Self, ClusterError> {
        let range = |n| harness::ports::free_range(n).expect("free ports");
        let (http, publish, replay) = (range(ranks), range(ranks), range(ranks));
        let engine = EngineConfig {
            model: MODEL.into(),
            num_gpu_blocks,
            max_num_seqs: 8,
            ..EngineConfig::default()
        };
        let (mut configs, mut addrs) = (Vec::new(), Vec::new());
        for r in 0..ranks as u16 {
            configs.push(PodConfig {
                engine: engine.clone(),
                pod_name: format!("sim-rank-{r}"),
                prompt_tokens_details: true,
                seed: u64::from(r),
                kv_events: Some(KvEventsConfig {
                    endpoint: format!("tcp://127.0.0.1:{}", publish + r),
                    mode: SocketMode::Bind,
                    replay_endpoint: Some(format!("tcp://127.0.0.1:{}", replay + r)),
                    topic: format!("kv@127.0.0.1:{http}@{MODEL}"),
                    encoding: EventEncoding::Array,
                    buffer_steps: 1000,
                    dp_rank: u32::from(r),
                }),
                ..PodConfig::default()
            });
            addrs.push(SocketAddr::from(([127, 0, 0, 1], http + r)));
        }
        let cluster = Cluster::start(configs, &addrs).await?;
        Ok(Self {
            cluster,
            ports: vec![(publish, replay); ranks],
        })
    }

    /// Endpoints of a pod started with [`Self::start_ranks`]: `sim-rank-<r>`, rank `r`, and the
    /// pod's rank-0 event and replay ports.
    pub fn rank_endpoints(&self) -> Vec<Endpoint> {
        self.endpoints()
            .into_iter()
            .enumerate()
            .map(|(r, mut e)| {
                e.rank = r as u16;
                e.name = format!("sim-rank-{r}");
                e
            })
            .collect()
    }

    /// Pods whose PUB sockets connect to epp's bound SUB at `bind` (bind mode); the topic names
    /// each pod by its HTTP address, and each pod still binds a replay socket.
    pub async fn start_connecting(n: usize, num_gpu_blocks: usize, bind: &str) -> Self {
        let engine = EngineConfig {
            model: MODEL.into(),
            num_gpu_blocks,
            max_num_seqs: 8,
            ..EngineConfig::default()
        };
        let (mut configs, mut addrs, mut ports) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..n {
            let (http, replay) = (free_port(), free_port());
            configs.push(PodConfig {
                engine: engine.clone(),
                pod_name: format!("sim-{i}"),
                prompt_tokens_details: true,
                seed: i as u64,
                kv_events: Some(KvEventsConfig {
                    endpoint: bind.to_owned(),
                    mode: SocketMode::Connect,
                    replay_endpoint: Some(format!("tcp://127.0.0.1:{replay}")),
                    topic: format!("kv@127.0.0.1:{http}@{MODEL}"),
                    encoding: if i % 2 == 0 {
                        EventEncoding::Array
                    } else {
                        EventEncoding::Map
                    },
                    buffer_steps: 1000,
                    dp_rank: 0,
                }),
                ..PodConfig::default()
            });
            addrs.push(SocketAddr::from(([127, 0, 0, 1], http)));
            ports.push((0, replay));
        }
        let cluster = Cluster::start(configs, &addrs)
            .await
            .expect("cluster starts");
        Self { cluster, ports }
    }

    /// Endpoints of pods started with [`Self::start_connecting`]: a replay port, no event port.
    pub fn bound_endpoints(&self) -> Vec<Endpoint> {
        self.ports
            .iter()
            .enumerate()
            .map(|(i, (_, r))| {
                let mut e = labelled(self.id(i), 1, Some(*r));
                e.labels.remove(kvevents::PORT_LABEL);
                e
            })
            .collect()
    }

    pub fn id(&self, pod: usize) -> EndpointId {
        EndpointId(self.cluster.addrs()[pod])
    }

    pub fn addr(&self, pod: usize) -> SocketAddr {
        self.cluster.addrs()[pod]
    }

    pub fn endpoints(&self) -> Vec<Endpoint> {
        self.ports
            .iter()
            .enumerate()
            .map(|(i, (p, r))| labelled(self.id(i), *p, Some(*r)))
            .collect()
    }

    pub async fn complete(&self, pod: usize, prompt: &str) {
        let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 1}).to_string();
        let r = harness::client::post_json(self.cluster.addrs()[pod], "/v1/completions", body)
            .await
            .expect("request");
        assert!(r.status.is_success(), "{}", r.text());
    }

    pub async fn chat(&self, pod: usize, text: &str) {
        let r = harness::client::post_json(
            self.cluster.addrs()[pod],
            "/v1/chat/completions",
            chat_body(text),
        )
        .await
        .expect("request");
        assert!(r.status.is_success(), "{}", r.text());
    }
}

pub fn chat_body(text: &str) -> String {
    json!({"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 1})
        .to_string()
}

/// `words` distinct-ish words starting with `seed`: about `words` tokens.
pub fn long_prompt(seed: &str, words: usize) -> String {
    let mut s = String::from(seed);
    for i in 0..words {
        s.push_str(&format!(" w{}", (i * 7919) % 1000));
    }
    s
}

/// Each replica draws its own random tie-breaks, as separate processes do.
static NEXT_SEED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(7);

/// One epp replica in-process: datastore, director, and the KV-event supervisor.
pub struct Replica {
    pub director: Arc<Director>,
    /// The replica's prefix indexes (the director records into them, the events feed them).
    pub indexes: Arc<Indexes>,
    pub datastore: Arc<Datastore>,
    pub metrics: Arc<epp::metrics::Metrics>,
    ids: Vec<EndpointId>,
    tokenizer: Tokenizer,
    rng: Mutex<SmallRng>,
    tracker: TaskTracker,
    stop: CancellationToken,
}

impl Replica {
    pub async fn start(endpoints: &[Endpoint]) -> Self {
        Self::build(endpoints, PRECISE_CONFIG, true, false)
    }

    pub async fn start_without_events(endpoints: &[Endpoint]) -> Self {
        Self::build(endpoints, PRECISE_CONFIG, false, false)
    }

    /// A replica with `config`, subscribing to KV events when `events`, scraping the pods'
    /// metrics every 50 ms when `scrape` (as epp does by default).
    pub fn build(endpoints: &[Endpoint], config: &str, events: bool, scrape: bool) -> Self {
        Self::build_with(
            endpoints,
            config,
            events.then(KvEventsOptions::default),
            scrape,
        )
    }

    /// A replica in KV-event bind mode: its SUB socket binds `bind`.
    pub async fn start_bound(endpoints: &[Endpoint], bind: &str) -> Self {
        Self::build_with(
            endpoints,
            PRECISE_CONFIG,
            Some(KvEventsOptions {
                bind: Some(bind.to_owned()),
                ..KvEventsOptions::default()
            }),
            false,
        )
    }

    /// Replicas without KV events (the window before a pod's first BlockStored) that send each
    /// other their speculative entries over loopback gRPC with mutual TLS, as
    /// `--speculative-peers` wires it.
    pub async fn start_sharing(endpoints: &[Endpoint], n: usize) -> Vec<Self> {
        let mut listeners = Vec::new();
        for _ in 0..n {
            listeners.push(
                tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("bind"),
            );
        }
        let peers: Vec<replicas::PeerName> = listeners
            .iter()
            .map(|s| replicas::PeerName::parse(&s.local_addr().expect("addr").to_string()))
            .collect::<Result<_, _>>()
            .expect("peer names");
        let creds = replicas::Credentials::generate(&["127.0.0.1"]).expect("credentials");
        let tls = replicas::PeerTls::new(&creds).expect("TLS");
        listeners
            .into_iter()
            .map(|listener| {
                let sharing = replicas::Sharing {
                    listener: Some(listener),
                    peers: peers.clone(),
                    tls: tls.clone(),
                };
                Self::build_full(endpoints, PRECISE_CONFIG, None, false, Some(sharing))
            })
            .collect()
    }

    /// As [`Self::build`], with the KV-event options (`None`: no subscription).
    pub fn build_with(
        endpoints: &[Endpoint],
        config: &str,
        events: Option<KvEventsOptions>,
        scrape: bool,
    ) -> Self {
        Self::build_full(endpoints, config, events, scrape, None)
    }

    /// As [`Self::build_with`]; `share`: send speculative entries to these peers and apply
    /// theirs ([`replicas::share`], as `--speculative-peers` wires it).
    fn build_full(
        endpoints: &[Endpoint],
        config: &str,
        events: Option<KvEventsOptions>,
        scrape: bool,
        share: Option<replicas::Sharing>,
    ) -> Self {
        let (tracker, stop) = (TaskTracker::new(), CancellationToken::new());
        let (tasks, stopping) = (tracker.clone(), stop.clone());
        let graph = epp::fixtures::graph(config)
            .endpoints(endpoints.to_vec())
            .placements(move |shared| {
                let to_index = replicas::Shared {
                    datastore: Arc::clone(&shared.datastore),
                    index: Arc::clone(&shared.indexes.precise),
                    metrics: Arc::clone(&shared.metrics),
                };
                let sink = replicas::share(share?, to_index, &tasks, &stopping)?;
                Some(Arc::new(sink) as Arc<dyn epp::director::PlacementSink>)
            })
            .build();
        let (datastore, metrics) = (graph.datastore, graph.metrics);
        let (director, indexes) = (graph.director, graph.shared.indexes);
        if let Some(kv) = events {
            let sink = kvevents::Sink::new(Arc::clone(&indexes.precise), Arc::clone(&metrics));
            tracker.spawn(kvevents::run(
                Arc::clone(&datastore),
                sink,
                kv,
                tracker.clone(),
                stop.clone(),
            ));
        }
        if scrape {
            let sopts = epp::scrape::ScrapeOptions {
                interval: Duration::from_millis(50),
                timeout: Duration::from_secs(1),
                gpu_metrics_url: None,
                ..epp::scrape::ScrapeOptions::default()
            };
            tracker.spawn(epp::scrape::run(
                Arc::clone(&datastore),
                Arc::clone(&metrics),
                sopts,
                tracker.clone(),
                stop.clone(),
            ));
        }
        let datastore_for_tests = Arc::clone(&datastore);
        let tokenizer = Tokenizer::new(Vocabulary::Cl100kBase).expect("tokenizer");
        Self {
            director,
            indexes,
            datastore: datastore_for_tests,
            metrics,
            ids: endpoints.iter().map(|e| e.id).collect(),
            tokenizer,
            rng: Mutex::new(SmallRng::seed_from_u64(
                NEXT_SEED.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            )),
            tracker,
            stop,
        }
    }

    pub fn matched(&self, id: EndpointId, keys: &[u64]) -> usize {
        self.indexes
            .precise
            .longest_prefix(keys, Instant::now())
            .into_iter()
            .find(|(e, _)| *e == id)
            .map_or(0, |(_, n)| n)
    }

    pub fn prompt_keys(&self, prompt: &str) -> Vec<u64> {
        keys_of(&self.tokenizer.encode_prefix(prompt, 4096))
    }

    pub fn chat_keys(&self, text: &str) -> Vec<u64> {
        let rendered = epp::request::chat::render(chat_body(text).as_bytes()).expect("renders");
        keys_of(&self.tokenizer.encode_prefix(&rendered, 4096))
    }

    pub fn route(&self, path: &str, body: &str) -> usize {
        self.route_held(path, body).0
    }

    /// Routes and keeps the decision (its in-flight count lasts until the `Routed` drops).
    pub fn route_held(&self, path: &str, body: &str) -> (usize, epp::director::Routed) {
        let mut rng = self.rng.lock().expect("lock");
        let routed = harness::fixtures::route(&self.director, path, body.as_bytes(), &mut *rng)
            .expect("routed");
        (
            self.ids
                .iter()
                .position(|id| *id == routed.destinations[0])
                .expect("a known pod"),
            routed,
        )
    }

    pub fn route_chat(&self, text: &str) -> usize {
        self.route("/v1/chat/completions", &chat_body(text))
    }

    pub fn route_completion(&self, prompt: &str) -> usize {
        self.route(
            "/v1/completions",
            &json!({"model": MODEL, "prompt": prompt, "max_tokens": 1}).to_string(),
        )
    }

    pub async fn stop(self) {
        self.stop.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }
}
