//! `epp-config`: check an EndpointPickerConfig before deploying it, or migrate it to llm-d
//! v1.0's `llm-d.ai/v1` (`epp::config::tool`). A binary of its own, so the `epp` flags the
//! upstream charts pass stay exactly upstream's.
//!
//! ```text
//! epp-config check FILE [--allow-experimental-plugins]   # exit 1 when epp would refuse it
//! epp-config migrate FILE > v1.yaml
//! ```

use clap::{Parser, Subcommand};
use epp::config::tool;
use epp::config::LoadOptions;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "epp-config",
    about = "Check or migrate an EndpointPickerConfig"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Which upstream shape FILE is, every problem epp finds in it, and each plugin as epp
    /// decodes it (defaults filled in).
    Check {
        file: PathBuf,
        /// As epp's flag: accept alpha plugins.
        #[arg(long)]
        allow_experimental_plugins: bool,
    },
    /// FILE in llm-d v1.0's shape, on standard output.
    Migrate { file: PathBuf },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (Command::Check { file, .. } | Command::Migrate { file }) = &cli.command;
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("epp-config: reading {}: {e}", file.display());
            return ExitCode::from(2);
        }
    };
    match cli.command {
        Command::Check {
            allow_experimental_plugins,
            ..
        } => report(&tool::check(
            &text,
            LoadOptions {
                allow_experimental: allow_experimental_plugins,
            },
        )),
        Command::Migrate { .. } => match tool::migrate(&text) {
            Ok(v1) => {
                print!("{v1}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("epp-config: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

fn report(c: &tool::Checked) -> ExitCode {
    println!("shape: {}", c.shape);
    for n in &c.notes {
        println!("note: {n}");
    }
    for p in &c.problems {
        println!("problem: {p}");
    }
    for p in &c.plugins {
        println!("plugin: {p}");
    }
    if c.problems.is_empty() {
        println!("ok: epp loads it");
        ExitCode::SUCCESS
    } else {
        println!("{} problem(s): epp refuses it", c.problems.len());
        ExitCode::FAILURE
    }
}
