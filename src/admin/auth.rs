//! Authentication and authorization of the metrics port (`--metrics-endpoint-auth`, on by
//! default in Kubernetes mode), as upstream protects it (controller-runtime's
//! `filters.WithAuthenticationAndAuthorization`, GIE v1.5.0 `cmd/epp/runner`):
//!
//! 1. the request's `Authorization: Bearer <token>` is sent to the API server as a TokenReview;
//!    no token, or one the server does not authenticate, is answered `401 Unauthorized`;
//! 2. the authenticated user is checked with a SubjectAccessReview for the request's
//!    non-resource URL (its path) and verb (its lowercased method): denied is `403`, allowed is
//!    served. A review that cannot be made (API server down, epp lacking `create` on
//!    `tokenreviews` or `subjectaccessreviews`) is `500`, with the reason in the log.
//!
//! Answers are cached as upstream caches them: token reviews for 1 minute (authenticated or
//! not), access reviews for 5 minutes when allowed and 30 seconds when denied; failures are not
//! cached; a review refused as forbidden also counts in
//! `epp_kubernetes_forbidden_total{resource="tokenreviews"|"subjectaccessreviews",verb="create"}`.
//! Each cache holds at most [`CACHE_ENTRIES`] entries, so a flood of random tokens cannot
//! grow it. Every answer is counted in `epp_metrics_auth_requests_total{outcome}`; a review that
//! fails is logged at warn once (then at debug: Prometheus would repeat it every scrape).

use crate::metrics::{
    ForbiddenLabels, KubeResource, KubeVerb, Metrics, MetricsAuthLabels, MetricsAuthOutcome,
};
use http::{HeaderMap, StatusCode};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a TokenReview answer is reused (controller-runtime's `CacheTTL`).
pub(crate) const AUTHN_TTL: Duration = Duration::from_secs(60);
/// How long an allowing SubjectAccessReview is reused (`AllowCacheTTL`).
pub(crate) const ALLOW_TTL: Duration = Duration::from_secs(300);
/// How long a denying SubjectAccessReview is reused (`DenyCacheTTL`).
pub(crate) const DENY_TTL: Duration = Duration::from_secs(30);
/// Most entries per cache.
pub(crate) const CACHE_ENTRIES: usize = 1024;

/// Why a request to the metrics port is not served; each maps to upstream's status and text.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refusal {
    #[error("Unauthorized")]
    Unauthenticated,
    #[error("Authorization denied for user {0}")]
    Denied(String),
    #[error("Authentication failed")]
    TokenReview(#[source] kube::Error),
    #[error("Authorization for user {user} failed")]
    AccessReview {
        user: String,
        #[source]
        source: kube::Error,
    },
}

impl Refusal {
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            Self::Unauthenticated => StatusCode::UNAUTHORIZED,
            Self::Denied(_) => StatusCode::FORBIDDEN,
            Self::TokenReview(_) | Self::AccessReview { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The review the API server refused as forbidden (RBAC), if that is what failed.
    fn forbidden(&self) -> Option<KubeResource> {
        let is_403 = |e: &kube::Error| matches!(e, kube::Error::Api(s) if s.code == 403);
        match self {
            Self::TokenReview(e) if is_403(e) => Some(KubeResource::tokenreviews),
            Self::AccessReview { source, .. } if is_403(source) => {
                Some(KubeResource::subjectaccessreviews)
            }
            _ => None,
        }
    }

    fn outcome(&self) -> MetricsAuthOutcome {
        match self {
            Self::Unauthenticated => MetricsAuthOutcome::unauthenticated,
            Self::Denied(_) => MetricsAuthOutcome::forbidden,
            Self::TokenReview(_) | Self::AccessReview { .. } => MetricsAuthOutcome::error,
        }
    }
}

/// Entries that expire, at most [`CACHE_ENTRIES`].
struct Cache<K, V> {
    entries: HashMap<K, (V, Instant)>,
}

impl<K: Hash + Eq, V: Clone> Cache<K, V> {
    fn new() -> Self {
        Self {
            entries: HashMap::new(),
        }
    }

    fn get(&self, key: &K, now: Instant) -> Option<V> {
        self.entries
            .get(key)
            .filter(|(_, expires)| *expires > now)
            .map(|(v, _)| v.clone())
    }

    fn put(&mut self, key: K, value: V, ttl: Duration, now: Instant) {
        if self.entries.len() >= CACHE_ENTRIES {
            self.entries.retain(|_, (_, expires)| *expires > now);
        }
        if self.entries.len() >= CACHE_ENTRIES {
            self.entries.clear();
        }
        self.entries.insert(key, (value, now + ttl));
    }
}

/// Who a token belongs to, as TokenReview answered (`None`: not authenticated).
type Identity = Option<UserInfo>;

/// The metrics port's gate.
pub(crate) struct MetricsAuth {
    client: Client,
    metrics: Arc<Metrics>,
    tokens: Mutex<Cache<String, Identity>>,
    /// (token, verb, path) → allowed.
    access: Mutex<Cache<(String, String, String), bool>>,
    /// Whether a failed review has been logged at warn.
    warned: std::sync::atomic::AtomicBool,
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The bearer token of `headers`, if any.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

impl MetricsAuth {
    pub(crate) fn new(client: Client, metrics: Arc<Metrics>) -> Self {
        Self {
            client,
            metrics,
            tokens: Mutex::new(Cache::new()),
            access: Mutex::new(Cache::new()),
            warned: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Whether the request may be served; counted by outcome.
    pub(crate) async fn check(
        &self,
        method: &http::Method,
        path: &str,
        headers: &HeaderMap,
    ) -> Result<(), Refusal> {
        let result = self.decide(method, path, headers).await;
        let outcome = match &result {
            Ok(()) => MetricsAuthOutcome::allowed,
            Err(r) => r.outcome(),
        };
        self.metrics
            .metrics_auth
            .get_or_create(&MetricsAuthLabels { outcome })
            .inc();
        if let Some(resource) = result.as_ref().err().and_then(Refusal::forbidden) {
            let labels = ForbiddenLabels {
                resource,
                verb: KubeVerb::create,
            };
            self.metrics
                .kubernetes_forbidden
                .get_or_create(&labels)
                .inc();
        }
        match &result {
            Err(e @ (Refusal::TokenReview(source) | Refusal::AccessReview { source, .. })) => {
                // Once per process at warn (every scrape would repeat it); counted every time.
                if !self.warned.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::warn!(error = %source, path, "metrics endpoint auth: {e} (epp's ServiceAccount needs create on tokenreviews and subjectaccessreviews; further failures are logged at debug and counted in epp_metrics_auth_requests_total{{outcome=\"error\"}})");
                } else {
                    tracing::debug!(error = %source, path, "metrics endpoint auth: {e}");
                }
            }
            Err(e) => tracing::debug!(path, "metrics endpoint auth: {e}"),
            Ok(()) => {}
        }
        result
    }

    async fn decide(
        &self,
        method: &http::Method,
        path: &str,
        headers: &HeaderMap,
    ) -> Result<(), Refusal> {
        let token = bearer(headers).ok_or(Refusal::Unauthenticated)?;
        let user = self
            .authenticate(token)
            .await?
            .ok_or(Refusal::Unauthenticated)?;
        let verb = method.as_str().to_ascii_lowercase();
        let name = user.username.clone().unwrap_or_default();
        if self.authorize(token, &user, verb, path).await? {
            Ok(())
        } else {
            Err(Refusal::Denied(name))
        }
    }

    async fn authenticate(&self, token: &str) -> Result<Identity, Refusal> {
        if let Some(known) = locked(&self.tokens).get(&token.to_owned(), Instant::now()) {
            return Ok(known);
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(Refusal::TokenReview)?;
        let status = answer.status.unwrap_or_default();
        let identity = status
            .authenticated
            .unwrap_or(false)
            .then(|| status.user.unwrap_or_default());
        locked(&self.tokens).put(
            token.to_owned(),
            identity.clone(),
            AUTHN_TTL,
            Instant::now(),
        );
        Ok(identity)
    }

    async fn authorize(
        &self,
        token: &str,
        user: &UserInfo,
        verb: String,
        path: &str,
    ) -> Result<bool, Refusal> {
        let key = (token.to_owned(), verb, path.to_owned());
        if let Some(known) = locked(&self.access).get(&key, Instant::now()) {
            return Ok(known);
        }
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username.clone(),
                groups: user.groups.clone(),
                uid: user.uid.clone(),
                extra: user.extra.clone(),
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(key.2.clone()),
                    verb: Some(key.1.clone()),
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|source| Refusal::AccessReview {
                user: user.username.clone().unwrap_or_default(),
                source,
            })?;
        let allowed = answer.status.is_some_and(|s| s.allowed);
        let ttl = if allowed { ALLOW_TTL } else { DENY_TTL };
        locked(&self.access).put(key, allowed, ttl, Instant::now());
        Ok(allowed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(http::header::AUTHORIZATION, value.parse().unwrap());
        h
    }

    #[test]
    fn only_a_non_empty_bearer_token_is_taken() {
        assert_eq!(bearer(&headers("Bearer abc")), Some("abc"));
        assert_eq!(bearer(&headers("bearer  abc ")), Some("abc"));
        assert_eq!(bearer(&headers("Basic abc")), None);
        assert_eq!(bearer(&headers("Bearer ")), None);
        assert_eq!(bearer(&HeaderMap::new()), None);
    }

    #[test]
    fn cached_answers_expire_and_the_cache_stays_bounded() {
        let mut cache = Cache::new();
        let now = Instant::now();
        cache.put("a".to_owned(), true, DENY_TTL, now);
        assert_eq!(cache.get(&"a".to_owned(), now), Some(true));
        assert_eq!(cache.get(&"a".to_owned(), now + DENY_TTL), None, "expired");
        for i in 0..CACHE_ENTRIES * 3 {
            cache.put(format!("t{i}"), false, AUTHN_TTL, now);
        }
        assert!(cache.entries.len() <= CACHE_ENTRIES);
    }

    #[test]
    fn refusals_answer_with_upstream_statuses_and_texts() {
        assert_eq!(Refusal::Unauthenticated.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(Refusal::Unauthenticated.to_string(), "Unauthorized");
        let denied = Refusal::Denied("system:serviceaccount:ns:sa".into());
        assert_eq!(denied.status(), StatusCode::FORBIDDEN);
        assert_eq!(
            denied.to_string(),
            "Authorization denied for user system:serviceaccount:ns:sa"
        );
    }
}
