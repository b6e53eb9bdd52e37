//! How discovery reports what the API server answers when it does not answer with data.
//!
//! A refusal (403, RBAC) will not fix itself: it is logged once per resource and verb, at error
//! level, naming the missing permission, and every occurrence is counted in
//! `epp_kubernetes_forbidden_total{resource,verb}`; the watcher keeps retrying with backoff, so
//! granting the permission takes effect without a restart. Anything else (server unreachable,
//! restarting, CRD not installed) is logged at warn on every retry; the start-up line (`client`) names the server and
//! the credential source.

use crate::metrics::{ForbiddenLabels, KubeResource, KubeVerb, Metrics};
use kube::runtime::watcher;
use std::collections::HashSet;
use std::sync::Arc;

/// Reports the errors of one task's watches.
pub(crate) struct Reporter {
    metrics: Arc<Metrics>,
    logged: HashSet<(KubeResource, KubeVerb)>,
    /// Told of every failure, so readiness can check whether the API server still answers.
    sync: Option<super::SyncInputs>,
}

impl Reporter {
    pub(crate) fn new(metrics: Arc<Metrics>, sync: Option<super::SyncInputs>) -> Self {
        Self {
            metrics,
            logged: HashSet::new(),
            sync,
        }
    }

    /// Reports one failed step of the watch of `resource`.
    pub(crate) fn watch_failed(&mut self, resource: KubeResource, e: &watcher::Error) {
        if let Some(sync) = &self.sync {
            sync.watch_failed();
        }
        match forbidden_verb(e) {
            Some(verb) => self.forbidden(resource, verb, e),
            None => tracing::warn!(
                watch = ?resource, error = %e,
                "Kubernetes watch failed; retrying with backoff"
            ),
        }
    }

    fn forbidden(&mut self, resource: KubeResource, verb: KubeVerb, e: &watcher::Error) {
        self.metrics
            .kubernetes_forbidden
            .get_or_create(&ForbiddenLabels { resource, verb })
            .inc();
        if self.logged.insert((resource, verb)) {
            tracing::error!(
                resource = ?resource, verb = ?verb, error = %e,
                "forbidden: epp's ServiceAccount lacks `{verb:?}` on `{resource:?}` (check the \
                 Role and RoleBinding); retrying with backoff, logged once"
            );
        }
    }
}

/// The verb a 403 refused, if `e` is one.
pub(crate) fn forbidden_verb(e: &watcher::Error) -> Option<KubeVerb> {
    let is_403 = |e: &kube::Error| matches!(e, kube::Error::Api(s) if s.code == 403);
    match e {
        watcher::Error::InitialListFailed(e) if is_403(e) => Some(KubeVerb::list),
        watcher::Error::WatchStartFailed(e) | watcher::Error::WatchFailed(e) if is_403(e) => {
            Some(KubeVerb::watch)
        }
        watcher::Error::WatchError(s) if s.code == 403 => Some(KubeVerb::watch),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            ..Default::default()
        }))
    }

    #[test]
    fn a_403_names_the_verb_of_the_failed_step_and_other_errors_none() {
        let list = watcher::Error::InitialListFailed(status(403));
        let watch = watcher::Error::WatchStartFailed(status(403));
        let gone = watcher::Error::WatchStartFailed(status(410));
        assert_eq!(forbidden_verb(&list), Some(KubeVerb::list));
        assert_eq!(forbidden_verb(&watch), Some(KubeVerb::watch));
        assert_eq!(forbidden_verb(&gone), None);
    }

    #[test]
    fn a_refusal_is_counted_every_time() {
        let metrics = Arc::new(Metrics::register(
            &mut prometheus_client::registry::Registry::default(),
        ));
        let mut r = Reporter::new(Arc::clone(&metrics), None);
        for _ in 0..3 {
            r.watch_failed(
                KubeResource::pods,
                &watcher::Error::InitialListFailed(status(403)),
            );
        }
        let labels = ForbiddenLabels {
            resource: KubeResource::pods,
            verb: KubeVerb::list,
        };
        assert_eq!(metrics.kubernetes_forbidden.get_or_create(&labels).get(), 3);
        assert_eq!(r.logged.len(), 1);
    }
}
