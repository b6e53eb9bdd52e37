//! `header-profile-handler` (llm-d v0.10, alpha): runs exactly one scheduling profile per
//! request, the one a request header names. A caller that already knows which stage a call is
//! for (llm-d's coordinator: encode, prefill, decode) asks one EPP for each, one call per
//! profile, instead of running one EPP per profile.
//!
//! As upstream:
//! - with one profile configured, it always runs, whatever the header says (the assembler
//!   then builds a plain single profile and this handler is not consulted);
//! - with several, the header's value (trimmed) names the profile, matched exactly; a missing
//!   or blank header runs `defaultProfile`;
//! - a value naming no profile (or a `defaultProfile` that is not configured) runs nothing:
//!   the request fails as a scheduling failure (429), the reason logged for operators, since
//!   upstream's scheduler has no way to carry a 400 through either.
//!
//! The header name is lower-cased (both EPPs store request headers so); `defaultProfile` stays
//! case-sensitive (it names a `schedulingProfiles` entry). The chosen profile is the primary
//! one: its pick is the destination, and no sidecar header is set.

use super::{Candidate, Decision, ScheduleError, Scheduler, SchedulingRequest};
use crate::plugin::Invalid;
use rand::Rng;

/// The header read when `headerName` is empty (upstream's `EPP-Profile`, lower-cased).
const DEFAULT_HEADER: &str = "epp-profile";
/// The profile run without a header when `defaultProfile` is empty.
const DEFAULT_PROFILE: &str = "decode";

/// `header-profile-handler`'s parameters, defaulted and normalised by [`Self::validate`].
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct HeaderProfileParams {
    pub(crate) header_name: String,
    pub(crate) default_profile: String,
}

impl HeaderProfileParams {
    /// Trims both, lower-cases the header name and fills the defaults (upstream has no error).
    pub(crate) fn validate(mut self) -> Result<Self, Invalid> {
        self.header_name = self.header_name.trim().to_ascii_lowercase();
        if self.header_name.is_empty() {
            DEFAULT_HEADER.clone_into(&mut self.header_name);
        }
        self.default_profile = self.default_profile.trim().to_owned();
        if self.default_profile.is_empty() {
            DEFAULT_PROFILE.clone_into(&mut self.default_profile);
        }
        Ok(self)
    }
}

/// Several profiles, one of which each request's header chooses.
#[derive(Clone, Debug)]
pub(crate) struct HeaderProfiles {
    pub(crate) params: HeaderProfileParams,
    /// Every configured profile by name, in configuration order.
    pub(crate) profiles: Vec<(String, Scheduler)>,
}

impl HeaderProfiles {
    /// Runs the profile the request names (or the default one).
    pub(crate) fn schedule(
        &self,
        req: &SchedulingRequest<'_>,
        candidates: &[Candidate],
        rng: &mut impl Rng,
    ) -> Result<Decision, ScheduleError> {
        let sent = req
            .headers
            .get(&self.params.header_name)
            .map_or("", str::trim);
        let name = if sent.is_empty() {
            self.params.default_profile.as_str()
        } else {
            sent
        };
        match self.profiles.iter().find(|(n, _)| n == name) {
            Some((_, profile)) => profile.schedule_profile(req, candidates, rng),
            None => Err(self.no_profile(sent)),
        }
    }

    /// Why no profile ran (upstream's messages), logged at info as upstream does: a bad or
    /// missing header is the client's problem, which an operator still wants to see.
    fn no_profile(&self, sent: &str) -> ScheduleError {
        let header = &self.params.header_name;
        let reason = if sent.is_empty() {
            format!(
                "header profile handler: defaultProfile {:?} is not a configured scheduling profile",
                self.params.default_profile
            )
        } else {
            format!("header profile handler: no scheduling profile configured for {header:?} header value {sent:?}")
        };
        let registered: Vec<&str> = self.profiles.iter().map(|(n, _)| n.as_str()).collect();
        tracing::info!(error = %reason, ?registered, "no scheduling profile selected for request");
        ScheduleError::NoProfile(reason)
    }

    /// Every profile, for the questions asked of all of them (labels, prefix, headers).
    pub(crate) fn schedulers(&self) -> impl Iterator<Item = &Scheduler> {
        self.profiles.iter().map(|(_, s)| s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::lifecycle::Headers;
    use crate::scheduling::testing::labelled;

    const CONFIG: &str = "
plugins:
- {type: header-profile-handler, parameters: {headerName: ' X-Stage '}}
- {type: prefill-filter}
- {type: decode-filter}
- {type: max-score-picker}
schedulingProfiles:
- name: prefill
  plugins: [{pluginRef: prefill-filter}, {pluginRef: max-score-picker}]
- name: decode
  plugins: [{pluginRef: decode-filter}, {pluginRef: max-score-picker}]
";

    fn alpha(config: &str) -> Scheduler {
        let cfg = crate::config::parse(config).unwrap();
        let load = crate::config::LoadOptions {
            allow_experimental: true,
        };
        crate::scheduling::build_with(&cfg, load).unwrap()
    }

    fn run(config: &str, headers: &[(&str, &str)]) -> Result<Vec<u16>, ScheduleError> {
        let sched = alpha(config);
        let cands = [
            labelled(1, &[("llm-d.ai/role", "prefill")]),
            labelled(2, &[("llm-d.ai/role", "decode")]),
        ];
        let headers = Headers::of(headers);
        let req = SchedulingRequest {
            headers: &headers,
            ..Default::default()
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let d = sched.schedule(&req, &cands, &mut rng)?;
        Ok(d.endpoints.iter().map(|e| e.0.port()).collect())
    }

    use rand::SeedableRng;

    #[test]
    fn the_header_names_the_one_profile_that_runs() {
        let sched = alpha(CONFIG);
        let captured: Vec<&str> = sched.request_headers().iter().map(|h| &**h).collect();
        assert_eq!(captured, ["x-stage"]);
        assert_eq!(run(CONFIG, &[("x-stage", "prefill")]), Ok(vec![1]));
        assert_eq!(run(CONFIG, &[("x-stage", " decode ")]), Ok(vec![2]));
    }

    #[test]
    fn a_missing_or_blank_header_runs_the_default_profile() {
        assert_eq!(run(CONFIG, &[]), Ok(vec![2]));
        assert_eq!(run(CONFIG, &[("x-stage", "  ")]), Ok(vec![2]));
    }

    #[test]
    fn an_unknown_value_or_an_unconfigured_default_runs_nothing() {
        let err = run(CONFIG, &[("x-stage", "Prefill")]).unwrap_err();
        assert!(
            matches!(err, ScheduleError::NoProfile(ref m) if m.contains("\"Prefill\"")),
            "{err}"
        );
        let other_default = CONFIG.replace("' X-Stage '", "' X-Stage ', defaultProfile: encode");
        let err = run(&other_default, &[]).unwrap_err();
        assert!(
            matches!(err, ScheduleError::NoProfile(ref m) if m.contains("\"encode\"")),
            "{err}"
        );
    }

    #[test]
    fn one_profile_always_runs_whatever_the_header() {
        let one = "
plugins:
- {type: header-profile-handler}
- {type: prefill-filter}
- {type: max-score-picker}
schedulingProfiles:
- name: prefill
  plugins: [{pluginRef: prefill-filter}, {pluginRef: max-score-picker}]
";
        assert_eq!(run(one, &[("epp-profile", "nope")]), Ok(vec![1]));
        assert_eq!(run(one, &[]), Ok(vec![1]));
    }

    #[test]
    fn parameters_default_to_upstreams() {
        let p = HeaderProfileParams::default().validate().unwrap();
        assert_eq!(
            (p.header_name.as_str(), p.default_profile.as_str()),
            ("epp-profile", "decode")
        );
    }
}
