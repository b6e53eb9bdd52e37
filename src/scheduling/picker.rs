//! Pickers: choose the destination endpoints, in rank order, from the scored candidates.
//! One per file under `picker/`. All take `maxNumOfEndpoints` (default 1); more than one
//! yields a fallback list the gateway may walk on retry (see `config/envoy/` and the README's
//! "Fallback lists").

mod consistent_hash;
mod least_request;
mod max_score;
mod p2c;
mod random;
mod round_robin;
mod weighted_random;

use super::{Candidate, SchedulingRequest};
use crate::endpoint::EndpointId;
use crate::plugin::{Invalid, Parameters, PluginKind};
pub use consistent_hash::{ConsistentHashParams, ConsistentHashPicker};
pub use least_request::WeightedLeastRequestPicker;
pub use max_score::MaxScorePicker;
pub use p2c::PowerOfTwoChoicesPicker;
use rand::Rng;
pub use random::RandomPicker;
pub use round_robin::RoundRobinPicker;
pub use weighted_random::WeightedRandomPicker;

/// Parameters every picker accepts.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct PickerParams {
    pub max_num_of_endpoints: usize,
}

impl Default for PickerParams {
    fn default() -> Self {
        Self {
            max_num_of_endpoints: 1,
        }
    }
}

impl PickerParams {
    pub fn validate(self) -> Result<Self, Invalid> {
        if self.max_num_of_endpoints == 0 {
            return Err(Invalid::new(
                "maxNumOfEndpoints",
                "maxNumOfEndpoints must be >= 1",
            ));
        }
        Ok(self)
    }
}

#[derive(Clone, Debug)]
pub enum Picker {
    MaxScore(MaxScorePicker),
    Random(RandomPicker),
    WeightedRandom(WeightedRandomPicker),
    RoundRobin(RoundRobinPicker),
    WeightedLeastRequest(WeightedLeastRequestPicker),
    PowerOfTwoChoices(PowerOfTwoChoicesPicker),
    ConsistentHash(ConsistentHashPicker),
}

impl Default for Picker {
    fn default() -> Self {
        Self::MaxScore(MaxScorePicker {
            params: PickerParams::default(),
        })
    }
}

impl Picker {
    /// The picker a `kind` plugin configures, from its parameters, decoded and checked (`None`
    /// when `kind` is no picker). The configuration decoder calls this for every plugin.
    pub fn from_plugin<P: Parameters>(kind: PluginKind, p: &P) -> Result<Option<Self>, P::Error> {
        use PluginKind as K;
        let params =
            || -> Result<PickerParams, P::Error> { Ok(p.decode::<PickerParams>()?.validate()?) };
        Ok(Some(match kind {
            K::MaxScorePicker => Self::MaxScore(MaxScorePicker { params: params()? }),
            K::RandomPicker => Self::Random(RandomPicker { params: params()? }),
            K::WeightedRandomPicker => {
                Self::WeightedRandom(WeightedRandomPicker { params: params()? })
            }
            K::RoundRobinPicker => Self::RoundRobin(RoundRobinPicker::new(params()?, false)),
            K::WeightedRoundRobinPicker => Self::RoundRobin(RoundRobinPicker::new(params()?, true)),
            K::WeightedLeastRequestPicker => {
                Self::WeightedLeastRequest(WeightedLeastRequestPicker { params: params()? })
            }
            K::PowerOfTwoChoicesPicker | K::P2cPicker => {
                Self::PowerOfTwoChoices(PowerOfTwoChoicesPicker { params: params()? })
            }
            K::ConsistentHashPicker => Self::ConsistentHash(ConsistentHashPicker {
                params: p.decode::<ConsistentHashParams>()?.validate()?,
            }),
            _ => return Ok(None),
        }))
    }

    pub fn pick(
        &self,
        req: &SchedulingRequest<'_>,
        scored: &[(&Candidate, f64)],
        rng: &mut impl Rng,
    ) -> Vec<EndpointId> {
        match self {
            Self::MaxScore(p) => p.pick(scored, rng),
            Self::Random(p) => p.pick(scored, rng),
            Self::WeightedRandom(p) => p.pick(scored, rng),
            Self::RoundRobin(p) => p.pick(scored),
            Self::WeightedLeastRequest(p) => p.pick(scored, rng),
            Self::PowerOfTwoChoices(p) => p.pick(scored, rng),
            Self::ConsistentHash(p) => p.pick(req, scored, rng),
        }
    }

    pub fn max_endpoints(&self) -> usize {
        match self {
            Self::MaxScore(p) => p.params.max_num_of_endpoints,
            Self::Random(p) => p.params.max_num_of_endpoints,
            Self::WeightedRandom(p) => p.params.max_num_of_endpoints,
            Self::RoundRobin(p) => p.params.max_num_of_endpoints,
            Self::WeightedLeastRequest(p) => p.params.max_num_of_endpoints,
            Self::PowerOfTwoChoices(p) => p.params.max_num_of_endpoints,
            Self::ConsistentHash(p) => p.params.max_num_of_endpoints,
        }
    }
}

/// `primary` first, then up to `n - 1` other candidates by descending score (candidate order
/// among equal scores): the fallback list of pickers whose primary is not the best score.
pub(crate) fn fill_by_score(
    primary: EndpointId,
    scored: &[(&Candidate, f64)],
    n: usize,
) -> Vec<EndpointId> {
    let mut rest: Vec<(EndpointId, f64)> = scored
        .iter()
        .filter(|(c, _)| c.id != primary)
        .map(|(c, s)| (c.id, *s))
        .collect();
    rest.sort_by(|a, b| b.1.total_cmp(&a.1));
    std::iter::once(primary)
        .chain(rest.into_iter().map(|(id, _)| id))
        .take(n.max(1))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The picker the configuration decoder makes of a `type:` and its parameters (`None`:
    /// the type is not a picker); its problems as one message.
    fn build(t: &str, v: &serde_yaml::Value) -> Result<Option<Picker>, String> {
        use crate::config::plugin::{NamedPlugin, Plugin};
        use crate::scheduling::Plugin as S;
        let spec = crate::config::PluginSpec {
            name: None,
            plugin_type: t.to_owned(),
            parameters: Some(v.clone()),
        };
        match NamedPlugin::decode(&spec, Default::default()) {
            Ok(NamedPlugin {
                plugin: Plugin::Scheduling(S::Picker(p)),
                ..
            }) => Ok(Some(p)),
            Ok(_) => Ok(None),
            Err(problems) => Err(crate::config::ConfigError::from(problems).to_string()),
        }
    }

    #[test]
    fn every_picker_type_builds_and_bad_parameters_are_rejected() {
        let yaml = |s: &str| serde_yaml::from_str::<serde_yaml::Value>(s).unwrap();
        for t in [
            "max-score-picker",
            "random-picker",
            "weighted-random-picker",
            "round-robin-picker",
            "weighted-round-robin-picker",
            "weighted-least-request-picker",
            "power-of-two-choices-picker",
            "p2c",
            "consistent-hash-picker",
        ] {
            let p = build(t, &yaml("{maxNumOfEndpoints: 2}")).unwrap().unwrap();
            assert_eq!(p.max_endpoints(), 2, "{t}");
            assert!(build(t, &yaml("{maxNumOfEndpoints: 0}")).is_err(), "{t}");
            assert!(build(t, &yaml("{bogus: 1}")).is_err(), "{t}");
        }
        assert!(build("consistent-hash-picker", &yaml("{loadFactor: 0.9}"))
            .unwrap_err()
            .to_string()
            .contains("loadFactor"));
        assert!(build("queue-scorer", &serde_yaml::Value::Null)
            .unwrap()
            .is_none());
    }
}
