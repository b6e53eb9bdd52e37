//! `/metrics?name[]=...`: prometheus_client's restricted registry, which vLLM and SGLang serve
//! because they mount `make_asgi_app`. Only samples whose name is listed are kept; a family
//! keeps its `# HELP`/`# TYPE` lines when at least one of its samples is kept, and disappears
//! otherwise (prometheus_client's `_restricted_metric`).

/// The names a query asks for, or `None` when it names none (the whole page).
pub fn requested_names(query: Option<&str>) -> Option<Vec<String>> {
    let names: Vec<String> = crate::http::query::pairs(query)
        .filter(|(key, _)| key == "name[]")
        .map(|(_, value)| value)
        .collect();
    (!names.is_empty()).then_some(names)
}

/// The exposition restricted to the samples named in `names`.
pub fn restrict(text: &str, names: &[String]) -> String {
    let mut out = String::new();
    // The current family's comment lines, written once a sample of it is kept.
    let mut header = String::new();
    let mut header_written = false;
    for line in text.lines() {
        if line.starts_with("# HELP ") {
            header.clear();
            header_written = false;
        }
        if line.starts_with('#') {
            if !header_written {
                header.push_str(line);
                header.push('\n');
            }
            continue;
        }
        let name = line.split(['{', ' ']).next().unwrap_or("");
        if names.iter().any(|n| n == name) {
            if !header_written {
                out.push_str(&header);
                header_written = true;
            }
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "# HELP vllm:num_requests_running Number of requests.\n\
# TYPE vllm:num_requests_running gauge\n\
vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 2.0\n\
# HELP vllm:e2e_request_latency_seconds Latency.\n\
# TYPE vllm:e2e_request_latency_seconds histogram\n\
vllm:e2e_request_latency_seconds_bucket{engine=\"0\",le=\"0.3\",model_name=\"m\"} 1.0\n\
vllm:e2e_request_latency_seconds_count{engine=\"0\",model_name=\"m\"} 1.0\n\
# HELP vllm:num_requests_waiting Waiting.\n\
# TYPE vllm:num_requests_waiting gauge\n\
vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 5.0\n";

    #[test]
    fn a_query_names_series_in_prometheus_clients_encoding() {
        assert_eq!(
            requested_names(Some("name%5B%5D=vllm%3Anum_requests_waiting&x=1&name[]=b")),
            Some(vec!["vllm:num_requests_waiting".to_owned(), "b".to_owned()])
        );
        assert_eq!(requested_names(Some("x=1")), None);
        assert_eq!(requested_names(None), None);
    }

    #[test]
    fn only_named_samples_and_their_families_headers_are_kept() {
        let names = vec![
            "vllm:num_requests_waiting".to_owned(),
            "vllm:e2e_request_latency_seconds_count".to_owned(),
        ];
        assert_eq!(
            restrict(PAGE, &names),
            "# HELP vllm:e2e_request_latency_seconds Latency.\n\
# TYPE vllm:e2e_request_latency_seconds histogram\n\
vllm:e2e_request_latency_seconds_count{engine=\"0\",model_name=\"m\"} 1.0\n\
# HELP vllm:num_requests_waiting Waiting.\n\
# TYPE vllm:num_requests_waiting gauge\n\
vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 5.0\n"
        );
        assert_eq!(restrict(PAGE, &["nothing".to_owned()]), "");
    }
}
