//! `routesim`: the routing grid in virtual time (see the crate documentation).
//!
//! ```text
//! cargo run --release -p routesim -- grid --seeds 20 --out BENCHMARKS-grid.md
//! cargo run --release -p routesim -- grid --small          # what the test command runs
//! ```

use clap::{Parser, Subcommand};
use routesim::grid::{self, Plan};
use routesim::report;
use std::path::PathBuf;

#[derive(Parser)]
#[command(about = "epp's decision path over simulated vLLM pods, in virtual time")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs workloads × loads × routers × seeds and writes the table (and plots).
    Grid(report::GridArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Grid(args) => {
            let plan: Plan = args.plan()?;
            let cells = grid::run(&plan, |c| {
                eprintln!(
                    "{} {:.0}% {}: TTFT p90 {:.0} ms [{:.0}-{:.0}], hit {:.1}%, {:.0}x real time",
                    c.workload,
                    c.load * 100.0,
                    c.router,
                    c.ttft_p90.mean,
                    c.ttft_p90.lo,
                    c.ttft_p90.hi,
                    c.hit_rate.mean * 100.0,
                    c.speed
                );
            })?;
            let out: PathBuf = args.out.clone();
            report::write(&out, &plan, &cells)?;
            println!("{}", out.display());
        }
    }
    Ok(())
}
