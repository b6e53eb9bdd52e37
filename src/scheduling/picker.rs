//! Pickers: choose the destination endpoints, in rank order, from the scored candidates.
//! One per file under `picker/`. All take `maxNumOfEndpoints` (default 1); more than one
//! yields a fallback list the gateway may walk on retry.

mod max_score;
mod random;
mod weighted_random;

use super::Candidate;
use crate::endpoint::EndpointId;
pub use max_score::MaxScorePicker;
use rand::Rng;
pub use random::RandomPicker;
pub use weighted_random::WeightedRandomPicker;

/// Parameters every picker accepts.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct PickerParams {
    pub max_num_of_endpoints: usize,
}

impl Default for PickerParams {
    fn default() -> Self {
        Self { max_num_of_endpoints: 1 }
    }
}

#[derive(Clone, Debug)]
pub enum Picker {
    MaxScore(MaxScorePicker),
    Random(RandomPicker),
    WeightedRandom(WeightedRandomPicker),
}

impl Default for Picker {
    fn default() -> Self {
        Self::MaxScore(MaxScorePicker { params: PickerParams::default() })
    }
}

impl Picker {
    /// Builds the picker for `plugin_type`, or `None` when the type is not a picker.
    pub fn build(plugin_type: &str, p: &serde_yaml::Value) -> Result<Option<Self>, serde_yaml::Error> {
        let params = || -> Result<PickerParams, serde_yaml::Error> {
            let params: PickerParams = super::scorer::params(p)?;
            if params.max_num_of_endpoints == 0 {
                return Err(<serde_yaml::Error as serde::de::Error>::custom("maxNumOfEndpoints must be >= 1"));
            }
            Ok(params)
        };
        Ok(Some(match plugin_type {
            MaxScorePicker::TYPE => Self::MaxScore(MaxScorePicker { params: params()? }),
            RandomPicker::TYPE => Self::Random(RandomPicker { params: params()? }),
            WeightedRandomPicker::TYPE => Self::WeightedRandom(WeightedRandomPicker { params: params()? }),
            _ => return Ok(None),
        }))
    }

    pub fn pick(&self, scored: &[(&Candidate, f64)], rng: &mut impl Rng) -> Vec<EndpointId> {
        match self {
            Self::MaxScore(p) => p.pick(scored, rng),
            Self::Random(p) => p.pick(scored, rng),
            Self::WeightedRandom(p) => p.pick(scored, rng),
        }
    }

    pub fn max_endpoints(&self) -> usize {
        match self {
            Self::MaxScore(p) => p.params.max_num_of_endpoints,
            Self::Random(p) => p.params.max_num_of_endpoints,
            Self::WeightedRandom(p) => p.params.max_num_of_endpoints,
        }
    }
}
