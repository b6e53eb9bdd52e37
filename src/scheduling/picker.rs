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
pub(crate) use consistent_hash::{ConsistentHashParams, ConsistentHashPicker};
pub(crate) use least_request::WeightedLeastRequestPicker;
pub(crate) use max_score::MaxScorePicker;
pub(crate) use p2c::PowerOfTwoChoicesPicker;
use rand::Rng;
pub(crate) use random::RandomPicker;
pub(crate) use round_robin::RoundRobinPicker;
pub(crate) use weighted_random::WeightedRandomPicker;

/// Parameters every picker accepts.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub(crate) struct PickerParams {
    pub(crate) max_num_of_endpoints: usize,
}

impl Default for PickerParams {
    fn default() -> Self {
        Self {
            max_num_of_endpoints: 1,
        }
    }
}

impl PickerParams {
    pub(crate) fn validate(self) -> Result<Self, Invalid> {
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
    pub(crate) fn from_plugin<P: Parameters>(
        kind: PluginKind,
        p: &P,
    ) -> Result<Option<Self>, P::Error> {
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

    pub(crate) fn pick(
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

    #[cfg(test)]
    pub(crate) fn max_endpoints(&self) -> usize {
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
    let rest: Vec<(EndpointId, f64)> = scored
        .iter()
        .filter(|(c, _)| c.id != primary)
        .map(|(c, s)| (c.id, *s))
        .collect();
    std::iter::once(primary)
        .chain(best_first(&rest, n.max(1) - 1))
        .collect()
}

/// The first `k` of `items` by descending score, equal scores in their order in `items`: what a
/// stable sort by score and `take(k)` give, without putting the rest in order (sorting all 100
/// candidates to return one was ~40% of a decision; BENCHMARKS.md, "Decision cost").
pub(crate) fn best_first(items: &[(EndpointId, f64)], k: usize) -> Vec<EndpointId> {
    let k = k.min(items.len());
    if k == 0 {
        return Vec::new();
    }
    let mut keyed: Vec<(f64, usize)> = items
        .iter()
        .enumerate()
        .map(|(i, (_, s))| (*s, i))
        .collect();
    let order = |a: &(f64, usize), b: &(f64, usize)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
    if k < keyed.len() {
        keyed.select_nth_unstable_by(k - 1, order);
        keyed.truncate(k);
    }
    keyed.sort_unstable_by(order);
    keyed.into_iter().map(|(_, i)| items[i].0).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The same endpoints, in the same order, as a stable sort by score and `take(k)`.
        #[test]
        fn best_first_is_a_stable_sort_cut_at_k(scores in proptest::collection::vec(0u8..4, 0..40), k in 0usize..8) {
            let items: Vec<(EndpointId, f64)> = scores
                .iter()
                .enumerate()
                .map(|(i, s)| (format!("10.0.0.1:{}", i + 1).parse().unwrap(), f64::from(*s)))
                .collect();
            let mut sorted = items.clone();
            sorted.sort_by(|a, b| b.1.total_cmp(&a.1));
            let want: Vec<EndpointId> = sorted.into_iter().take(k).map(|(id, _)| id).collect();
            proptest::prop_assert_eq!(best_first(&items, k), want);
        }
    }

    /// The picker the configuration decoder makes of a `type:` and its parameters (`None`:
    /// the type is not a picker); its problems as one message.
    fn build(t: &str, v: &serde_norway::Value) -> Result<Option<Picker>, String> {
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
        let yaml = |s: &str| serde_norway::from_str::<serde_norway::Value>(s).unwrap();
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
        assert!(build("queue-scorer", &serde_norway::Value::Null)
            .unwrap()
            .is_none());
    }
}
