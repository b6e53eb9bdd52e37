//! The registered families: upstream's names, the model-label cap, closed-set labels.

use super::*;

#[test]
fn exposes_upstream_names() {
    let mut registry = Registry::default();
    let m = Metrics::register(&mut registry);
    let labels = RequestLabels {
        model_name: m.model("m"),
        target_model_name: m.model("m"),
        priority: "0".into(),
    };
    m.request_total.get_or_create(&labels).inc();
    m.pool_ready_pods
        .get_or_create(&PoolLabels { name: "p".into() })
        .set(2);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(text.contains("inference_objective_request_total{model_name=\"m\",target_model_name=\"m\",priority=\"0\"} 1"), "{text}");
    assert!(text.contains("inference_pool_ready_pods{name=\"p\"} 2"));
    assert!(
        text.contains(
            "llm_d_epp_request_total{model_name=\"m\",target_model_name=\"m\",priority=\"0\"} 1"
        ),
        "{text}"
    );
    assert!(text.contains("llm_d_epp_ready_endpoints{name=\"p\"} 2"));
    assert!(text.contains("# TYPE inference_extension_scheduler_e2e_duration_seconds histogram"));
}

mod labels {
    use super::*;

    fn text(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        text
    }

    #[test]
    fn request_series_beyond_a_thousand_models_collapse_into_other() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        for i in 0..model::MODEL_LABEL_CAP + 50 {
            let name = m.model(&format!("model-{i}"));
            let labels = RequestLabels {
                model_name: name.clone(),
                target_model_name: name,
                priority: "0".into(),
            };
            m.request_total.get_or_create(&labels).inc();
        }
        let text = text(&registry);
        let series = text
            .lines()
            .filter(|l| l.starts_with("inference_objective_request_total{"))
            .count();
        assert_eq!(
            series,
            model::MODEL_LABEL_CAP + 1,
            "a thousand names and `other`"
        );
        assert!(text.contains(
            r#"inference_objective_request_total{model_name="other",target_model_name="other",priority="0"} 50"#
        ));
    }

    #[test]
    fn closed_set_labels_encode_as_their_upstream_names() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        let labels = ErrorLabels {
            model_name: m.model("m"),
            target_model_name: m.model("m"),
            error_code: ErrorCode::RequestHeaderFieldsTooLarge,
        };
        m.request_error_total.get_or_create(&labels).inc();
        let attempt = AttemptLabels {
            status: Outcome::success,
            target_model_name: m.model("m"),
            pod_name: String::new(),
            namespace: String::new(),
            port: String::new(),
        };
        m.scheduler_attempts.get_or_create(&attempt).inc();
        let text = text(&registry);
        assert!(
            text.contains(r#"error_code="RequestHeaderFieldsTooLarge""#),
            "{text}"
        );
        assert!(
            text.contains(r#"inference_extension_scheduler_attempts_total{status="success""#),
            "{text}"
        );
    }
}
