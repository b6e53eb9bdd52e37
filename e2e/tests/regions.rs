//! Routing that prices the network (issue 36): epp's hub with `network-cost-scorer` over the
//! regions of `loadgen::bench::regions`' test bed (each region its own pod, spoke epp and
//! Envoy, 40 ms and 280 ms from the hub through delaying proxies on the data path and the
//! scrapes). The scenarios: one region saturated (near while near is cheaper, far once near's
//! queue costs more than the extra round trip, near again when it drains), a session spanning
//! a spillover (its turns stay where its cache is), and one region lost under load (only the
//! requests in flight there fail).

use std::time::{Duration, Instant};

use harness::client;
use http::Method;
use loadgen::bench::regions::{self, Bed, HubPolicy, NetworkCost, RegionSpec, Traffic};
use loadgen::workload::Workload;

use crate::multicluster::scratch;

/// The near (40 ms) and far (280 ms) regions, one pod each.
fn near_and_far() -> [RegionSpec; 2] {
    let region = |name: &str, ms| RegionSpec {
        name: name.into(),
        rtt: Duration::from_millis(ms),
        pods: 1,
    };
    [region("near", 40), region("far", 280)]
}

async fn bed(name: &str, cost: NetworkCost) -> (Bed, std::path::PathBuf) {
    let dir = scratch(name);
    let engine = regions::engine(harness::sim_pod::TEST_MODEL, 4);
    let hub = HubPolicy::EppNetworkCost(cost);
    let bed = Bed::start(&near_and_far(), &engine, hub, None, &dir)
        .await
        .unwrap_or_else(|e| panic!("starting the bed: {e}"));
    (bed, dir)
}

/// The region (by name) of the pod that served one completion of `prompt` through the hub.
async fn served_region(bed: &Bed, prompt: &str) -> anyhow::Result<String> {
    let body = serde_json::json!({
        "model": harness::sim_pod::TEST_MODEL,
        "prompt": prompt,
        "max_tokens": 1,
    });
    let resp = client::send(
        bed.hub.listener(),
        client::request(Method::POST, "/v1/completions", body.to_string())?,
    )
    .await?;
    anyhow::ensure!(resp.status.is_success(), "status {}", resp.status);
    let pod = resp.header("x-inference-pod").unwrap_or_default();
    let region = bed.region_of(pod).map(|i| bed.regions[i].name.clone());
    region.ok_or_else(|| anyhow::anyhow!("pod {pod:?} is in no region"))
}

/// Sends `prompt` until it is served in `region`, then checks the next three are too
/// (bounded: `within`).
async fn settles_in(bed: &Bed, prompt: &str, region: &str, within: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    while served_region(bed, prompt).await.ok().as_deref() != Some(region) {
        anyhow::ensure!(Instant::now() < deadline, "never served in {region}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for _ in 0..3 {
        anyhow::ensure!(
            served_region(bed, prompt).await? == region,
            "left {region} again"
        );
    }
    Ok(())
}

/// A short prompt: no whole block, so no region holds any of it.
const FRESH: &str = "hello";

/// Near while near is cheaper; far once near's queue (8 waiting: 40 + 850 ms against 280 +
/// 50 ms) costs more than the extra round trip; near again when it drains; far when near is
/// lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_cost_hub_spills_over_to_the_far_region_and_comes_back() {
    let (bed, dir) = bed("hub-regions", NetworkCost::default()).await;
    let near_pod = bed.regions[0].pods()[0].hook();
    let secs = Duration::from_secs(10);
    settles_in(&bed, FRESH, "near", secs).await.unwrap();
    near_pod.set_waiting(Some(8));
    settles_in(&bed, FRESH, "far", secs).await.unwrap();
    near_pod.set_waiting(Some(0));
    settles_in(&bed, FRESH, "near", secs).await.unwrap();
    bed.regions[0].cut();
    settles_in(&bed, FRESH, "far", secs).await.unwrap();
    bed.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A conversation's prompt after `turns` turns: each turn appends ~30 tokens to the last.
fn conversation(turns: usize) -> String {
    let mut text = String::from("You are a careful assistant for a fleet of model servers. ");
    text.push_str(&"Answer briefly and cite the runbook section you used. ".repeat(40));
    for t in 1..=turns {
        text.push_str(&format!(
            "User turn {t}: how do I drain pod number {t} before its node is upgraded? \
             Assistant: cordon it, wait for its in-flight requests, then delete it. "
        ));
    }
    text
}

/// Sends turn after turn of the conversation until one is served in `region` (bounded:
/// `within`); returns the next turn's number.
async fn turn_until(bed: &Bed, mut turn: usize, region: &str, within: Duration) -> usize {
    let deadline = Instant::now() + within;
    loop {
        let got = served_region(bed, &conversation(turn))
            .await
            .unwrap_or_else(|e| panic!("turn {turn}: {e:#}"));
        turn += 1;
        if got == region {
            return turn;
        }
        assert!(Instant::now() < deadline, "turn {turn} still in {got}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A session spanning a spillover, priced with its cache (`idleTtftMs` 400: its prefill;
/// `multicluster-approx-prefix-cache-producer` on the hub). With 4 waiting near, a fresh prompt
/// costs 40 + 400 + 400 there against 280 + 400 far and spills, while the session's next turn,
/// ~90% cached near, costs 40 + 40 + 400 and stays. With 10 waiting near the session spills too,
/// and its next turn stays far (its cache is there now; near costs over 1 s). When near drains
/// the session comes back: near holds all but its last turns and is 240 ms nearer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_stays_where_its_cache_is_across_a_spillover() {
    let cost = NetworkCost {
        idle_ttft_ms: 400,
        prefix: true,
        ..NetworkCost::default()
    };
    let (bed, dir) = bed("hub-session", cost).await;
    let near_pod = bed.regions[0].pods()[0].hook();
    let secs = Duration::from_secs(10);
    settles_in(&bed, FRESH, "near", secs).await.unwrap();
    assert_eq!(served_region(&bed, &conversation(1)).await.unwrap(), "near");
    near_pod.set_waiting(Some(4));
    settles_in(&bed, FRESH, "far", secs).await.unwrap();
    for turn in 2..5 {
        let got = served_region(&bed, &conversation(turn)).await.unwrap();
        assert_eq!(
            got, "near",
            "turn {turn}: fresh prompts spill, the session stays"
        );
    }
    near_pod.set_waiting(Some(10));
    let next = turn_until(&bed, 5, "far", secs).await;
    for turn in next..next + 3 {
        let got = served_region(&bed, &conversation(turn)).await.unwrap();
        assert_eq!(
            got, "far",
            "turn {turn}: the session stays where its cache now is"
        );
    }
    near_pod.set_waiting(Some(0));
    turn_until(&bed, next + 3, "near", secs).await;
    bed.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// One region lost under a steady load of 5 requests per second (Poisson, shared-prefix
/// prompts, 128 tokens streamed: most requests are still streaming when the next arrives): the
/// near region, which takes every request while its queue is short, is cut 3 s in. Only
/// requests in flight there at the cut may fail; every request sent after it is served far.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_lost_under_load_fails_only_what_was_in_flight_there() {
    let (bed, dir) = bed("hub-loss", NetworkCost::default()).await;
    settles_in(&bed, FRESH, "near", Duration::from_secs(10))
        .await
        .unwrap();
    let traffic = Traffic {
        workload: Workload::SharedPrefix {
            groups: 4,
            prompts_per_group: 16,
            system_len: 128,
            question_len: 16,
            output_len: 128,
        },
        model: harness::sim_pod::TEST_MODEL.into(),
        seed: 36,
    };
    let secs = Duration::from_secs;
    let loss = regions::lose(&bed, 0, 5.0, secs(6), secs(3), &traffic).await;
    bed.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("{loss:?}");
    assert_eq!(loss.failed_after, 0, "sent after the cut and failed");
    assert!(
        loss.failed_in_flight <= loss.in_flight_there,
        "{} failed of {} in flight at the cut",
        loss.failed_in_flight,
        loss.in_flight_there
    );
    assert!(
        loss.after.sent >= 5,
        "too few sent after the cut: {}",
        loss.after.sent
    );
    assert_eq!(
        loss.after.cross_region, 1.0,
        "served near after near was lost"
    );
}
