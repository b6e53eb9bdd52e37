//! `epp-pool-import`: exports InferencePools annotated `inference.networking.x-k8s.io/export:
//! "ClusterSet"` to every member cluster as InferencePoolImports (GIE proposal 1374, hub/spoke),
//! and keeps their status. A binary of its own: it runs once per ClusterSet with credentials
//! for every member, where epp runs once per pool with credentials for its own namespace. The
//! logic is `epp::discovery::k8s::export`; docs/operations/pool-import.md describes it.
//!
//! ```text
//! epp-pool-import --cluster east=/etc/kube/east.yaml --cluster west=/etc/kube/west.yaml \
//!     [--controller-name epp/pool-import] [--resync-interval 30s] [--endpoints-dir DIR]
//! ```

use clap::Parser;
use epp::discovery::k8s::export::{self, ClusterFlag, Options};
use std::process::ExitCode;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(
    name = "epp-pool-import",
    about = "Export annotated InferencePools to the member clusters as InferencePoolImports"
)]
struct Cli {
    /// A member of the ClusterSet: its name (written in `exportingClusters`) and a kubeconfig
    /// for its API server. Repeat for every member; each exports and imports.
    #[arg(long = "cluster", value_name = "NAME=KUBECONFIG", required = true)]
    clusters: Vec<ClusterFlag>,
    /// The controller name written in the status (`DOMAIN/PATH`).
    #[arg(long, default_value = "epp/pool-import")]
    controller_name: String,
    /// A full pass at least this often (Go duration), besides the passes watch events start.
    #[arg(long, default_value = "30s", value_parser = resync)]
    resync_interval: Duration,
    /// Endpoint mode for epp: write each exported pool's ready endpoints in every exporting
    /// cluster to DIR/<namespace>/<name>.yaml (llm-d's file-discovery format).
    #[arg(long, value_name = "DIR")]
    endpoints_dir: Option<std::path::PathBuf>,
}

#[derive(Debug, thiserror::Error)]
enum ResyncError {
    #[error(transparent)]
    Duration(#[from] epp::duration::DurationError),
    #[error("must be above zero")]
    Zero,
}

fn resync(text: &str) -> Result<Duration, ResyncError> {
    let d = epp::duration::parse(text)?;
    if d.is_zero() {
        return Err(ResyncError::Zero);
    }
    Ok(d)
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).init();
    let options = Options {
        clusters: cli.clusters,
        controller_name: cli.controller_name,
        resync: cli.resync_interval,
        endpoints_dir: cli.endpoints_dir,
    };
    let shutdown = CancellationToken::new();
    let run = export::run(options, shutdown.clone());
    tokio::pin!(run);
    let result = tokio::select! {
        r = &mut run => r,
        () = signalled() => {
            shutdown.cancel();
            run.await
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("epp-pool-import: {e}");
            ExitCode::from(2)
        }
    }
}

/// Returns on SIGINT or SIGTERM.
async fn signalled() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}
