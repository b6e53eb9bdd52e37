//! `data-parallel-profile-handler` (llm-d v0.10, deprecated upstream: "Use
//! simple-profile-handler with Istio >= 1.28.1", which routes to each rank's port itself). For
//! a gateway that can only reach a pod on one port: the one profile picks a data-parallel rank
//! (`ip:rankPort`) as usual, the request is sent to `ip:primaryPort` (the rank-0 sidecar) and
//! the picked rank travels in `x-data-parallel-host-port` for the sidecar to forward to.
//!
//! As upstream: `primaryPort` defaults to 8000 and must be in 1..=65535 (0 is let through
//! unchecked and then names port 0); the handler runs exactly one profile, so with several
//! configured every request fails as a scheduling failure (429), logged, and the
//! configuration still loads. Every endpoint the picker returns gets the primary port; the
//! header names the first (the primary pick).

use super::{Decision, ScheduleError};
use crate::plugin::Invalid;

/// The request header naming the picked rank, for the sidecar (upstream's
/// `DataParallelEndpointHeader`).
pub const DATA_PARALLEL_HEADER: &str = "x-data-parallel-host-port";

/// `data-parallel-profile-handler`'s parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct DataParallel {
    /// The port requests are sent to (the pod's rank-0 sidecar).
    pub(crate) primary_port: i64,
    /// Set by the assembler: more than one profile is configured, which the handler refuses
    /// at each request.
    #[serde(skip)]
    pub(crate) several_profiles: bool,
}

impl Default for DataParallel {
    fn default() -> Self {
        Self {
            primary_port: 8000,
            several_profiles: false,
        }
    }
}

impl DataParallel {
    /// Upstream's check and its deprecation notice.
    pub(crate) fn validate(self) -> Result<Self, Invalid> {
        tracing::info!("Deprecated: Use simple-profile-handler with Istio >= 1.28.1");
        if self.primary_port != 0 && !(1..=65535).contains(&self.primary_port) {
            return Err(Invalid::new(
                "primaryPort",
                format!(
                    "invalid primaryPort: must be between 1 and 65535, got {}",
                    self.primary_port
                ),
            ));
        }
        Ok(self)
    }

    /// Whether a request may be scheduled: not with several profiles (upstream's handler
    /// picks none and logs why).
    pub(crate) fn admits(&self) -> Result<(), ScheduleError> {
        if !self.several_profiles {
            return Ok(());
        }
        let reason = "Data Parallel profile handler requires exactly one scheduling profile";
        tracing::error!("{reason}");
        Err(ScheduleError::NoProfile(reason.to_owned()))
    }

    /// The decision sent to the primary port, the picked rank in the sidecar's header.
    pub(crate) fn redirect(&self, d: &mut Decision) {
        let Some(first) = d.endpoints.first() else {
            return;
        };
        d.headers
            .push((DATA_PARALLEL_HEADER, Some(first.to_string())));
        d.port = u16::try_from(self.primary_port).ok();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::testing::cand;

    fn alpha_free(config: &str) -> crate::scheduling::Scheduler {
        crate::scheduling::build(&crate::config::parse(config).unwrap()).unwrap()
    }

    const CONFIG: &str = "
plugins:
- {type: data-parallel-profile-handler, parameters: {primaryPort: 9000}}
- {type: queue-scorer}
- {type: max-score-picker}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
";

    #[test]
    fn the_pick_goes_to_the_primary_port_and_the_rank_in_the_header() {
        let sched = alpha_free(CONFIG);
        let cands = [cand(8001, 3.0, 0.0, 0), cand(8002, 0.0, 0.0, 0)];
        let mut rng: rand::rngs::StdRng = rand::SeedableRng::seed_from_u64(1);
        let req = crate::scheduling::SchedulingRequest::default();
        let d = sched.schedule(&req, &cands, &mut rng).unwrap();
        assert_eq!(d.endpoints[0].to_string(), "10.0.0.1:8002");
        assert_eq!(d.port, Some(9000));
        let header = (DATA_PARALLEL_HEADER, Some("10.0.0.1:8002".to_owned()));
        assert!(d.headers.contains(&header), "{:?}", d.headers);
    }

    #[test]
    fn several_profiles_load_and_fail_every_request() {
        let two = CONFIG.replace(
            "schedulingProfiles:\n",
            "schedulingProfiles:\n- name: other\n  plugins: [{pluginRef: queue-scorer}]\n",
        );
        let sched = alpha_free(&two);
        let cands = [cand(8001, 0.0, 0.0, 0)];
        let mut rng: rand::rngs::StdRng = rand::SeedableRng::seed_from_u64(1);
        let req = crate::scheduling::SchedulingRequest::default();
        let err = sched.schedule(&req, &cands, &mut rng).unwrap_err();
        assert!(matches!(err, ScheduleError::NoProfile(_)), "{err}");
    }

    #[test]
    fn primary_port_defaults_to_8000_and_is_checked() {
        assert_eq!(
            DataParallel::default().validate().unwrap().primary_port,
            8000
        );
        let zero = DataParallel {
            primary_port: 0,
            ..Default::default()
        };
        assert!(zero.validate().is_ok(), "0 passes unchecked, as upstream");
        let big = DataParallel {
            primary_port: 70000,
            ..Default::default()
        };
        assert_eq!(big.validate().unwrap_err().parameter, "primaryPort");
    }
}
