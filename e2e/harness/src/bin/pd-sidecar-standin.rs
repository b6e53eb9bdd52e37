//! `pd-sidecar-standin`: the stand-in for llm-d's decode-side P/D sidecar (`pd-sidecar`
//! v0.10.0, not installable here: the Go module proxy refuses `github.com/llm-d/llm-d-router`).
//! The protocol it follows and what it leaves out: `harness::pd_sidecar`. Flags keep the
//! sidecar's names and defaults.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use harness::pd_sidecar::{Sidecar, SidecarConfig};
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};

#[derive(Debug, Parser)]
#[command(name = "pd-sidecar-standin", about)]
struct Args {
    /// The port the sidecar listens on.
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Address to listen on and of the local model server.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// The port the model server is listening on.
    #[arg(long, visible_alias = "vllm-port", default_value_t = 8200)]
    model_server_port: u16,
    /// Only the NIXL v2 protocol is reproduced.
    #[arg(long, default_value = "nixlv2")]
    kv_connector: String,
    /// Max retries of a prefill answered 502/503/504.
    #[arg(long, default_value_t = 0)]
    prefill_max_retries: u32,
    /// Delay between prefill retries (Go duration: 100ms, 1s).
    #[arg(long, default_value = "200ms", value_parser = epp::duration::parse)]
    prefill_retry_backoff: Duration,
    /// TLS is not reproduced: only false is accepted (llm-d's manifests pass
    /// `--secure-proxy=false`; the upstream default is true).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    secure_proxy: bool,
    /// The model server's data-parallel size: rank r is served on --port + r and decodes on
    /// --model-server-port + r.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    data_parallel_size: u16,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    anyhow::ensure!(
        args.kv_connector == "nixlv2",
        "--kv-connector {:?}: the stand-in reproduces nixlv2 only",
        args.kv_connector
    );
    anyhow::ensure!(
        !args.secure_proxy,
        "--secure-proxy=true (the default): the stand-in serves plain HTTP only; pass --secure-proxy=false as llm-d's manifests do"
    );
    let mut listeners = Vec::new();
    for r in 0..args.data_parallel_size {
        let port = args
            .port
            .checked_add(r)
            .context("--port + rank is past 65535")?;
        let listener = TcpListener::bind((args.host, port))
            .await
            .with_context(|| format!("bind port {port} (rank {r})"))?;
        listeners.push(listener);
    }
    let cfg = SidecarConfig {
        decoder: SocketAddr::new(args.host, args.model_server_port),
        prefill_max_retries: args.prefill_max_retries,
        prefill_retry_backoff: args.prefill_retry_backoff,
        data_parallel_size: args.data_parallel_size,
    };
    let sidecar = Sidecar::start_ranks(listeners, cfg)?;
    tracing::info!(addr = %sidecar.addr(), decoder = args.model_server_port, "pd-sidecar stand-in listening");
    let mut term = signal(SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    sidecar.shutdown().await;
    Ok(())
}
