//! Session affinity pinned to a profile's pick: llm-d's `profileName` parameter of
//! `session-affinity-scorer` and `session-affinity-filter`.
//!
//! llm-d's P/D guide configures two instances: one in the decode profile (no `profileName`),
//! whose token `x-session-token` names the decode pod, and one in the prefill profile with
//! `profileName: prefill` and its own header (`x-session-token-prefill`), naming the prefill
//! pod. A session's next request then goes to the same decode pod *and* the same prefill pod
//! (whose KV cache holds its prefix). The prefill instance reads its token header itself (the
//! adapter captures it: `Lifecycle::headers`) and writes it on responses of requests that
//! were prefilled remotely (`Lifecycle::response_headers`).
//!
//! With the `session_id` strategy (llm-d: "`session_id` supports the same pattern: configure
//! one instance per profile, each with its own `profileName`") each instance keeps its own
//! binding store: session id → decode pod, and session id → prefill pod, the latter made and
//! refreshed by requests that were prefilled remotely (nothing is written back to the client).
//!
//! Resolved once, when the scheduler is built: an instance naming the decode profile (or no
//! profile) pins the primary pick and uses `x-session-token`; one naming the handler's prefill
//! profile pins the prefill pick, with a header of its own (`encoded_endpoint_header`) or a
//! session id; any other name is a configuration error.

use super::super::scorer::{Pin, SESSION_HEADER};
#[cfg(test)]
use super::super::scorer::{SessionAffinityParams, SessionIdConfig};
use super::super::Scheduler;
use crate::scheduling::BuildError;

impl Scheduler {
    /// The session-affinity instances pinning the prefill pick (in any profile).
    #[cfg(test)]
    fn prefill_session_params(&self) -> impl Iterator<Item = &SessionAffinityParams> {
        let stages = self.disagg().and_then(|d| d.prefill.as_ref());
        std::iter::once(self)
            .chain(stages.map(|s| &s.profile))
            .flat_map(|s| s.session_params())
            .filter(|p| p.pins == Pin::Prefill)
    }

    /// The header carrying the prefill pod's session token, when an instance pins the prefill
    /// pick with the `encoded_endpoint_header` strategy.
    #[cfg(test)]
    pub(crate) fn prefill_session_header(&self) -> Option<&str> {
        self.prefill_session_params()
            .find_map(SessionAffinityParams::token_header)
    }

    /// The `session_id` configuration of an instance pinning the prefill pick: the director
    /// then keeps the session → prefill pod bindings.
    #[cfg(test)]
    pub(crate) fn prefill_session_id(&self) -> Option<&SessionIdConfig> {
        self.prefill_session_params()
            .find_map(SessionAffinityParams::session_id)
    }
}

/// Resolves every session-affinity instance's `profileName` into its [`Pin`].
pub(in crate::scheduling) fn pin(sched: &mut Scheduler, problems: &mut Vec<BuildError>) {
    let names = sched.disagg.as_ref().map(|d| {
        let prefill = d.prefill.as_ref().map(|s| s.name.clone());
        (d.decode.clone(), prefill)
    });
    let (decode, prefill) = names.unwrap_or_default();
    let mut profiles: Vec<&mut Scheduler> = Vec::new();
    if let Some(d) = sched.disagg.as_deref_mut() {
        profiles.extend(d.prefill.as_mut().map(|s| &mut s.profile));
        profiles.extend(d.encode.as_mut().map(|s| &mut s.profile));
    }
    for s in profiles {
        pin_profile(s, &decode, prefill.as_deref(), problems);
    }
    pin_profile(sched, &decode, prefill.as_deref(), problems);
}

fn pin_profile(
    sched: &mut Scheduler,
    decode: &str,
    prefill: Option<&str>,
    problems: &mut Vec<BuildError>,
) {
    let single = sched.disagg.is_none() && decode.is_empty();
    for p in sched.session_params_mut() {
        let name = p.profile_name.as_str();
        let problem = |message: String| BuildError::SessionPin {
            profile: name.to_owned(),
            message,
        };
        p.pins = if single || name.is_empty() || name == decode {
            Pin::Primary
        } else if Some(name) == prefill {
            Pin::Prefill
        } else {
            problems.push(problem(format!(
                "epp pins the decode profile's pick ({decode:?}) or the prefill profile's ({})",
                prefill.unwrap_or("none configured")
            )));
            continue;
        };
        match (p.pins, p.token_header()) {
            (Pin::Primary, Some(h)) if h != SESSION_HEADER => problems.push(problem(format!(
                "the primary pick's token is read and written in {SESSION_HEADER}, got header {h:?}"
            ))),
            (Pin::Prefill, Some(h)) if h == SESSION_HEADER => problems.push(problem(format!(
                "{SESSION_HEADER} carries the decode pod's token; give the prefill instance a header of its own (llm-d's guide: x-session-token-prefill)"
            ))),
            _ => {}
        }
    }
}

/// The guide's pattern with the `session_id` strategy on both instances.
#[cfg(test)]
pub(crate) fn by_session_id(example: &str) -> String {
    let by_id = "    strategy: session_id\n    sessionIdConfig:\n      sources:\n      - header: x-session-id\n";
    example
        .replace(
            "    encodedEndpointHeaderConfig:\n      header: x-session-token-prefill\n",
            by_id,
        )
        .replace(
            "    encodedEndpointHeaderConfig:\n      header: x-session-token\n",
            by_id,
        )
}

#[cfg(test)]
mod tests {
    use crate::config;
    use crate::endpoint::EndpointId;
    use crate::scheduling::filter::ROLE_LABEL;
    use crate::scheduling::lifecycle::{Headers, Placed};
    use crate::scheduling::scorer::encode_token;
    use crate::scheduling::testing::labelled;
    use crate::scheduling::{build_with, Candidate, Scheduler, SchedulingRequest};
    use rand::{rngs::SmallRng, SeedableRng};

    fn example() -> String {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/config/examples/llm-d-pd-session-affinity.yaml"
        );
        std::fs::read_to_string(path).unwrap()
    }

    /// Session affinity is alpha upstream: `--allow-experimental-plugins`.
    fn build(text: &str) -> Result<Scheduler, Vec<config::Problem>> {
        let load = config::LoadOptions {
            allow_experimental: true,
        };
        build_with(&config::parse(text).unwrap(), load)
    }

    fn problems(text: &str) -> String {
        let errs = build(text).unwrap_err();
        let all: Vec<String> = errs.iter().map(ToString::to_string).collect();
        all.join("; ")
    }

    /// The prefill instance's token naming `pod` (static endpoints are named by address).
    fn prefill_token(pod: EndpointId) -> Headers {
        Headers::of(&[("x-session-token-prefill", &encode_token(&pod.to_string()))])
    }

    /// Decode pods on ports 1 and 2, prefill pods on 3 and 4.
    fn pool() -> Vec<Candidate> {
        let roles = ["decode", "decode", "prefill", "prefill"];
        (0..4)
            .map(|i| labelled(i as u16 + 1, &[(ROLE_LABEL, roles[i])]))
            .collect()
    }

    #[test]
    fn the_guides_two_instances_pin_the_decode_and_the_prefill_pick() {
        let s = build(&example()).unwrap();
        assert!(
            s.session_affinity(),
            "the decode instance writes x-session-token"
        );
        assert_eq!(s.prefill_session_header(), Some("x-session-token-prefill"));
        let cands = pool();
        let ids: Vec<EndpointId> = cands.iter().map(|c| c.id).collect();
        for (decode, prefill) in [(0, 2), (1, 3), (0, 3), (1, 2)] {
            let headers = prefill_token(ids[prefill]);
            for seed in 0..5 {
                let req = SchedulingRequest {
                    prompt_tokens: 1_000,
                    block_size: 16,
                    session_endpoint: Some(ids[decode]),
                    headers: &headers,
                    ..Default::default()
                };
                let mut rng = SmallRng::seed_from_u64(seed);
                let d = s.schedule(&req, &cands, &mut rng).unwrap();
                assert_eq!(d.endpoints[0], ids[decode]);
                assert_eq!(d.disagg.unwrap().prefill, Some(ids[prefill]));
            }
        }
    }

    #[test]
    fn session_ids_pin_the_prefill_pick_through_the_binding_the_director_reads() {
        let text = super::by_session_id(&example());
        assert_eq!(text.matches("strategy: session_id").count(), 2);
        let s = build(&text).unwrap();
        assert!(!s.session_affinity(), "no token is written");
        assert_eq!(s.prefill_session_header(), None);
        let c = s.prefill_session_id().expect("the prefill instance binds");
        assert_eq!(c.sources[0].header, "x-session-id");
        assert!(s.session_id().is_some(), "the decode instance binds too");
        let cands = pool();
        let ids: Vec<EndpointId> = cands.iter().map(|c| c.id).collect();
        for prefill in [2, 3] {
            // A first request of session s placed on ids[1] and prefilled on ids[prefill]
            // binds both instances (their `pre_request`).
            let session = format!("s{prefill}");
            let headers = Headers::of(&[("x-session-id", &session)]);
            let req = SchedulingRequest {
                prompt_tokens: 1_000,
                block_size: 16,
                headers: &headers,
                ..Default::default()
            };
            let first = s
                .schedule(&req, &cands, &mut SmallRng::seed_from_u64(1))
                .unwrap();
            let placed = Placed {
                id: 1,
                request: &req,
                candidates: &cands,
                decision: &first,
                primary: ids[1],
                prefill: Some(ids[prefill]),
                now: req.now,
            };
            s.pre_request(&placed);
            let mut rng = SmallRng::seed_from_u64(7);
            let d = s.schedule(&req, &cands, &mut rng).unwrap();
            assert_eq!(d.endpoints[0], ids[1]);
            assert_eq!(d.disagg.unwrap().prefill, Some(ids[prefill]));
        }
    }

    #[test]
    fn a_prefill_token_never_moves_the_decode_pick_and_vice_versa() {
        let s = build(&example()).unwrap();
        let cands = pool();
        let ids: Vec<EndpointId> = cands.iter().map(|c| c.id).collect();
        // Tokens naming pods of the other role: neither instance finds its pod a candidate.
        let headers = prefill_token(ids[0]);
        let req = SchedulingRequest {
            prompt_tokens: 1_000,
            block_size: 16,
            session_endpoint: Some(ids[3]),
            headers: &headers,
            ..Default::default()
        };
        let mut rng = SmallRng::seed_from_u64(1);
        let d = s.schedule(&req, &cands, &mut rng).unwrap();
        assert!(ids[..2].contains(&d.endpoints[0]));
        let prefill = d.disagg.unwrap().prefill.unwrap();
        assert!(ids[2..].contains(&prefill));
    }

    #[test]
    fn profile_names_and_headers_epp_cannot_honour_are_refused() {
        let text = example();
        let table = [
            (
                text.replace("profileName: prefill", "profileName: encode"),
                "profileName \"encode\": epp pins the decode profile's pick (\"decode\") or the prefill profile's (prefill)",
            ),
            (
                text.replace("header: x-session-token-prefill", "header: x-session-token"),
                "x-session-token carries the decode pod's token",
            ),
            (
                text.replace(
                    "    encodedEndpointHeaderConfig:\n      header: x-session-token\n",
                    "    profileName: decode\n    encodedEndpointHeaderConfig:\n      header: x-session-token-d\n",
                ),
                "the primary pick's token is read and written in x-session-token, got header \"x-session-token-d\"",
            ),
        ];
        for (yaml, want) in table {
            assert_ne!(yaml, text, "{want}: the replacement applied");
            let got = problems(&yaml);
            assert!(got.contains(want), "{want}\n{got}");
        }
    }
}
