//! `mm-embeddings-cache-producer` (llm-d v0.10, beta): which pod is believed to hold the
//! encoder output (embeddings) of each multimodal item, for `mm-embeddings-cache-scorer`
//! ([`crate::scheduling::scorer`]).
//!
//! A request's items ([`crate::request::multimodal`]: each image, video or audio part, by the
//! hash of its URL or inline data) are recorded on the pod the request is placed on
//! (`pre_request`, the primary pick, as upstream records its primary profile's target). Each
//! pod keeps an LRU of item hashes sized as upstream sizes it: `cacheSizeInMBPerServer` over
//! 2 MiB an item. Once a minute the request's candidates are noted as present; a pod absent
//! from those notes for [`FORGET_AFTER`] has left the pool and is forgotten (upstream sweeps
//! against its pod list every two minutes). A request without items costs that check alone.

use crate::endpoint::EndpointId;
use crate::metrics::encoder_cache;
use crate::plugin::Invalid;
use crate::request::multimodal::Item;
use crate::scheduling::lifecycle::{Lifecycle, Owned, Placed};
use lru::LruCache;
use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

/// A pod no request has had as a candidate for this long is forgotten.
pub const FORGET_AFTER: Duration = Duration::from_secs(10 * 60);

/// Upstream's estimate of one item's encoder output.
const BYTES_PER_ITEM: usize = 2 * 1024 * 1024;

#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct MmEmbeddingsCache {
    /// The encoder cache each pod is assumed to have, MiB (upstream's default: 4096).
    pub(crate) cache_size_in_mb_per_server: usize,
    #[serde(skip)]
    state: Owned<Pods>,
}

impl Default for MmEmbeddingsCache {
    fn default() -> Self {
        Self {
            cache_size_in_mb_per_server: 4096,
            state: Owned::default(),
        }
    }
}

/// Every pod's items, and when each pod was last a candidate.
#[derive(Default)]
struct Pods {
    /// The instance's name (the metrics' `plugin_name`).
    name: String,
    caches: HashMap<EndpointId, LruCache<u64, ()>>,
    seen: HashMap<EndpointId, Instant>,
    swept: Option<Instant>,
}

impl MmEmbeddingsCache {
    pub(crate) fn validate(self) -> Result<Self, Invalid> {
        if self.cache_size_in_mb_per_server == 0 {
            return Err(Invalid::new(
                "cacheSizeInMBPerServer",
                "cacheSizeInMBPerServer must be > 0",
            ));
        }
        Ok(self)
    }

    /// Items one pod's cache holds.
    fn capacity(&self) -> NonZeroUsize {
        let items = self.cache_size_in_mb_per_server.saturating_mul(1024 * 1024) / BYTES_PER_ITEM;
        NonZeroUsize::new(items).unwrap_or(NonZeroUsize::MIN)
    }

    /// How many of `items` pod `id` is believed to hold.
    pub(crate) fn matched(&self, id: EndpointId, items: &[Item]) -> usize {
        self.state.lock().held(id, items)
    }
}

impl Pods {
    /// How many of `items` pod `id`'s cache holds (without touching their recency).
    fn held(&self, id: EndpointId, items: &[Item]) -> usize {
        self.caches.get(&id).map_or(0, |cache| {
            items.iter().filter(|i| cache.contains(&i.hash)).count()
        })
    }

    /// The request's items, now on the pod it was placed on (counted first).
    fn record(&mut self, placed: &Placed<'_>, capacity: NonZeroUsize) {
        self.count_lookups(placed);
        let cache = self
            .caches
            .entry(placed.primary)
            .or_insert_with(|| LruCache::new(capacity));
        for item in placed.request.multimodal_items {
            cache.put(item.hash, ());
        }
    }

    /// Upstream's lookup metrics for the request's items, before its placement is recorded:
    /// each item queried, each pod cache holding it a hit, each candidate's share observed.
    fn count_lookups(&self, placed: &Placed<'_>) {
        let items = placed.request.multimodal_items;
        for item in items {
            let modality = item.modality.name();
            encoder_cache::query(&self.name, modality);
            for (id, cache) in &self.caches {
                if cache.contains(&item.hash) {
                    let pod = placed.request.names.name_of(*id);
                    encoder_cache::hit(&self.name, pod.unwrap_or_else(|| id.to_string()), modality);
                }
            }
        }
        for c in placed.candidates {
            encoder_cache::ratio(&self.name, self.held(c.id, items), items.len());
        }
    }

    /// Once a minute: notes the request's candidates as present, and forgets the pods absent
    /// from every such note for [`FORGET_AFTER`].
    fn sweep(&mut self, placed: &Placed<'_>) {
        let now = placed.now;
        let due = self
            .swept
            .is_none_or(|t| now.saturating_duration_since(t) >= Duration::from_secs(60));
        if !due {
            return;
        }
        self.swept = Some(now);
        for c in placed.candidates {
            self.seen.insert(c.id, now);
        }
        self.seen
            .retain(|_, t| now.saturating_duration_since(*t) < FORGET_AFTER);
        let seen = &self.seen;
        self.caches.retain(|id, _| seen.contains_key(id));
    }
}

impl Lifecycle for MmEmbeddingsCache {
    fn pre_request(&self, placed: &Placed<'_>) {
        let mut state = self.state.lock();
        state.sweep(placed);
        if !placed.request.multimodal_items.is_empty() {
            state.record(placed, self.capacity());
        }
    }

    fn snapshot(&self) -> Option<serde_json::Value> {
        let state = self.state.lock();
        let pods: Vec<serde_json::Value> = state
            .caches
            .iter()
            .map(|(id, c)| serde_json::json!({"endpoint": id.to_string(), "items": c.len()}))
            .collect();
        Some(serde_json::json!({ "pods": pods }))
    }

    fn observer(&self) -> Option<super::Observer> {
        Some(super::Observer::MmEmbeddings(self.clone()))
    }

    fn name_instance(&self, name: &str) {
        self.state.lock().name = name.to_owned();
    }

    fn instance(&self) -> usize {
        self.state.instance()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::multimodal::Modality;
    use crate::scheduling::lifecycle::place_on;
    use crate::scheduling::testing::cand;
    use crate::scheduling::SchedulingRequest;

    fn image(hash: u64) -> Item {
        Item {
            modality: Modality::Image,
            hash,
        }
    }

    #[test]
    fn a_pod_holds_the_items_of_the_requests_placed_on_it_up_to_its_capacity() {
        // 4 MiB: two items a pod.
        let p = MmEmbeddingsCache {
            cache_size_in_mb_per_server: 4,
            ..MmEmbeddingsCache::default()
        }
        .validate()
        .unwrap();
        let (a, b) = (cand(1, 0.0, 0.0, 0), cand(2, 0.0, 0.0, 0));
        let items = [image(1), image(2)];
        let req = SchedulingRequest {
            multimodal_items: &items,
            ..SchedulingRequest::default()
        };
        place_on(&p, 1, &req, &a);
        assert_eq!(p.matched(a.id, &items), 2);
        assert_eq!(p.matched(b.id, &items), 0);
        let third = [image(3)];
        let req = SchedulingRequest {
            multimodal_items: &third,
            ..SchedulingRequest::default()
        };
        place_on(&p, 2, &req, &a);
        assert_eq!(
            p.matched(a.id, &items),
            1,
            "the least recent item is evicted"
        );
        assert_eq!(p.matched(a.id, &third), 1);
    }

    #[test]
    fn lookups_are_counted_under_upstreams_names() {
        let p = MmEmbeddingsCache::default();
        p.name_instance("mm-counter-test");
        let a = cand(1, 0.0, 0.0, 0);
        let items = [image(7)];
        let req = SchedulingRequest {
            multimodal_items: &items,
            ..SchedulingRequest::default()
        };
        place_on(&p, 1, &req, &a);
        place_on(&p, 2, &req, &a);
        let mut registry = prometheus_client::registry::Registry::default();
        let _m = crate::metrics::Metrics::register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let queries = "llm_d_epp_encoder_cache_queries_total{plugin_type=\"mm-embeddings-cache-producer\",plugin_name=\"mm-counter-test\",modality=\"image\"} 2";
        assert!(text.contains(queries), "{text}");
        assert!(
            text.contains(
                "plugin_name=\"mm-counter-test\",pod=\"10.0.0.1:1\",modality=\"image\"} 1"
            ),
            "the second lookup hit: {text}"
        );
        assert!(text.contains("llm_d_epp_encoder_cache_hit_ratio_count{plugin_type=\"mm-embeddings-cache-producer\",plugin_name=\"mm-counter-test\"} 2"), "{text}");
    }

    #[test]
    fn a_zero_cache_is_refused() {
        let bad = MmEmbeddingsCache {
            cache_size_in_mb_per_server: 0,
            ..MmEmbeddingsCache::default()
        };
        assert!(bad.validate().is_err());
    }
}
