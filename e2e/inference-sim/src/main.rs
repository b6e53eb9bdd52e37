//! `inference-sim`: simulated vLLM pods (one or many per process) for
//! measuring routing without GPUs. The model is documented in `--help` and in
//! `inference_sim`; this file only turns flags into `PodConfig`s.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use inference_sim::hashing::DEFAULT_HASH_SEED;
use inference_sim::{
    serve_admin, Cluster, EngineConfig, EngineNaming, EventEncoding, Faults, KvEventsConfig,
    KvTransferConfig, KvUsageMetric, MetricsOptions, PodConfig, Profile, SocketMode, TokenizerKind,
};
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// A vLLM model-server simulator, faithful enough that routing results hold on GPUs.
///
/// ENGINE MODEL (vLLM V1, FCFS): each pod runs a discrete-step engine. At most
/// --max-num-seqs sequences run; the rest wait in FIFO order. Every step
/// schedules running sequences first (remaining prompt chunk or one decode
/// token), then admits waiting ones, within --max-num-batched-tokens
/// (chunked prefill). Step time = step-overhead + prefill tokens ×
/// prefill-per-token + decoding sequences × decode-per-seq + context tokens ×
/// attention-per-context-token, divided by the pod's --speeds factor and by
/// --time-scale (10 = ten times faster than real time, same shape; metrics
/// report simulated seconds).
///
/// KV CACHE: --num-gpu-blocks blocks of --block-size tokens (block 0
/// reserved). Prefix caching exactly as vLLM: full blocks only, sha256_cbor
/// chained hashes from NONE_HASH = sha256(cbor(--hash-seed)), LoRA name as an
/// extra key on every block, cache_salt on the first; freed blocks stay cached
/// (LRU) until reused; a cached prefix skips prefill; a running sequence that
/// cannot get a block preempts the last running one. kv_cache_usage_perc =
/// 1 - free/(num_gpu_blocks-1), free cached blocks counting as free.
///
/// TOKENIZER: tiktoken (--tokenizer, cl100k_base by default); chat messages
/// render as `<|role|>\ncontent\n` each, then `<|assistant|>\n`.
///
/// POD CONTROL: with --admin-port, GET /admin/pods, POST /admin/pods/{i}/kill,
/// POST /admin/pods/{i}/restart, GET|POST /admin/pods/{i}/faults (JSON:
/// failure_rate, failure_status, added_latency_ms, hang, stall_metrics, unhealthy).
/// Any request may carry `X-Return-Error: <status>`.
#[derive(Debug, Parser)]
#[command(name = "inference-sim", about, long_about, verbatim_doc_comment)]
struct Args {
    /// Served model name.
    #[arg(
        long,
        visible_alias = "served-model-name",
        default_value = "meta-llama/Llama-3.1-8B-Instruct"
    )]
    model: String,
    /// Number of pods in this process; pod i listens on --base-port + i.
    #[arg(long, default_value_t = 1)]
    pods: usize,
    /// Address every pod listens on.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// Pod i listens on --host + i (IPv4, e.g. 127.0.0.1, 127.0.0.2, ...), every pod on
    /// --base-port: one IP per pod, as in a cluster (what Kubernetes discovery with one target
    /// port per pool needs).
    #[arg(long)]
    host_per_pod: bool,
    /// Port of pod 0 (0 = pick free ports).
    #[arg(long, visible_alias = "port", default_value_t = 8000)]
    base_port: u16,
    /// Pod names (x-inference-pod) are `<prefix>-<i>` [default: $POD_NAME, else inference-sim].
    #[arg(long)]
    pod_name_prefix: Option<String>,
    /// Value of x-inference-namespace [default: $POD_NAMESPACE].
    #[arg(long)]
    namespace: Option<String>,
    /// RNG seed (pod i uses seed + i).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[command(flatten)]
    engine: EngineArgs,
    #[command(flatten)]
    lora: LoraArgs,
    #[command(flatten)]
    metrics: MetricsArgs,
    #[command(flatten)]
    faults: FaultArgs,
    #[command(flatten)]
    kv: KvArgs,
    #[command(flatten)]
    pd: PdArgs,
    /// Port of the admin endpoint (kill/restart/faults per pod); off if unset.
    #[arg(long)]
    admin_port: Option<u16>,
}

#[derive(Debug, clap::Args)]
struct EngineArgs {
    /// Maximum running sequences per pod.
    #[arg(long, default_value_t = 256)]
    max_num_seqs: usize,
    /// Token budget per step (prefill chunks + decode tokens).
    #[arg(long, default_value_t = 8192)]
    max_num_batched_tokens: usize,
    /// Maximum prompt + output tokens.
    #[arg(long, default_value_t = 8192)]
    max_model_len: usize,
    /// KV blocks per pod, including the reserved null block (8B on H100 80GB ≈ 27493).
    #[arg(
        long,
        visible_alias = "num-gpu-blocks-override",
        default_value_t = 27493
    )]
    num_gpu_blocks: usize,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    /// Requests waiting beyond this are refused with 503.
    #[arg(long, default_value_t = 10_000)]
    max_waiting: usize,
    /// Seed of NONE_HASH [default: $PYTHONHASHSEED, else "vllm-none-hash" as 2026 vLLM].
    #[arg(long)]
    hash_seed: Option<String>,
    /// Output tokens when a request sets no max_tokens: uniform 1..=this, finish "stop".
    #[arg(long, default_value_t = 128)]
    default_max_output: usize,
    /// Timing profile (h100-8b: 7 ms step, 60 µs/prefill token, 60 µs/decoding seq, 25 ns/context token;
    /// llmd-h100-8b: 12 ms, 250 µs, 800 µs, 0).
    #[arg(long, value_enum, default_value_t = Profile::H100Llama8b)]
    profile: Profile,
    /// Override: fixed cost per step, µs.
    #[arg(long)]
    step_overhead_us: Option<f64>,
    /// Override: cost per prefill token, µs.
    #[arg(long)]
    prefill_us_per_token: Option<f64>,
    /// Override: cost per decoding sequence, µs.
    #[arg(long)]
    decode_us_per_seq: Option<f64>,
    /// Override: attention cost per context token in the batch, ns.
    #[arg(long)]
    attention_ns_per_context_token: Option<f64>,
    /// Simulated seconds per wall second.
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Per-pod speed factors, cycled over the pods (e.g. 1,1,0.5: every third pod is half as fast).
    #[arg(long, value_delimiter = ',', default_value = "1.0")]
    speeds: Vec<f64>,
    /// Tokenizer vocabulary.
    #[arg(long, value_enum, default_value_t = TokenizerKind::Cl100kBase)]
    tokenizer: TokenizerKind,
    /// /health fails and model routes answer 503 for this long after (re)start (simulated ms).
    #[arg(long, default_value_t = 0)]
    startup_delay_ms: u64,
}

#[derive(Debug, clap::Args)]
struct LoraArgs {
    /// Serve LoRA adapters (implied by --lora-modules).
    #[arg(long)]
    enable_lora: bool,
    /// Distinct adapters per batch.
    #[arg(long, default_value_t = 4)]
    max_loras: usize,
    /// Comma-separated adapter names loaded at start.
    #[arg(long, value_delimiter = ',')]
    lora_modules: Vec<String>,
}

#[derive(Debug, clap::Args)]
struct MetricsArgs {
    /// Which KV-usage gauge name(s) to expose.
    #[arg(long, value_enum, default_value_t = KvUsageMetric::Both)]
    kv_usage_metric: KvUsageMetric,
    /// Omit the `_created` gauges (vLLM with --api-server-count > 1).
    #[arg(long)]
    no_created_series: bool,
    /// Append NVIDIA DCGM exporter series (GPU util, framebuffer used/free).
    #[arg(long)]
    dcgm_metrics: bool,
    /// Whose names the load metrics carry: vllm, sglang or trtllm-serve (also served on
    /// /prometheus/metrics).
    #[arg(long, value_enum, default_value_t = EngineNaming::Vllm)]
    metric_names: EngineNaming,
    /// Omit usage.prompt_tokens_details.cached_tokens.
    #[arg(long)]
    no_prompt_tokens_details: bool,
}

#[derive(Debug, clap::Args)]
struct FaultArgs {
    /// Fraction of inference requests failing with --failure-status.
    #[arg(long, default_value_t = 0.0)]
    failure_rate: f64,
    #[arg(long, default_value_t = 500)]
    failure_status: u16,
    /// Latency added before a request enters the engine (simulated ms).
    #[arg(long, default_value_t = 0)]
    added_latency_ms: u64,
    /// Start with inference requests hanging.
    #[arg(long)]
    hang: bool,
    /// Start with /metrics frozen.
    #[arg(long)]
    stall_metrics: bool,
}

#[derive(Debug, clap::Args)]
struct KvArgs {
    /// ZMQ PUB endpoint. Binds if it has `*`, otherwise connects (vLLM's rule); binding pod i
    /// uses port + i, connecting pods all dial the same subscriber (topics tell them apart).
    #[arg(long)]
    kv_events_endpoint: Option<String>,
    #[arg(long, value_enum, default_value_t = SocketMode::Auto)]
    kv_events_mode: SocketMode,
    /// ZMQ ROUTER replay endpoint (binds); pod i uses port + i.
    #[arg(long)]
    kv_events_replay_endpoint: Option<String>,
    /// Topic; `{host}`, `{port}`, `{model}`, `{pod}` are substituted.
    #[arg(long, default_value = "kv@{host}:{port}@{model}")]
    kv_events_topic: String,
    #[arg(long, value_enum, default_value_t = EventEncoding::Array)]
    kv_events_encoding: EventEncoding,
    /// Batches kept for replay.
    #[arg(long, default_value_t = 10_000)]
    kv_events_buffer_steps: usize,
}

/// Prefill/decode disaggregation: the simulated NIXL connector (see `inference_sim` and
/// `http::inference`). A pod's role in the split is its `kv_role`; which pods prefill and
/// which decode is the endpoint picker's choice (llm-d's `llm-d.ai/role` pod label).
#[derive(Debug, clap::Args)]
struct PdArgs {
    /// vLLM's --kv-transfer-config, e.g. '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'
    /// (NixlConnector only). Without it kv_transfer_params are ignored, as vLLM does.
    #[arg(long)]
    kv_transfer_config: Option<String>,
    /// KV bytes per token pulled by a decode (131072: an 8B Llama in bf16).
    #[arg(long, default_value_t = 131_072.0)]
    kv_bytes_per_token: f64,
    /// KV pull bandwidth between pods, GB/s (simulated seconds).
    #[arg(long, default_value_t = 25.0)]
    kv_transfer_bandwidth_gbps: f64,
    /// NIXL side-channel port of pod 0 (remote_port; pod i uses + i), vLLM's default 5600.
    #[arg(long, default_value_t = 5600)]
    nixl_side_channel_port: u16,
}

fn micros(v: Option<f64>, default: Duration) -> Duration {
    v.map_or(default, |us| Duration::from_secs_f64(us.max(0.0) / 1e6))
}

fn offset_port(endpoint: &str, i: usize) -> String {
    let Some((head, port)) = endpoint.rsplit_once(':') else {
        return endpoint.to_owned();
    };
    match port.parse::<usize>() {
        Ok(p) if p != 0 => format!("{head}:{}", p + i),
        _ => endpoint.to_owned(),
    }
}

impl Args {
    /// vLLM / llm-d-inference-sim environment variables, where flags are unset.
    fn fill_from_env(&mut self) {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        self.pod_name_prefix = self.pod_name_prefix.take().or_else(|| var("POD_NAME"));
        self.namespace = self.namespace.take().or_else(|| var("POD_NAMESPACE"));
        self.engine.hash_seed = self
            .engine
            .hash_seed
            .take()
            .or_else(|| var("PYTHONHASHSEED"));
    }

    fn prefix(&self) -> &str {
        self.pod_name_prefix.as_deref().unwrap_or("inference-sim")
    }

    fn engine(&self, i: usize) -> EngineConfig {
        let e = &self.engine;
        let mut timing = e.profile.timing();
        timing.step_overhead = micros(e.step_overhead_us, timing.step_overhead);
        timing.prefill_per_token = micros(e.prefill_us_per_token, timing.prefill_per_token);
        timing.decode_per_seq = micros(e.decode_us_per_seq, timing.decode_per_seq);
        timing.attention_per_context_token = micros(
            e.attention_ns_per_context_token.map(|ns| ns / 1e3),
            timing.attention_per_context_token,
        );
        EngineConfig {
            model: self.model.clone(),
            max_num_seqs: e.max_num_seqs,
            max_num_batched_tokens: e.max_num_batched_tokens,
            max_model_len: e.max_model_len,
            num_gpu_blocks: e.num_gpu_blocks,
            block_size: e.block_size,
            max_loras: self.lora.max_loras,
            max_waiting: e.max_waiting,
            hash_seed: e
                .hash_seed
                .clone()
                .unwrap_or_else(|| DEFAULT_HASH_SEED.to_owned()),
            default_max_output: e.default_max_output,
            timing,
            speed: e
                .speeds
                .get(i % e.speeds.len().max(1))
                .copied()
                .unwrap_or(1.0),
            time_scale: e.time_scale,
            kv_transfer: None,
        }
    }

    fn kv_events(&self, i: usize, addr: SocketAddr) -> Option<KvEventsConfig> {
        let endpoint = self.kv.kv_events_endpoint.as_deref()?;
        let topic = self
            .kv
            .kv_events_topic
            .replace("{host}", &addr.ip().to_string())
            .replace("{port}", &addr.port().to_string())
            .replace("{model}", &self.model)
            .replace("{pod}", &format!("{}-{i}", self.prefix()));
        let mut cfg = KvEventsConfig {
            endpoint: endpoint.to_owned(),
            mode: self.kv.kv_events_mode,
            replay_endpoint: self
                .kv
                .kv_events_replay_endpoint
                .as_deref()
                .map(|e| offset_port(e, i)),
            topic,
            encoding: self.kv.kv_events_encoding,
            buffer_steps: self.kv.kv_events_buffer_steps,
            dp_rank: 0,
        };
        // Binding pods need a port each; connecting pods all dial the one subscriber.
        if cfg.binds() {
            cfg.endpoint = offset_port(endpoint, i);
        }
        Some(cfg)
    }

    fn kv_transfer(&self, i: usize, addr: SocketAddr) -> anyhow::Result<Option<KvTransferConfig>> {
        let Some(json) = &self.pd.kv_transfer_config else {
            return Ok(None);
        };
        let port = self.pd.nixl_side_channel_port.saturating_add(i as u16);
        KvTransferConfig::from_vllm_json(
            json,
            self.pd.kv_bytes_per_token,
            self.pd.kv_transfer_bandwidth_gbps,
            addr.ip().to_string(),
            port,
        )
        .map(Some)
        .map_err(anyhow::Error::msg)
    }

    fn pod(&self, i: usize, addr: SocketAddr) -> anyhow::Result<PodConfig> {
        let f = &self.faults;
        let mut engine = self.engine(i);
        engine.kv_transfer = self.kv_transfer(i, addr)?;
        Ok(PodConfig {
            engine,
            pod_name: format!("{}-{i}", self.prefix()),
            namespace: self.namespace.clone(),
            tokenizer: self.engine.tokenizer,
            seed: self.seed.wrapping_add(i as u64),
            enable_lora: self.lora.enable_lora || !self.lora.lora_modules.is_empty(),
            lora_modules: self.lora.lora_modules.clone(),
            prompt_tokens_details: !self.metrics.no_prompt_tokens_details,
            startup_delay: Duration::from_millis(self.engine.startup_delay_ms),
            metrics: MetricsOptions {
                kv_usage: self.metrics.kv_usage_metric,
                created_series: !self.metrics.no_created_series,
                dcgm: self.metrics.dcgm_metrics,
                naming: self.metrics.metric_names,
            },
            kv_events: self.kv_events(i, addr),
            faults: Faults {
                failure_rate: f.failure_rate,
                failure_status: f.failure_status,
                added_latency_ms: f.added_latency_ms,
                hang: f.hang,
                stall_metrics: f.stall_metrics,
                unhealthy: false,
                gpu_memory_exhausted: false,
            },
            // In-process tests only (`PodControl::hook`); a process records nothing.
            record_requests: false,
        })
    }
}

/// `host` + `i` (IPv4 only).
fn nth_host(host: IpAddr, i: usize) -> anyhow::Result<IpAddr> {
    let IpAddr::V4(v4) = host else {
        anyhow::bail!("--host-per-pod needs an IPv4 --host");
    };
    let n = u32::from(v4)
        .checked_add(u32::try_from(i)?)
        .context("--host-per-pod: address out of range")?;
    Ok(IpAddr::V4(n.into()))
}

async fn bind_pods(args: &Args) -> anyhow::Result<(Vec<TcpListener>, Vec<PodConfig>)> {
    let mut listeners = Vec::with_capacity(args.pods);
    let mut configs = Vec::with_capacity(args.pods);
    for i in 0..args.pods {
        let (host, port) = if args.host_per_pod {
            (nth_host(args.host, i)?, args.base_port)
        } else if args.base_port == 0 {
            (args.host, 0)
        } else {
            (args.host, args.base_port.saturating_add(i as u16))
        };
        let listener = TcpListener::bind((host, port))
            .await
            .with_context(|| format!("bind pod {i} on port {port}"))?;
        let addr = listener.local_addr()?;
        configs.push(args.pod(i, addr)?);
        listeners.push(listener);
    }
    Ok((listeners, configs))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let mut args = Args::parse();
    args.fill_from_env();
    anyhow::ensure!(args.pods > 0, "--pods must be at least 1");
    let (listeners, configs) = bind_pods(&args).await?;
    let cluster = Cluster::start_on(configs, listeners).await?;
    for (i, addr) in cluster.addrs().iter().enumerate() {
        tracing::info!(pod = i, %addr, model = %args.model, "pod listening");
    }
    let stop = CancellationToken::new();
    let mut tasks = JoinSet::new();
    if let Some(port) = args.admin_port {
        let listener = TcpListener::bind((args.host, port))
            .await
            .context("bind admin port")?;
        tracing::info!(addr = %listener.local_addr()?, "admin endpoint listening");
        let stop = stop.clone();
        tasks.spawn(serve_admin(listener, cluster.clone(), async move {
            stop.cancelled().await
        }));
    }
    let mut term = signal(SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
    stop.cancel();
    while tasks.join_next().await.is_some() {}
    cluster.shutdown().await;
    Ok(())
}
