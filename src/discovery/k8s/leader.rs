//! Leader election on a `coordination.k8s.io/v1` Lease, as controller-runtime does it for the
//! upstream EPP (`--ha-enable-leader-election`): every replica serves ext_proc, but only the
//! leader reports ready, so the Service sends traffic to the leader alone.
//!
//! The lease is named `epp-<namespace>-<pool>.gateway-api-inference-extension.sigs.k8s.io`.
//! A candidate takes the lease when it is free or its holder has not renewed within the lease
//! duration; every write is a replace carrying the read `resourceVersion`, so of two replicas
//! racing for an expired lease exactly one wins (the other gets 409 Conflict). The leader renews
//! every retry period and steps down when it cannot renew within the renew deadline. On
//! shutdown the leader releases the lease (controller-runtime's `ReleaseOnCancel`).
//!
//! A lease request the API server refuses (403: the ServiceAccount lacks the leader-election
//! Role) is no reason to stop: it is counted in `epp_kubernetes_forbidden_total{resource="leases"}`
//! every time, logged once per verb naming the missing permission, and retried every retry
//! period; this replica simply never leads (so never reports ready) until the Role is granted.

use crate::metrics::{ForbiddenLabels, KubeResource, KubeVerb, Metrics};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// controller-runtime's defaults: lease 15 s, renew deadline 10 s, retry 2 s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Timing {
    pub(crate) lease_duration: Duration,
    pub(crate) renew_deadline: Duration,
    pub(crate) retry_period: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// Who competes for which lease.
#[derive(Clone, Debug)]
pub(crate) struct Election {
    pub(crate) lease_name: String,
    pub(crate) namespace: String,
    pub(crate) identity: String,
    pub(crate) timing: Timing,
}

impl Election {
    pub(crate) fn lease_name(namespace: &str, pool: &str) -> String {
        format!("epp-{namespace}-{pool}.gateway-api-inference-extension.sigs.k8s.io")
    }
}

/// Whether this replica currently holds the lease.
fn held_by(lease: &Lease, identity: &str) -> bool {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        == Some(identity)
}

/// Whether someone else holds a lease that has not expired.
fn held_elsewhere(lease: &Lease, identity: &str, now: Timestamp) -> bool {
    let Some(spec) = lease.spec.as_ref() else {
        return false;
    };
    if spec
        .holder_identity
        .as_deref()
        .is_none_or(|h| h.is_empty() || h == identity)
    {
        return false;
    }
    let duration = i64::from(spec.lease_duration_seconds.unwrap_or(15));
    let renewed = spec
        .renew_time
        .as_ref()
        .or(spec.acquire_time.as_ref())
        .map(|t| t.0);
    renewed.is_some_and(|r| r.as_second() + duration > now.as_second())
}

impl Election {
    fn spec(&self, previous: Option<&LeaseSpec>, now: Timestamp) -> LeaseSpec {
        let keep =
            previous.filter(|s| s.holder_identity.as_deref() == Some(self.identity.as_str()));
        let transitions = previous.and_then(|s| s.lease_transitions).unwrap_or(0);
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(
                i32::try_from(self.timing.lease_duration.as_secs())
                    .unwrap_or(15)
                    .max(1),
            ),
            acquire_time: Some(
                keep.and_then(|s| s.acquire_time.clone())
                    .unwrap_or(MicroTime(now)),
            ),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(if keep.is_some() {
                transitions
            } else {
                transitions + 1
            }),
            ..Default::default()
        }
    }

    /// One attempt to acquire or renew; Ok(true) when we hold the lease afterwards. An error
    /// carries the verb of the request that failed.
    async fn try_acquire(&self, api: &Api<Lease>) -> Result<bool, (KubeVerb, kube::Error)> {
        let now = Timestamp::now();
        let existing = api
            .get_opt(&self.lease_name)
            .await
            .map_err(|e| (KubeVerb::get, e))?;
        let Some(mut lease) = existing else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.lease_name.clone()),
                    ..Default::default()
                },
                spec: Some(self.spec(None, now)),
            };
            return match api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err((KubeVerb::create, e)),
            };
        };
        if held_elsewhere(&lease, &self.identity, now) {
            return Ok(false);
        }
        lease.spec = Some(self.spec(lease.spec.as_ref(), now));
        match api
            .replace(&self.lease_name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err((KubeVerb::update, e)),
        }
    }

    /// Logs a failed lease request (a 403 once per verb, naming the missing permission) and
    /// counts every 403.
    fn report(
        &self,
        verb: KubeVerb,
        e: &kube::Error,
        metrics: &Metrics,
        forbidden: &mut std::collections::HashSet<KubeVerb>,
    ) {
        let is_403 = matches!(e, kube::Error::Api(s) if s.code == 403);
        if is_403 {
            let labels = ForbiddenLabels {
                resource: KubeResource::leases,
                verb,
            };
            metrics.kubernetes_forbidden.get_or_create(&labels).inc();
        }
        if !is_403 {
            tracing::warn!(error = %e, lease = %self.lease_name, "leader election: lease request failed");
        } else if forbidden.insert(verb) {
            tracing::error!(error = %e, lease = %self.lease_name, verb = ?verb,
                "leader election forbidden: the ServiceAccount lacks `{verb:?}` on `leases` (coordination.k8s.io); retrying, logged once");
        }
    }

    /// Gives the lease up if we hold it, so a standby takes over at once.
    async fn release(&self, api: &Api<Lease>) {
        let Ok(Some(mut lease)) = api.get_opt(&self.lease_name).await else {
            return;
        };
        if !held_by(&lease, &self.identity) {
            return;
        }
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
        }
        if let Err(e) = api
            .replace(&self.lease_name, &PostParams::default(), &lease)
            .await
        {
            tracing::warn!(error = %e, "releasing the leader lease failed");
        }
    }

    /// Competes for the lease until `shutdown`, publishing leadership on `leader`.
    pub(crate) async fn run(
        self,
        client: Client,
        leader: watch::Sender<bool>,
        metrics: std::sync::Arc<Metrics>,
        shutdown: CancellationToken,
    ) {
        let api: Api<Lease> = Api::namespaced(client, &self.namespace);
        let mut last_renewed: Option<Instant> = None;
        let mut forbidden = std::collections::HashSet::new();
        loop {
            let held = match self.try_acquire(&api).await {
                Ok(held) => held,
                Err((verb, e)) => {
                    self.report(verb, &e, &metrics, &mut forbidden);
                    false
                }
            };
            if held {
                last_renewed = Some(Instant::now());
            }
            let leading = held
                || (last_renewed.is_some_and(|t| t.elapsed() < self.timing.renew_deadline)
                    && *leader.borrow());
            if leading != *leader.borrow() {
                tracing::info!(identity = %self.identity, leading, "leader election");
            }
            leader.send_replace(leading);
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(self.timing.retry_period) => {}
            }
        }
        if *leader.borrow() {
            self.release(&api).await;
        }
        leader.send_replace(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: &str, renewed_secs_ago: i64, duration: i32) -> Lease {
        let now = Timestamp::now().as_second();
        let renew = Timestamp::from_second(now - renewed_secs_ago).unwrap();
        Lease {
            metadata: ObjectMeta::default(),
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                renew_time: Some(MicroTime(renew)),
                lease_duration_seconds: Some(duration),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_lease_is_taken_only_when_free_expired_or_ours() {
        let now = Timestamp::now();
        assert!(held_elsewhere(&lease("a", 1, 15), "b", now));
        assert!(!held_elsewhere(&lease("a", 20, 15), "b", now), "expired");
        assert!(!held_elsewhere(&lease("b", 1, 15), "b", now), "ours");
        assert!(!held_elsewhere(&lease("", 1, 15), "b", now), "released");
        assert_eq!(
            Election::lease_name("ns", "pool"),
            "epp-ns-pool.gateway-api-inference-extension.sigs.k8s.io"
        );
    }

    #[test]
    fn a_refused_lease_request_is_counted_every_time_and_logged_once_per_verb() {
        let metrics = Metrics::register(&mut prometheus_client::registry::Registry::default());
        let election = Election {
            lease_name: "l".into(),
            namespace: "ns".into(),
            identity: "me".into(),
            timing: Timing::default(),
        };
        let status = |code| {
            kube::Error::Api(Box::new(kube::core::Status {
                code,
                ..Default::default()
            }))
        };
        let mut logged = std::collections::HashSet::new();
        for _ in 0..3 {
            election.report(KubeVerb::get, &status(403), &metrics, &mut logged);
        }
        election.report(KubeVerb::create, &status(500), &metrics, &mut logged);
        let count = |verb| {
            let labels = ForbiddenLabels {
                resource: KubeResource::leases,
                verb,
            };
            metrics.kubernetes_forbidden.get_or_create(&labels).get()
        };
        assert_eq!(count(KubeVerb::get), 3);
        assert_eq!(count(KubeVerb::create), 0, "only refusals are counted");
        assert_eq!(logged.len(), 1);
    }
}
