//! `header-label-affinity-scorer` (llm-d v0.10, alpha): a soft preference for the endpoints
//! whose label `labelKey` equals the request's header `headerName`. A match scores 1, every
//! other endpoint 0 and stays eligible (a filter would drop it); no header, or an empty one,
//! scores every endpoint 0. One instance per header-to-label mapping, so each preference has
//! its own weight in the profile (upstream's example: a DisaggregatedSet slice, a zone).
//!
//! The comparison is exact, as upstream's: the header value is not trimmed, and the header
//! name is matched in lower case (how both EPPs store request headers).

use crate::plugin::Invalid;
use crate::scheduling::lifecycle::{Lifecycle, Owned};
use crate::scheduling::{Candidate, SchedulingRequest};

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct HeaderLabelAffinityScorer {
    /// The request header holding the preferred label value (required).
    pub(crate) header_name: String,
    /// The endpoint label compared with it (required).
    pub(crate) label_key: String,
    /// The instance's identity: its clones in several profiles declare the header once.
    #[serde(skip)]
    instance: Owned<()>,
}

impl HeaderLabelAffinityScorer {
    /// Upstream's checks and messages; the header name is lower-cased, as upstream does.
    pub(crate) fn validate(mut self) -> Result<Self, Invalid> {
        if self.header_name.is_empty() {
            return Err(Invalid::new(
                "headerName",
                "header-label-affinity-scorer headerName is required",
            ));
        }
        if self.label_key.is_empty() {
            return Err(Invalid::new(
                "labelKey",
                "header-label-affinity-scorer labelKey is required",
            ));
        }
        self.header_name = self.header_name.to_ascii_lowercase();
        Ok(self)
    }

    pub(crate) fn score(&self, req: &SchedulingRequest<'_>, pool: &[&Candidate], out: &mut [f64]) {
        let wanted = req.headers.get(&self.header_name).filter(|v| !v.is_empty());
        for (o, c) in out.iter_mut().zip(pool) {
            let matches = wanted
                .is_some_and(|w| c.labels.get(&self.label_key).map(String::as_str) == Some(w));
            *o = if matches { 1.0 } else { 0.0 };
        }
    }
}

impl Lifecycle for HeaderLabelAffinityScorer {
    fn headers(&self) -> Vec<&str> {
        vec![&self.header_name]
    }

    fn instance(&self) -> usize {
        self.instance.instance()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::lifecycle::Headers;
    use crate::scheduling::testing::labelled;

    fn scorer() -> HeaderLabelAffinityScorer {
        HeaderLabelAffinityScorer {
            header_name: "X-Preferred-Zone".into(),
            label_key: "zone".into(),
            ..Default::default()
        }
        .validate()
        .unwrap()
    }

    fn scores(s: &HeaderLabelAffinityScorer, headers: &Headers) -> Vec<f64> {
        let cands = [
            labelled(1, &[("zone", "a")]),
            labelled(2, &[("zone", "b")]),
            labelled(3, &[]),
        ];
        let pool: Vec<&Candidate> = cands.iter().collect();
        let req = SchedulingRequest {
            headers,
            ..Default::default()
        };
        let mut out = vec![f64::NAN; 3];
        s.score(&req, &pool, &mut out);
        out
    }

    #[test]
    fn endpoints_whose_label_equals_the_header_score_one_and_the_rest_zero() {
        let s = scorer();
        assert_eq!(s.headers(), vec!["x-preferred-zone"]);
        let zone_b = Headers::of(&[("x-preferred-zone", "b")]);
        assert_eq!(scores(&s, &zone_b), vec![0.0, 1.0, 0.0]);
    }

    #[test]
    fn no_header_or_an_empty_or_unmatched_one_scores_every_endpoint_zero() {
        let s = scorer();
        assert_eq!(scores(&s, &Headers::default()), vec![0.0; 3]);
        let empty = Headers::of(&[("x-preferred-zone", "")]);
        assert_eq!(scores(&s, &empty), vec![0.0; 3]);
        let padded = Headers::of(&[("x-preferred-zone", " a")]);
        assert_eq!(scores(&s, &padded), vec![0.0; 3], "compared exactly");
    }

    #[test]
    fn header_name_and_label_key_are_required() {
        let no_header = HeaderLabelAffinityScorer {
            label_key: "zone".into(),
            ..Default::default()
        };
        assert_eq!(no_header.validate().unwrap_err().parameter, "headerName");
        let no_label = HeaderLabelAffinityScorer {
            header_name: "x-zone".into(),
            ..Default::default()
        };
        assert_eq!(no_label.validate().unwrap_err().parameter, "labelKey");
    }
}
