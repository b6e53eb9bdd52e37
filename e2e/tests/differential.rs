//! The differential suite (issue 33): for each upstream plugin type both epp and llm-d-router
//! v0.10.0's EPP implement, one table-driven case ([`cases`]) run against both, the same
//! configuration file loaded by each, requests through a real Envoy ([`run`]); the outcomes
//! are compared request by request and the table ([`table`]) is written to
//! `docs/reference/differential.md`, which this test keeps current (`EPP_BLESS=1` rewrites it).
//! A difference fails the test unless the case records why it is kept on purpose.
//!
//! Needs Envoy (`hack/install-envoy.sh`) and llm-d's EPP: `hack/install-peers.sh llm-d-epp`
//! builds it from the v0.10.0 source archive, `EPP_LLMD_EPP` names it; `hack/test.sh` does both.

mod cases;
mod configs;
mod run;
mod table;

use std::path::Path;

use run::{Pods, Which};
use table::Row;

async fn compare(llmd: &Path, case: &cases::Case, dir: &Path) -> anyhow::Result<Row> {
    let pods = Pods::start(case, dir).await?;
    let config = pods.config_file(case)?;
    let epp = run::outcomes(Which::Epp, llmd, &pods, case, &config).await;
    let llm_d = run::outcomes(Which::Llmd, llmd, &pods, case, &config).await;
    pods.shutdown().await;
    let kind = ::epp::plugin::PluginKind::from_name(case.kind)
        .ok_or_else(|| anyhow::anyhow!("{} is not in epp's plugin registry", case.kind))?;
    Ok(Row {
        kind: case.kind,
        category: category_name(kind.category()),
        expect: case.expect,
        epp: epp?,
        llmd: llm_d?,
    })
}

fn category_name(c: ::epp::plugin::Category) -> String {
    format!("{c:?}").to_lowercase()
}

/// The types epp accepts: implemented as plugins or built in.
fn accepted() -> Vec<::epp::plugin::PluginKind> {
    ::epp::plugin::PluginKind::ALL
        .iter()
        .copied()
        .filter(|k| !matches!(k.support(), ::epp::plugin::Support::Unsupported(_)))
        .collect()
}

/// The accepted upstream types (epp's own are `Stable`) that neither have a case nor are
/// listed, with a reason, in [`cases::uncovered`].
fn unaccounted() -> Vec<&'static str> {
    let cased: Vec<&str> = cases::all().iter().map(|c| c.kind).collect();
    let listed: Vec<&str> = cases::uncovered().iter().map(|(k, _)| *k).collect();
    accepted()
        .into_iter()
        .filter(|k| k.stability() != ::epp::plugin::Stability::Stable)
        .map(|k| k.name())
        .filter(|n| !cased.contains(n) && !listed.contains(n))
        .collect()
}

/// Every accepted upstream type has a case or a reason for having none (no llm-d needed).
#[test]
fn every_accepted_upstream_type_has_a_case_or_a_reason() {
    assert_eq!(unaccounted(), Vec::<&str>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs llm-d-router v0.10's EPP (hack/install-peers.sh llm-d-epp): EPP_LLMD_EPP=/path/to/llm-d-epp cargo test -p epp-e2e --test e2e differential:: -- --ignored (hack/test.sh runs it)"]
async fn epp_and_llm_d_decide_alike_for_every_plugin_type_both_implement() {
    let llmd = harness::llmd_epp::binary_from_env().unwrap_or_else(|e| panic!("{e:#}"));
    let dir = std::env::temp_dir().join(format!("epp-differential-{}", std::process::id()));
    let mut rows = Vec::new();
    // EPP_DIFFERENTIAL_ONLY=type,type runs those cases alone (no table check): for a developer.
    let only: Option<Vec<String>> = std::env::var("EPP_DIFFERENTIAL_ONLY")
        .ok()
        .map(|v| v.split(',').map(str::to_owned).collect());
    let wanted = |c: &cases::Case| only.as_ref().is_none_or(|o| o.iter().any(|k| k == c.kind));
    for case in cases::all().into_iter().filter(wanted) {
        let case_dir = dir.join(case.kind);
        std::fs::create_dir_all(&case_dir).expect("creating the case's directory");
        let row = compare(&llmd, &case, &case_dir)
            .await
            .unwrap_or_else(|e| panic!("{}: {e:#}", case.kind));
        eprintln!(
            "{}: differing {:?}\n  epp:   {:?}\n  llm-d: {:?}",
            row.kind,
            row.differing(),
            row.epp,
            row.llmd
        );
        rows.push(row);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let text = table::render(&rows, accepted().len(), &cases::uncovered());
    println!("{text}");
    let problems: Vec<String> = rows.iter().filter_map(Row::problem).collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    if only.is_none() {
        table::check_or_bless(&text);
    }
}
