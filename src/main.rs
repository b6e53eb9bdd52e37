//! The epp binary: parse flags, set up logging, bind, run until SIGINT/SIGTERM.

use clap::Parser;
use epp::app::{self, Listeners, Options};
use tokio_util::sync::CancellationToken;

/// mimalloc instead of the system allocator: epp makes ~180 small allocations per request
/// (prost messages, h2 frames, header maps) and malloc/free were about a fifth of its
/// instructions per small request (BENCHMARKS.md, "Overhead").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn init_logging(opts: &Options) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(opts.log_directive()));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if opts.zap_encoder == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

async fn shutdown_signal(token: CancellationToken) {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot listen for SIGTERM");
                    let _ = ctrl_c.await;
                    return token.cancel();
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    token.cancel();
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let opts = Options::parse();
    init_logging(&opts);
    for note in opts.partial_notes() {
        tracing::warn!("{note}");
    }
    opts.validate()?;
    let listeners = Listeners::bind(&opts).await?;
    // The first SIGTERM/SIGINT drains (--drain-timeout); a second one stops at once.
    let drain = CancellationToken::new();
    let shutdown = CancellationToken::new();
    let run = app::run_with_drain(opts, listeners, drain.clone(), shutdown.clone());
    tokio::pin!(run);
    tokio::select! {
        result = &mut run => return result,
        _ = shutdown_signal(drain) => {}
    }
    tokio::select! {
        result = &mut run => return result,
        _ = shutdown_signal(shutdown) => {}
    }
    run.await
}
