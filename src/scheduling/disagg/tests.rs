//! The handlers through [`crate::scheduling::build`]: upstream's P/D configurations load and
//! route as upstream describes.

use super::*;
use crate::config;
use crate::scheduling::filter::ROLE_LABEL;
use crate::scheduling::testing::labelled;
use crate::scheduling::{build, build_with};
use rand::{rngs::SmallRng, SeedableRng};
use std::collections::BTreeMap;

fn example(name: &str) -> String {
    let path = format!("{}/config/examples/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn sched(text: &str) -> Scheduler {
    build(&config::parse(text).unwrap()).unwrap_or_else(|e| panic!("{e:?}"))
}

fn problems(text: &str) -> String {
    let errs = build(&config::parse(text).unwrap()).unwrap_err();
    errs.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Two decode pods (ports 1, 2), two prefill pods (3, 4), blocks held per pod.
fn pool(held: [usize; 4]) -> Vec<Candidate> {
    let roles = ["decode", "decode", "prefill", "prefill"];
    (0..4)
        .map(|i| {
            let mut c = labelled(i as u16 + 1, &[(ROLE_LABEL, roles[i])]);
            c.prefix_blocks = held[i];
            c
        })
        .collect()
}

fn req(prompt: usize) -> SchedulingRequest<'static> {
    SchedulingRequest {
        target_model: "m",
        prompt_tokens: prompt,
        prefix_total_blocks: prompt / 16,
        block_size: 16,
        ..Default::default()
    }
}

fn port(id: EndpointId) -> u16 {
    id.0.port()
}

#[test]
fn the_p_d_guide_config_loads_and_splits_a_long_prompt() {
    let s = sched(&example("llm-d-pd.yaml"));
    assert!(s.reads_labels() && s.reads_prompt_length());
    assert_eq!(
        s.prefix_params().unwrap().max_prefix_tokens_to_match,
        16_384
    );
    let mut rng = SmallRng::seed_from_u64(1);
    let d = s.schedule(&req(1_000), &pool([0; 4]), &mut rng).unwrap();
    assert!(
        [1, 2].contains(&port(d.endpoints[0])),
        "decode is the destination"
    );
    let out = d.disagg.unwrap();
    assert_eq!(out.decision, DisaggDecision::PrefillDecode);
    assert_eq!(out.kind, PluginKind::DisaggProfileHandler);
    assert_eq!(&*out.handler, "disagg-profile-handler");
    let prefill = out.prefill.unwrap();
    assert!([3, 4].contains(&port(prefill)));
    assert_eq!(
        out.headers(),
        vec![
            (PREFILLER_HEADER, Some(prefill.to_string())),
            (ENCODERS_HEADER, None)
        ]
    );
}

#[test]
fn a_prompt_the_decode_pod_holds_skips_prefill() {
    let s = sched(&example("llm-d-pd.yaml"));
    let mut rng = SmallRng::seed_from_u64(2);
    // The decode pod on port 2 holds 62 of the prompt's 1,000 tokens' blocks: 8 uncached.
    let d = s
        .schedule(&req(1_000), &pool([0, 62, 0, 0]), &mut rng)
        .unwrap();
    assert_eq!(
        port(d.endpoints[0]),
        2,
        "the prefix scorer picks the holder"
    );
    let out = d.disagg.unwrap();
    assert_eq!(out.decision, DisaggDecision::DecodeOnly);
    assert_eq!(out.prefill_approved, Some(false));
    assert_eq!(out.headers()[0], (PREFILLER_HEADER, None), "removed");
}

#[test]
fn no_prefill_pods_serve_decode_only() {
    let s = sched(&example("llm-d-pd.yaml"));
    let mut rng = SmallRng::seed_from_u64(3);
    let decode_only = &pool([0; 4])[..2];
    let d = s.schedule(&req(1_000), decode_only, &mut rng).unwrap();
    let out = d.disagg.unwrap();
    assert_eq!(out.decision, DisaggDecision::DecodeOnly);
    assert_eq!(out.prefill_approved, Some(true));
    assert_eq!(out.skipped, Some(SkipReason::NoPrefillEndpoint));
}

#[test]
fn stale_prefill_pods_are_skipped_but_no_decode_pod_fails_the_request() {
    let s = sched(&example("llm-d-pd.yaml"));
    let mut rng = SmallRng::seed_from_u64(4);
    let mut cands = pool([0; 4]);
    cands[2].fresh = false;
    cands[3].fresh = false;
    let out = s
        .schedule(&req(1_000), &cands, &mut rng)
        .unwrap()
        .disagg
        .unwrap();
    assert_eq!(out.skipped, Some(SkipReason::PrefillEndpointsStale));
    assert_eq!(out.prefill, None);
    cands[3].fresh = true;
    let out = s
        .schedule(&req(1_000), &cands, &mut rng)
        .unwrap()
        .disagg
        .unwrap();
    assert_eq!(out.prefill.map(port), Some(4), "the fresh one");
    let prefill_only = &pool([0; 4])[2..];
    assert_eq!(
        s.schedule(&req(1_000), prefill_only, &mut rng),
        Err(ScheduleError::AllFiltered)
    );
}

#[test]
fn a_saturated_prefill_pod_is_never_chosen_and_all_saturated_serves_decode_only() {
    let s = sched(&example("llm-d-pd.yaml"));
    let mut rng = SmallRng::seed_from_u64(5);
    // The prefix scorer prefers port 3 (it holds the prompt); saturated, it is passed over.
    let cands = pool([0, 0, 40, 0]);
    let ids: Vec<EndpointId> = cands.iter().map(|c| c.id).collect();
    for seed in 0..20 {
        let mut rng = SmallRng::seed_from_u64(seed);
        let sat = [ids[2]];
        let r = SchedulingRequest {
            saturated: &sat,
            ..req(1_000)
        };
        let out = s.schedule(&r, &cands, &mut rng).unwrap().disagg.unwrap();
        assert_eq!(out.prefill.map(port), Some(4), "seed {seed}");
        assert_eq!(out.skipped, None);
    }
    let unsaturated = s.schedule(&req(1_000), &cands, &mut rng).unwrap();
    assert_eq!(unsaturated.disagg.unwrap().prefill.map(port), Some(3));
    // Both prefill pods saturated, the decode pods not: decode-only, with the reason.
    let sat = [ids[2], ids[3]];
    let r = SchedulingRequest {
        saturated: &sat,
        ..req(1_000)
    };
    let d = s.schedule(&r, &cands, &mut rng).unwrap();
    assert!([1, 2].contains(&port(d.endpoints[0])));
    let out = d.disagg.unwrap();
    assert_eq!(out.decision, DisaggDecision::DecodeOnly);
    assert_eq!(out.prefill_approved, Some(true));
    assert_eq!(out.skipped, Some(SkipReason::PrefillEndpointsSaturated));
    assert_eq!(out.headers()[0], (PREFILLER_HEADER, None));
    // Saturated decode pods are still the destination: the decode stage is not gated here
    // (admission and flow control are, over the decode pods).
    let sat = [ids[0], ids[1]];
    let r = SchedulingRequest {
        saturated: &sat,
        ..req(1_000)
    };
    let out = s.schedule(&r, &cands, &mut rng).unwrap().disagg.unwrap();
    assert_eq!(out.decision, DisaggDecision::PrefillDecode);
}

#[test]
fn a_stale_prefill_pool_is_reported_stale_before_saturated() {
    let s = sched(&example("llm-d-pd.yaml"));
    let mut rng = SmallRng::seed_from_u64(6);
    let mut cands = pool([0; 4]);
    cands[2].fresh = false;
    let sat = [cands[3].id];
    let r = SchedulingRequest {
        saturated: &sat,
        ..req(1_000)
    };
    let out = s.schedule(&r, &cands, &mut rng).unwrap().disagg.unwrap();
    assert_eq!(
        out.skipped,
        Some(SkipReason::PrefillEndpointsSaturated),
        "one stale, the fresh one saturated"
    );
    cands[3].fresh = false;
    let out = s.schedule(&r, &cands, &mut rng).unwrap().disagg.unwrap();
    assert_eq!(out.skipped, Some(SkipReason::PrefillEndpointsStale));
}

#[test]
fn the_decode_profiles_label_filters_name_the_destinations() {
    let s = sched(&example("llm-d-pd.yaml"));
    let role = |v: &str| {
        [(ROLE_LABEL.to_owned(), v.to_owned())]
            .into_iter()
            .collect()
    };
    assert!(s.keeps_labels(&role("decode")));
    assert!(s.keeps_labels(&role("prefill-decode")));
    assert!(
        s.keeps_labels(&BTreeMap::new()),
        "an unlabelled pod decodes"
    );
    assert!(!s.keeps_labels(&role("prefill")));
    assert!(!s.keeps_labels(&role("encode")));
}

#[test]
fn unlabelled_pods_decode_and_unknown_roles_are_excluded() {
    let s = sched(&example("llm-d-pd.yaml"));
    let mut rng = SmallRng::seed_from_u64(5);
    let cands = [
        labelled(1, &[(ROLE_LABEL, "decoder")]),
        labelled(2, &[]),
        labelled(3, &[(ROLE_LABEL, "prefill-decode")]),
    ];
    for _ in 0..20 {
        let d = s.schedule(&req(1_000), &cands, &mut rng).unwrap();
        assert_ne!(port(d.endpoints[0]), 1, "unknown role value");
        assert_ne!(d.disagg.unwrap().prefill.map(port), Some(1));
    }
}

#[test]
fn the_e_pd_config_encodes_only_multimodal_requests() {
    let s = sched(&example("llm-d-e-pd.yaml"));
    let mut rng = SmallRng::seed_from_u64(6);
    let cands = [
        labelled(1, &[(ROLE_LABEL, "decode")]),
        labelled(2, &[(ROLE_LABEL, "encode")]),
    ];
    let text = s.schedule(&req(100), &cands, &mut rng).unwrap();
    assert_eq!(text.disagg.unwrap().decision, DisaggDecision::DecodeOnly);
    let mm = SchedulingRequest {
        multimodal: true,
        ..req(100)
    };
    let d = s.schedule(&mm, &cands, &mut rng).unwrap();
    assert_eq!(port(d.endpoints[0]), 1);
    let out = d.disagg.unwrap();
    assert_eq!(out.decision, DisaggDecision::EncodeDecode);
    assert_eq!(
        out.headers()[1],
        (ENCODERS_HEADER, Some(cands[1].id.to_string()))
    );
}

const PD_HEAD: &str = "apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefill-filter
- type: decode-filter
- type: max-score-picker
";

const PD_PROFILES: &str = "schedulingProfiles:
- name: prefill
  plugins: [{pluginRef: prefill-filter}]
- name: decode
  plugins: [{pluginRef: decode-filter}]
";

#[test]
fn prefill_first_runs_prefill_without_a_decider() {
    let text = format!(
        "{PD_HEAD}- type: disagg-profile-handler\n  parameters: {{stageOrder: prefill-first}}\n{PD_PROFILES}"
    );
    let s = sched(&text);
    let mut rng = SmallRng::seed_from_u64(7);
    let out = s
        .schedule(&req(10), &pool([0; 4]), &mut rng)
        .unwrap()
        .disagg
        .unwrap();
    assert_eq!(out.decision, DisaggDecision::PrefillDecode);
    assert_eq!(out.prefill_approved, None);
}

#[test]
fn the_deprecated_pd_profile_handler_runs_its_default_decider() {
    let text = format!(
        "{PD_HEAD}- type: prefix-based-pd-decider\n  parameters: {{nonCachedTokens: 16}}\n- type: pd-profile-handler\n  parameters: {{prefixPluginType: prefix-cache-scorer}}\n- type: prefill-header-handler\n{PD_PROFILES}"
    );
    let s = sched(&text);
    let mut rng = SmallRng::seed_from_u64(8);
    let out = s
        .schedule(&req(1_000), &pool([0; 4]), &mut rng)
        .unwrap()
        .disagg
        .unwrap();
    assert_eq!(out.kind, PluginKind::PdProfileHandler);
    assert_eq!(out.decision, DisaggDecision::PrefillDecode);
    // Without the decider plugin its default name refers to nothing.
    let text = format!("{PD_HEAD}- type: pd-profile-handler\n{PD_PROFILES}");
    let err = problems(&text);
    assert!(
        err.contains("references undefined plugin \"prefix-based-pd-decider\""),
        "{err}"
    );
}

#[test]
fn no_decider_means_decode_only_and_a_decoder_free_handler_is_decode_only_too() {
    let text = format!("{PD_HEAD}- type: disagg-profile-handler\n{PD_PROFILES}");
    let s = sched(&text);
    let mut rng = SmallRng::seed_from_u64(9);
    let out = s
        .schedule(&req(10_000), &pool([0; 4]), &mut rng)
        .unwrap()
        .disagg
        .unwrap();
    assert_eq!(out.decision, DisaggDecision::DecodeOnly);
    assert_eq!(out.prefill_approved, None);
}

#[test]
fn handler_configuration_errors_name_the_plugin_and_field() {
    let missing_decode = format!(
        "{PD_HEAD}- type: disagg-profile-handler\n  parameters: {{profiles: {{decode: dec}}}}\n{PD_PROFILES}"
    );
    let err = problems(&missing_decode);
    assert!(err.contains("no scheduling profile named \"dec\""), "{err}");
    let not_decider = format!(
        "{PD_HEAD}- type: disagg-profile-handler\n  parameters: {{deciders: {{prefill: max-score-picker}}}}\n{PD_PROFILES}"
    );
    let err = problems(&not_decider);
    assert!(
        err.contains("deciders.prefill: plugin \"max-score-picker\" is not a decider"),
        "{err}"
    );
    let unknown = format!(
        "{PD_HEAD}- type: disagg-profile-handler\n  parameters: {{deciders: {{encode: mm}}}}\n{PD_PROFILES}"
    );
    let err = problems(&unknown);
    assert!(
        err.contains("deciders.encode references undefined plugin \"mm\""),
        "{err}"
    );
    let two_profiles = format!("{PD_HEAD}{PD_PROFILES}");
    let err = problems(&two_profiles);
    assert!(err.contains("need a profile handler"), "{err}");
}

#[test]
fn the_cost_based_example_loads_and_keeps_short_suffixes_local() {
    let s = build_with(
        &config::parse(&example("pd-cost-based.yaml")).unwrap(),
        config::LoadOptions::default(),
    )
    .unwrap();
    let mut rng = SmallRng::seed_from_u64(10);
    let mut cands = pool([0; 4]);
    for c in &mut cands[..2] {
        c.running = 32.0;
    }
    let out = s
        .schedule(&req(8_000), &cands, &mut rng)
        .unwrap()
        .disagg
        .unwrap();
    assert_eq!(out.decision, DisaggDecision::PrefillDecode);
    // Both decode pods hold 499 of 500 blocks: a 16-token suffix stays on the decode pod.
    let mut cached = pool([499, 499, 0, 0]);
    for c in &mut cached[..2] {
        c.running = 32.0;
    }
    let out = s
        .schedule(&req(8_000), &cached, &mut rng)
        .unwrap()
        .disagg
        .unwrap();
    assert_eq!(out.decision, DisaggDecision::DecodeOnly);
}

#[test]
fn p2p_source_names_a_richer_peer_for_the_prefill_pod_and_needs_the_experimental_flag() {
    let text = example("llm-d-pd.yaml").replace(
        "- type: prefix-cache-scorer",
        "- type: p2p-source-producer\n- type: prefix-cache-scorer",
    );
    let doc = config::parse(&text).unwrap();
    let err = build(&doc).unwrap_err();
    assert!(
        err[0].to_string().contains("Alpha stability level"),
        "{err:?}"
    );
    let load = config::LoadOptions {
        allow_experimental: true,
    };
    let s = build_with(&doc, load).unwrap();
    let mut rng = SmallRng::seed_from_u64(11);
    // Decode pod 1 holds 40 blocks (360 uncached tokens: P/D), the prefill pods none: the
    // prefill pod should pull 640 tokens from pod 1 rather than compute them.
    let d = s
        .schedule(&req(1_000), &pool([40, 0, 0, 0]), &mut rng)
        .unwrap();
    let out = d.disagg.clone().unwrap();
    assert_eq!(out.decision, DisaggDecision::PrefillDecode);
    assert_eq!(port(d.endpoints[0]), 1);
    let source = Some("10.0.0.1:1".to_owned());
    assert!(
        d.headers.contains(&(KV_SOURCE_HEADER, source)),
        "{:?}",
        d.headers
    );
    assert!(d
        .headers
        .contains(&(PREFILLER_HEADER, out.prefill.map(|p| p.to_string()))));
}

/// Decode pods on hosts n1 (port 1) and n2 (2), prefill pods on n2 (3) and n1 (4).
fn hosts() -> Vec<Candidate> {
    let at = [
        ("decode", "n1"),
        ("decode", "n2"),
        ("prefill", "n2"),
        ("prefill", "n1"),
    ];
    (0..4)
        .map(|i| {
            let (role, host) = at[i];
            labelled(
                i as u16 + 1,
                &[(ROLE_LABEL, role), ("kubernetes.io/hostname", host)],
            )
        })
        .collect()
}

/// The topology plugins see the earlier stage's pick as the peer: decode-first, the prefill
/// stage keeps the prefill pods on the decode pick's host; prefill-first, the decode stage
/// prefers the decode pods on the prefill pick's host.
#[test]
fn the_topology_plugins_compare_with_the_other_stages_pick() {
    let decode_first = format!(
        "{PD_HEAD}- type: random-picker\n- type: always-disagg-pd-decider\n- type: topology-extractor\n- type: topology-affinity-filter\n- type: disagg-profile-handler\n  parameters: {{deciders: {{prefill: always-disagg-pd-decider}}}}\nschedulingProfiles:\n- name: prefill\n  plugins: [{{pluginRef: prefill-filter}}, {{pluginRef: topology-affinity-filter}}, {{pluginRef: random-picker}}]\n- name: decode\n  plugins: [{{pluginRef: decode-filter}}, {{pluginRef: random-picker}}]\n"
    );
    let alpha = |text: &str| {
        let load = config::LoadOptions {
            allow_experimental: true,
        };
        build_with(&config::parse(text).unwrap(), load).unwrap_or_else(|e| panic!("{e:?}"))
    };
    let s = alpha(&decode_first);
    assert!(s.reads_labels());
    let mut rng = SmallRng::seed_from_u64(3);
    for _ in 0..20 {
        let d = s.schedule(&req(100), &hosts(), &mut rng).unwrap();
        let prefill = port(d.disagg.unwrap().prefill.unwrap());
        let decode = port(d.endpoints[0]);
        assert_eq!(prefill, if decode == 1 { 4 } else { 3 }, "same host");
    }
    let prefill_first = format!(
        "{PD_HEAD}- type: random-picker\n- {{name: topo, type: topology-extractor}}\n- {{type: topology-affinity-scorer, parameters: {{topologyProducerName: topo}}}}\n- type: disagg-profile-handler\n  parameters: {{stageOrder: prefill-first}}\nschedulingProfiles:\n- name: prefill\n  plugins: [{{pluginRef: prefill-filter}}, {{pluginRef: random-picker}}]\n- name: decode\n  plugins: [{{pluginRef: decode-filter}}, {{pluginRef: topology-affinity-scorer}}, {{pluginRef: max-score-picker}}]\n"
    );
    let s = alpha(&prefill_first);
    for _ in 0..20 {
        let d = s.schedule(&req(100), &hosts(), &mut rng).unwrap();
        let prefill = port(d.disagg.unwrap().prefill.unwrap());
        assert_eq!(port(d.endpoints[0]), if prefill == 4 { 1 } else { 2 });
    }
}
