//! The bootstrap templates in `config/envoy/`, where the Envoy binary lives, and how a template
//! becomes a config: every `${NAME}` is replaced by its value, and a placeholder without a value
//! is an error (so a typo cannot silently produce a config that validates but misroutes).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use super::EnvoyError;

/// Environment variable naming an Envoy binary to use instead of the one in `.venv-envoy`.
pub const ENVOY_ENV: &str = "EPP_ENVOY";

/// The value of `${EPP_TRANSPORT_SOCKET}` for TLS to the EPP: accept any certificate (the EPP's
/// is self-signed, as upstream deploys it) and negotiate HTTP/2 by ALPN.
pub const EPP_TLS_TRANSPORT_SOCKET: &str = "transport_socket: {name: envoy.transport_sockets.tls, \
     typed_config: {\"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext, \
     common_tls_context: {alpn_protocols: [h2], validation_context: {}}}}";

/// A bootstrap template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Template {
    /// ext_proc with FULL_DUPLEX_STREAMED bodies; ORIGINAL_DST by header (upstream's setup).
    Duplex,
    /// ext_proc with a BUFFERED request body and response headers only; ORIGINAL_DST by header.
    Buffered,
    /// ext_proc with FULL_DUPLEX_STREAMED bodies; STATIC pool cluster with the override_host policy.
    DuplexOverrideHost,
    /// No ext_proc: STATIC pool cluster, ROUND_ROBIN (benchmark baseline).
    RoundRobin,
    /// No ext_proc: STATIC pool cluster, LEAST_REQUEST (benchmark baseline).
    LeastRequest,
    /// Any other template file using the same placeholders.
    File(PathBuf),
}

impl Template {
    /// Where the template file is.
    pub fn path(&self) -> PathBuf {
        let dir = repo_root().join("config").join("envoy");
        match self {
            Self::Duplex => dir.join("duplex.yaml"),
            Self::Buffered => dir.join("buffered.yaml"),
            Self::DuplexOverrideHost => dir.join("duplex-override-host.yaml"),
            Self::RoundRobin => dir.join("roundrobin.yaml"),
            Self::LeastRequest => dir.join("leastrequest.yaml"),
            Self::File(path) => path.clone(),
        }
    }

    /// Whether the config routes through ext_proc (and so needs `EPP_PORT`).
    pub fn uses_ext_proc(&self) -> bool {
        !matches!(self, Self::RoundRobin | Self::LeastRequest)
    }
}

/// The repository root (the grandparent of this crate, `e2e/harness`).
pub fn repo_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .nth(2)
        .map_or_else(|| manifest.join("../.."), Path::to_path_buf)
}

/// Finds the Envoy binary: `$EPP_ENVOY`, then the real binary inside `<repo>/.venv-envoy`, then
/// the venv's `bin/envoy` shim.
pub fn envoy_binary() -> Result<PathBuf, EnvoyError> {
    if let Some(path) = std::env::var_os(ENVOY_ENV) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(EnvoyError::NotInstalled(format!(
                "{ENVOY_ENV}={} is not a file",
                path.display()
            )))
        };
    }
    let venv = repo_root().join(".venv-envoy");
    let candidates = venv_site_binaries(&venv)
        .into_iter()
        .chain([venv.join("bin").join("envoy")]);
    for candidate in candidates {
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    Err(EnvoyError::NotInstalled(format!(
        "no envoy binary under {}",
        venv.display()
    )))
}

/// `<venv>/lib/python3*/site-packages/envoy/_bin/envoy`, for every python3 directory present.
fn venv_site_binaries(venv: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(venv.join("lib")) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("python3"))
        .map(|entry| entry.path().join("site-packages/envoy/_bin/envoy"))
        .collect();
    found.sort();
    found
}

/// The value of `${POOL_ENDPOINTS}`: a YAML flow list of `lb_endpoints`.
pub fn pool_endpoints_yaml(endpoints: &[SocketAddr]) -> String {
    let items: Vec<String> = endpoints
        .iter()
        .map(|ep| {
            format!(
                "{{endpoint: {{address: {{socket_address: {{address: {}, port_value: {}}}}}}}}}",
                ep.ip(),
                ep.port()
            )
        })
        .collect();
    format!("[{}]", items.join(", "))
}

/// One epp replica in a health-checked ext_proc cluster (`config/envoy/ha-*.yaml`): its ext_proc
/// address and the port of its gRPC health service (`--grpc-health-port`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Replica {
    pub grpc: SocketAddr,
    pub health_port: u16,
}

/// The value of `${EPP_HA_ENDPOINTS}` (and of `${EPP_PRIMARY_ENDPOINTS}` /
/// `${EPP_STANDBY_ENDPOINTS}`): a YAML flow list of `lb_endpoints`, each health-checked on its
/// replica's health port.
pub fn ha_endpoints_yaml(replicas: &[Replica]) -> String {
    let items: Vec<String> = replicas
        .iter()
        .map(|r| {
            format!(
                "{{endpoint: {{address: {{socket_address: {{address: {}, port_value: {}}}}}, \
                 health_check_config: {{port_value: {}}}}}}}",
                r.grpc.ip(),
                r.grpc.port(),
                r.health_port
            )
        })
        .collect();
    format!("[{}]", items.join(", "))
}

/// Replaces every `${NAME}` in `template` with `vars[NAME]`.
pub fn render(template: &str, vars: &BTreeMap<String, String>) -> Result<String, EnvoyError> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after.find('}').ok_or_else(|| {
            EnvoyError::Template(format!("unterminated placeholder at `{}`", &rest[start..]))
        })?;
        let name = &after[..end];
        let value = vars
            .get(name)
            .ok_or_else(|| EnvoyError::Template(format!("no value for placeholder ${{{name}}}")))?;
        out.push_str(value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ha_endpoints_name_each_replica_and_its_health_port() {
        let replicas = [
            Replica {
                grpc: "127.0.0.1:9002".parse().unwrap(),
                health_port: 9003,
            },
            Replica {
                grpc: "127.0.0.1:9102".parse().unwrap(),
                health_port: 9103,
            },
        ];
        assert_eq!(
            ha_endpoints_yaml(&replicas),
            "[{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: 9002}}, \
             health_check_config: {port_value: 9003}}}, {endpoint: {address: {socket_address: \
             {address: 127.0.0.1, port_value: 9102}}, health_check_config: {port_value: 9103}}}]"
        );
    }

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn render_replaces_every_placeholder() {
        let out = render("a ${X} b ${Y} ${X}", &vars(&[("X", "1"), ("Y", "")])).unwrap();
        assert_eq!(out, "a 1 b  1");
    }

    #[test]
    fn render_rejects_a_placeholder_without_value() {
        let err = render("port ${PORTT}", &vars(&[("PORT", "1")])).unwrap_err();
        assert!(err.to_string().contains("PORTT"), "{err}");
    }

    #[test]
    fn render_rejects_an_unterminated_placeholder() {
        assert!(render("port ${PORT", &vars(&[("PORT", "1")])).is_err());
    }

    #[test]
    fn pool_endpoints_render_as_a_flow_list() {
        let eps = [
            "127.0.0.1:1".parse().unwrap(),
            "127.0.0.1:2".parse().unwrap(),
        ];
        assert_eq!(
            pool_endpoints_yaml(&eps),
            "[{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: 1}}}}, \
             {endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: 2}}}}]"
        );
    }

    #[test]
    fn every_shipped_template_exists() {
        for t in [
            Template::Duplex,
            Template::Buffered,
            Template::DuplexOverrideHost,
            Template::RoundRobin,
            Template::LeastRequest,
        ] {
            assert!(t.path().is_file(), "{}", t.path().display());
        }
    }
}
