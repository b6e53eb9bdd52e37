//! `model-server --ports 8001,8002 --model NAME`: runs one model-server stand-in per port on
//! 127.0.0.1 until SIGINT or SIGTERM (used by the demo script).

use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use harness::standin::{StandIn, StandInOptions};
use tokio::signal::unix::{signal, SignalKind};

/// Model-server stand-ins on 127.0.0.1.
#[derive(Debug, Parser)]
#[command(name = "model-server", about)]
struct Args {
    /// Comma-separated ports, one stand-in each.
    #[arg(long, value_delimiter = ',', required = true)]
    ports: Vec<u16>,
    /// Served model name.
    #[arg(long, default_value = "test-model")]
    model: String,
    /// Comma-separated LoRA adapter names.
    #[arg(long, value_delimiter = ',')]
    lora: Vec<String>,
    /// Pod names are `<name-prefix>-<port>`.
    #[arg(long, default_value = "model-server")]
    name_prefix: String,
    /// Tokens per completion (one SSE event each).
    #[arg(long, default_value_t = 5)]
    completion_tokens: u64,
    /// Milliseconds before a reply or the first SSE event.
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,
    /// Milliseconds between SSE events.
    #[arg(long, default_value_t = 100)]
    stream_interval_ms: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args = Args::parse();
    let mut servers = Vec::new();
    for port in &args.ports {
        let opts = StandInOptions {
            name: format!("{}-{port}", args.name_prefix),
            model: args.model.clone(),
            lora_adapters: args.lora.clone(),
            completion_tokens: args.completion_tokens,
            latency: Duration::from_millis(args.latency_ms),
            stream_interval: Duration::from_millis(args.stream_interval_ms),
            ..StandInOptions::default()
        };
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", *port))
            .await
            .with_context(|| format!("binding 127.0.0.1:{port}"))?;
        let server = StandIn::start(listener, opts)?;
        println!(
            "model-server {} listening on {}",
            server.name(),
            server.addr()
        );
        servers.push(server);
    }
    wait_for_signal().await?;
    for server in servers {
        server.shutdown().await;
    }
    Ok(())
}

async fn wait_for_signal() -> anyhow::Result<()> {
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}
