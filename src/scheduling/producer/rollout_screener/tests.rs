use super::*;
use crate::config::plugin::params;
use crate::scheduling::lifecycle::NO_HEADERS;
use crate::scheduling::testing::labelled;
use crate::scheduling::{Decision, SchedulingRequest};

const REV: &str = "disaggregatedset.x-k8s.io/revision";
const ROLE: &str = "disaggregatedset.x-k8s.io/role";
const SET: &str = "disaggregatedset.x-k8s.io/name";

fn screener(yaml: &str) -> Result<RolloutScreener, String> {
    let v: serde_norway::Value = serde_norway::from_str(yaml).unwrap();
    let p: RolloutScreener = params(&v).map_err(|e| e.to_string())?;
    p.validate().map_err(|e| e.message)
}

const MAX_ROLE: &str = "
scope: {labelSelector: 'disaggregatedset.x-k8s.io/name=my-set'}
headerSelectors:
- {name: revision, headerName: X-Disagg-Revision, labelKey: disaggregatedset.x-k8s.io/revision, mode: strict}
- {name: slice, headerName: x-disagg-slice, labelKey: disaggregatedset.x-k8s.io/slice, mode: prefer}
revisionGating: {mode: max-role, requireRoles: {values: [prefill, decode]}}
";

/// A pod of the set: (revision, role).
fn pod(rev: &str, role: &str) -> BTreeMap<String, String> {
    [(SET, "my-set"), (REV, rev), (ROLE, role)]
        .iter()
        .map(|(k, v)| ((*k).into(), (*v).into()))
        .collect()
}

/// The README's 2P:10D example mid-rollout: A has 2 prefill and 9 decode, B 1 and 1.
fn example() -> Vec<BTreeMap<String, String>> {
    let mut pods = Vec::new();
    for (rev, prefill, decode) in [("A", 2, 9), ("B", 1, 1)] {
        pods.extend((0..prefill).map(|_| pod(rev, "prefill")));
        pods.extend((0..decode).map(|_| pod(rev, "decode")));
    }
    pods
}

fn candidates(revs: &[&str]) -> Vec<Candidate> {
    revs.iter()
        .enumerate()
        .map(|(i, rev)| {
            labelled(
                8000 + i as u16,
                &[(SET, "my-set"), (REV, rev), (ROLE, "decode")],
            )
        })
        .collect()
}

fn screen(
    s: &RolloutScreener,
    pods: &[BTreeMap<String, String>],
    headers: &Headers,
    draw: f64,
    revs: &[&str],
) -> Vec<String> {
    let population: Vec<_> = pods.iter().collect();
    let screening = Screening {
        headers,
        population: &population,
        draw,
    };
    let mut c = candidates(revs);
    s.screen(&screening, &mut c);
    c.iter()
        .map(|c| c.labels.get(REV).cloned().unwrap_or_default())
        .collect()
}

#[test]
fn weights_follow_the_dominant_role_or_the_sum_as_upstreams_readme() {
    let pods = example();
    let pods: Vec<_> = pods.iter().collect();
    let max_role = screener(MAX_ROLE).unwrap();
    let shares = max_role.shares(&pods);
    assert!(
        (shares["A"] - 0.9).abs() < 1e-9 && (shares["B"] - 0.1).abs() < 1e-9,
        "{shares:?}"
    );
    let sum = screener(&MAX_ROLE.replace("max-role", "sum")).unwrap();
    let shares = sum.shares(&pods);
    assert!((shares["A"] - 11.0 / 13.0).abs() < 1e-9, "{shares:?}");
    assert!((shares["B"] - 2.0 / 13.0).abs() < 1e-9, "{shares:?}");
}

#[test]
fn a_revision_missing_a_role_gets_no_traffic_and_pods_outside_the_scope_do_not_count() {
    let mut pods = vec![pod("A", "prefill"), pod("A", "decode"), pod("B", "decode")];
    let mut stranger = pod("B", "prefill");
    stranger.insert(SET.into(), "other-set".into());
    pods.push(stranger);
    let s = screener(MAX_ROLE).unwrap();
    for draw in [0.0, 0.5, 0.99] {
        assert_eq!(
            screen(&s, &pods, &NO_HEADERS, draw, &["A", "B", "A"]),
            ["A", "A"]
        );
    }
    assert_eq!(
        screen(&s, &pods, &NO_HEADERS, 0.5, &["B"]),
        Vec::<String>::new()
    );
}

#[test]
fn the_draw_picks_one_revision_by_cumulative_share_in_byte_order() {
    let s = screener(MAX_ROLE).unwrap();
    let pods = example();
    let revs = ["B", "A", "B", ""];
    assert_eq!(screen(&s, &pods, &NO_HEADERS, 0.0, &revs), ["A"]);
    assert_eq!(screen(&s, &pods, &NO_HEADERS, 0.899, &revs), ["A"]);
    assert_eq!(screen(&s, &pods, &NO_HEADERS, 0.901, &revs), ["B", "B"]);
    // Only B among the candidates: its share alone is the whole.
    assert_eq!(screen(&s, &pods, &NO_HEADERS, 0.95, &["B"]), ["B"]);
}

#[test]
fn a_strict_header_pins_the_revision_instead_of_the_draw_and_fails_closed() {
    let s = screener(MAX_ROLE).unwrap();
    let pods = example();
    let b = Headers::of(&[("x-disagg-revision", "B")]);
    assert_eq!(
        s.headers(),
        ["x-disagg-revision"],
        "only strict selectors are read"
    );
    assert_eq!(screen(&s, &pods, &b, 0.0, &["A", "B"]), ["B"]);
    let gone = Headers::of(&[("x-disagg-revision", "C")]);
    assert_eq!(
        screen(&s, &pods, &gone, 0.0, &["A", "B"]),
        Vec::<String>::new()
    );
    let empty = Headers::of(&[("x-disagg-revision", "")]);
    assert_eq!(
        screen(&s, &pods, &empty, 0.0, &["A", "B"]),
        ["A"],
        "an empty header is none"
    );
}

#[test]
fn disabled_gating_keeps_every_candidate_but_still_applies_strict_selectors() {
    let s = screener(&MAX_ROLE.replace("mode: max-role", "mode: disabled")).unwrap();
    let none: Vec<BTreeMap<String, String>> = Vec::new();
    assert_eq!(
        screen(&s, &none, &NO_HEADERS, 0.0, &["A", "B", ""]),
        ["A", "B", ""]
    );
    let b = Headers::of(&[("x-disagg-revision", "B")]);
    assert_eq!(screen(&s, &none, &b, 0.0, &["A", "B"]), ["B"]);
}

#[test]
fn the_response_carries_every_selectors_label_of_the_served_endpoint() {
    let s = screener(MAX_ROLE).unwrap();
    let served = labelled(
        8001,
        &[(REV, "B"), ("disaggregatedset.x-k8s.io/slice", "s1")],
    );
    let other = labelled(8002, &[(REV, "A")]);
    let cands = [other, served.clone()];
    let decision = Decision {
        endpoints: vec![served.id],
        scores: vec![],
        disagg: None,
        headers: vec![],
        port: None,
    };
    let request = SchedulingRequest::default();
    let placed = Placed {
        id: 0,
        request: &request,
        candidates: &cands,
        decision: &decision,
        primary: served.id,
        prefill: None,
        now: request.now,
    };
    let mut out = Vec::new();
    s.response_headers(&placed, &mut out);
    assert_eq!(
        out,
        [
            ("x-disagg-revision".to_owned(), "B".to_owned()),
            ("x-disagg-slice".to_owned(), "s1".to_owned())
        ]
    );
}

#[test]
fn ties_between_roles_go_to_the_first_listed() {
    // decode and prefill both total 2: prefill is listed first, so A (2 prefill) takes all.
    let pods = [
        pod("A", "prefill"),
        pod("A", "prefill"),
        pod("A", "decode"),
        pod("B", "decode"),
        pod("B", "prefill"),
    ];
    let pods: Vec<_> = pods.iter().collect();
    let yaml = MAX_ROLE.replace("[prefill, decode]", "[decode, prefill]");
    let decode_first = screener(&yaml).unwrap().shares(&pods);
    assert_eq!(
        decode_first.get("A"),
        Some(&(2.0 / 3.0)),
        "prefill totals 3, decode 2"
    );
    let pods = [
        pod("A", "prefill"),
        pod("A", "decode"),
        pod("A", "decode"),
        pod("B", "prefill"),
        pod("B", "prefill"),
        pod("B", "decode"),
    ];
    let pods: Vec<_> = pods.iter().collect();
    let shares = screener(&yaml).unwrap().shares(&pods);
    assert_eq!(
        shares.get("A"),
        Some(&(2.0 / 3.0)),
        "a 3:3 tie: decode, listed first, weighs"
    );
    let shares = screener(MAX_ROLE).unwrap().shares(&pods);
    assert_eq!(
        shares.get("A"),
        Some(&(1.0 / 3.0)),
        "a 3:3 tie: prefill, listed first, weighs"
    );
}

#[test]
fn bad_parameters_are_refused_with_upstreams_messages() {
    let gating = "revisionGating: {mode: sum, requireRoles: {values: [decode]}}";
    let cases = [
        (format!("{{{gating}}}"), "scope.labelSelector is required"),
        (format!("{{scope: {{labelSelector: 'a in (b'}}, {gating}}}"), "scope.labelSelector is not a valid label selector"),
        ("{scope: {labelSelector: a=b}}".to_owned(), "revisionGating is required"),
        ("{scope: {labelSelector: a=b}, revisionGating: {mode: fast}}".to_owned(), "revisionGating.mode \"fast\" must be one of sum|max-role|disabled"),
        ("{scope: {labelSelector: a=b}, revisionGating: {mode: sum}}".to_owned(), "revisionGating.requireRoles is required when revisionGating.mode=sum"),
        ("{scope: {labelSelector: a=b}, revisionGating: {mode: sum, requireRoles: {values: []}}}".to_owned(), "revisionGating.requireRoles.values must contain at least one role"),
        ("{scope: {labelSelector: a=b}, revisionGating: {mode: sum, requireRoles: {values: [d, d]}}}".to_owned(), "revisionGating.requireRoles.values contains duplicate role \"d\""),
        (format!("{{scope: {{labelSelector: a=b}}, {gating}, headerSelectors: [{{name: n, headerName: h, labelKey: k, mode: soft}}]}}"), "headerSelectors[0].mode \"soft\" must be one of strict|prefer"),
        (format!("{{scope: {{labelSelector: a=b}}, {gating}, headerSelectors: [{{name: n, labelKey: k, mode: strict}}]}}"), "headerSelectors[0].headerName is required"),
        (format!("{{scope: {{labelSelector: a=b}}, {gating}, headerSelectors: [{{name: n, headerName: H, labelKey: k, mode: strict}}, {{name: m, headerName: h, labelKey: k, mode: strict}}]}}"), "headerSelectors: duplicate headerName \"h\""),
    ];
    for (yaml, want) in cases {
        let err = screener(&yaml).unwrap_err();
        assert!(err.starts_with(want), "{yaml}: {err}");
    }
    let err = screener("{scope: {labelSelector: a=b, extra: 1}}").unwrap_err();
    assert!(err.contains("unknown field `extra`"), "{err}");
}
