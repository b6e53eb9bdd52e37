//! `noop-extproc --port 9002 --endpoints 127.0.0.1:8001,127.0.0.1:8002 [--tls]`: the do-nothing
//! ext_proc server (round robin over fixed endpoints), the baseline epp is benchmarked against.
//! Listens on 127.0.0.1 until SIGINT or SIGTERM.

use anyhow::Context as _;
use clap::Parser;
use harness::noop_extproc::{self_signed_identity, NoopExtProc};
use tokio::signal::unix::{signal, SignalKind};

/// Round-robin ext_proc server with minimal per-message work.
#[derive(Debug, Parser)]
#[command(name = "noop-extproc", about)]
struct Args {
    /// gRPC port on 127.0.0.1.
    #[arg(long, default_value_t = 9002)]
    port: u16,
    /// Comma-separated `ip:port` endpoints to route to, in turn.
    #[arg(long, value_delimiter = ',', required = true)]
    endpoints: Vec<String>,
    /// Serve TLS with a self-signed certificate (as upstream's Envoy config expects).
    #[arg(long)]
    tls: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args = Args::parse();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port))
        .await
        .with_context(|| format!("binding 127.0.0.1:{}", args.port))?;
    let tls = if args.tls {
        Some(self_signed_identity().context("generating a certificate")?)
    } else {
        None
    };
    println!("noop-extproc listening on {}", listener.local_addr()?);
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    };
    NoopExtProc::new(args.endpoints)
        .serve(listener, tls, shutdown)
        .await?;
    Ok(())
}
