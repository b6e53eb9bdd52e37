//! docs/reference/flags.md: every flag of `epp`, from the clap definition (`epp::app::Options`).

use super::{cell, GENERATED};
use clap::{ArgAction, CommandFactory};
use epp::app::Options;
use std::fmt::Write;

/// Every long flag name, in definition order.
pub fn longs() -> Vec<String> {
    Options::command()
        .get_arguments()
        .filter_map(|a| a.get_long().map(str::to_owned))
        .collect()
}

pub fn page() -> String {
    let cmd = Options::command();
    let mut out = String::new();
    writeln!(out, "{GENERATED}\n").unwrap();
    writeln!(out, "# `epp` flags\n").unwrap();
    writeln!(
        out,
        "Every flag of `epp` ({} in all), in the order `epp --help` lists them. Boolean flags \
         take `--flag`, `--flag=true` or `--flag=false`; durations take Go's form (`200ms`, \
         `1m30s`). Hidden flags are epp's own tuning knobs, accepted but left out of `--help`.\n",
        longs().len()
    )
    .unwrap();
    writeln!(out, "| flag | value | default | description |").unwrap();
    writeln!(out, "|---|---|---|---|").unwrap();
    for arg in cmd.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        let help = arg
            .get_long_help()
            .or(arg.get_help())
            .map(|h| h.to_string())
            .unwrap_or_default();
        let hidden = if arg.is_hide_set() { " (hidden)" } else { "" };
        writeln!(
            out,
            "| `--{long}`{hidden} | {} | {} | {} |",
            value(arg),
            default(arg),
            cell(&help)
        )
        .unwrap();
    }
    out
}

/// What the flag takes: nothing, a boolean, one value or a list.
fn value(arg: &clap::Arg) -> String {
    match arg.get_action() {
        ArgAction::SetTrue | ArgAction::SetFalse => "none".into(),
        ArgAction::Help | ArgAction::Version => "none".into(),
        _ => {
            let name = arg
                .get_value_names()
                .and_then(|n| n.first().map(|s| s.to_string()))
                .unwrap_or_else(|| arg.get_id().to_string().to_uppercase());
            let bool_like = arg
                .get_num_args()
                .is_some_and(|r| r.min_values() == 0 && r.max_values() == 1);
            if bool_like {
                "bool".into()
            } else if arg.get_value_delimiter().is_some() {
                format!("`{name}[,{name}...]`")
            } else if matches!(arg.get_action(), ArgAction::Append) {
                format!("`{name}` (repeatable)")
            } else {
                format!("`{name}`")
            }
        }
    }
}

fn default(arg: &clap::Arg) -> String {
    let values: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    match values.as_slice() {
        [] => "—".into(),
        [v] if v.is_empty() => "`\"\"`".into(),
        _ => format!("`{}`", cell(&values.join(","))),
    }
}
