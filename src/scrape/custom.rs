//! Reading `core-metrics-extractor`'s `customMetrics` ([`crate::config::CustomMetrics`]) from
//! an exposition: each configured series of the endpoint's engine becomes an endpoint
//! attribute. Of several matching series the first is read (upstream takes the one with the
//! latest timestamp, and model servers send none); a series the page lacks leaves its
//! attribute absent.

use super::parse::samples_named;
use crate::config::CustomMetrics;
use crate::endpoint::EngineType;

/// The attributes an exposition of an `engine` endpoint carries.
pub(crate) fn read(custom: &CustomMetrics, text: &str, engine: EngineType) -> Vec<(String, f64)> {
    let mine: Vec<_> = custom.of(engine).collect();
    if mine.is_empty() {
        return Vec::new();
    }
    let mut out: Vec<(String, f64)> = Vec::new();
    let wanted = |name: &str| mine.iter().any(|(_, s)| s.name() == name);
    for s in samples_named(text, wanted) {
        for (key, spec) in &mine {
            let taken = out.iter().any(|(k, _)| k == key);
            if !taken && spec.matches(s.name, |k| s.label(k)) {
                out.push(((*key).to_owned(), s.value));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SeriesSpec;

    #[test]
    fn each_engine_reads_its_own_series_the_first_match_winning() {
        let mut c = CustomMetrics::default();
        let spec = |t| SeriesSpec::parse(t).unwrap();
        c.add(
            EngineType::Vllm,
            "slots".into(),
            spec("free_slots{kind=gpu}"),
        );
        c.add(
            EngineType::Vllm,
            "queue".into(),
            spec("vllm:num_requests_waiting"),
        );
        c.add(
            EngineType::Sglang,
            "other".into(),
            spec("vllm:num_requests_waiting"),
        );
        let text = "# HELP x\nfree_slots{kind=\"cpu\"} 9\nfree_slots{kind=\"gpu\"} 3\nfree_slots{kind=\"gpu\"} 4\nvllm:num_requests_waiting{model_name=\"m\"} 2\n";
        let got = read(&c, text, EngineType::Vllm);
        assert_eq!(got, [("slots".into(), 3.0), ("queue".into(), 2.0)]);
        assert_eq!(read(&c, text, EngineType::Sglang), [("other".into(), 2.0)]);
        assert_eq!(read(&c, text, EngineType::TrtllmServe), []);
        assert_eq!(read(&c, "nothing 1\n", EngineType::Vllm), []);
    }
}
