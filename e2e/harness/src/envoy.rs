//! Runs a real Envoy 1.40 for a test: render a template from `config/envoy/` with free ports,
//! validate it, start Envoy as a child of the test process, wait until it is ready, and kill it
//! (by its PID) when the [`Envoy`] handle is dropped.
//!
//! Envoy is started with `--disable-hot-restart`, so it opens no shared-memory region or
//! hot-restart socket and any number of Envoys can run side by side (parallel tests need this).
//! Each Envoy gets its own temporary directory holding the rendered config, its stdout/stderr
//! (`envoy.log`) and the access log; the directory is kept if the test panics.

mod access_log;
mod process;
mod template;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub use access_log::{parse_all as parse_access_log, AccessLogEntry};
pub use process::Envoy;
pub use template::{
    envoy_binary, ha_endpoints_yaml, pool_endpoints_yaml, render, repo_root, Replica, Template,
    ENVOY_ENV, EPP_TLS_TRANSPORT_SOCKET,
};

/// What can go wrong when starting or talking to Envoy.
#[derive(Debug, thiserror::Error)]
pub enum EnvoyError {
    /// No Envoy binary was found.
    #[error("Envoy 1.40 is not installed ({0}): run hack/install-envoy.sh, or set EPP_ENVOY to an envoy binary")]
    NotInstalled(String),
    /// The template could not be rendered.
    #[error("rendering the Envoy template: {0}")]
    Template(String),
    /// A file or process operation failed.
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// `envoy --mode validate` rejected the rendered config.
    #[error("envoy rejected the config {config}:\n{output}")]
    Invalid { config: PathBuf, output: String },
    /// Envoy exited or did not become ready in time.
    #[error("envoy did not become ready: {reason}\n--- envoy.log ---\n{log}")]
    NotReady { reason: String, log: String },
    /// Something Envoy writes did not appear in time.
    #[error("waited {waited:?} for {what}")]
    Timeout { what: String, waited: Duration },
    /// The admin interface answered with an error status.
    #[error("envoy admin {path} answered {status}: {body}")]
    AdminStatus {
        path: String,
        status: http::StatusCode,
        body: String,
    },
    /// A request to the admin interface failed.
    #[error("envoy admin request {path}")]
    Admin {
        path: String,
        #[source]
        source: crate::client::ClientError,
    },
}

impl EnvoyError {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |source| Self::Io { what, source }
    }
}

/// How to run one Envoy. Build with [`EnvoyConfig::new`] and the setters, then [`start`](Self::start).
#[derive(Debug, Clone)]
pub struct EnvoyConfig {
    template: Template,
    /// The ext_proc servers: one epp, or several active-active replicas.
    epps: Vec<SocketAddr>,
    epp_tls: bool,
    pool: Vec<SocketAddr>,
    buffer_limit: Option<u32>,
    vars: BTreeMap<String, String>,
    concurrency: u32,
    log_level: String,
    ready_timeout: Duration,
}

impl EnvoyConfig {
    /// Defaults: no EPP, plaintext, empty pool, Envoy's default buffer limit, one worker,
    /// log level `warn`, 20 s to become ready.
    pub fn new(template: Template) -> Self {
        Self {
            template,
            epps: Vec::new(),
            epp_tls: false,
            pool: Vec::new(),
            buffer_limit: None,
            vars: BTreeMap::new(),
            concurrency: 1,
            log_level: "warn".to_owned(),
            ready_timeout: Duration::from_secs(20),
        }
    }

    /// The ext_proc server. Only its port is used: the templates connect to 127.0.0.1.
    pub fn epp(mut self, addr: SocketAddr) -> Self {
        self.epps = vec![addr];
        self
    }

    /// Several ext_proc servers (active-active epp replicas) in the ext_proc cluster, for
    /// templates that list `EPP_ENDPOINTS` ([`Template::Duplex`]); the others use the first.
    pub fn epp_replicas(mut self, addrs: impl IntoIterator<Item = SocketAddr>) -> Self {
        self.epps = addrs.into_iter().collect();
        self
    }

    /// Speak TLS (ALPN h2, any certificate accepted) to the ext_proc server.
    pub fn epp_tls(mut self, tls: bool) -> Self {
        self.epp_tls = tls;
        self
    }

    /// The model-server endpoints for templates with a STATIC pool cluster
    /// (override_host, round robin, least request); ignored by ORIGINAL_DST templates.
    pub fn pool(mut self, endpoints: impl IntoIterator<Item = SocketAddr>) -> Self {
        self.pool = endpoints.into_iter().collect();
        self
    }

    /// Sets the listener's `per_connection_buffer_limit_bytes` (upstream uses 32768).
    pub fn listener_buffer_limit(mut self, bytes: u32) -> Self {
        self.buffer_limit = Some(bytes);
        self
    }

    /// Sets an extra placeholder, for templates given as [`Template::File`].
    pub fn var(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.vars.insert(name.into(), value.into());
        self
    }

    /// Envoy worker threads (`--concurrency`).
    pub fn concurrency(mut self, workers: u32) -> Self {
        self.concurrency = workers;
        self
    }

    /// Envoy's `--log-level` (its log goes to `envoy.log` in the work directory).
    pub fn log_level(mut self, level: impl Into<String>) -> Self {
        self.log_level = level.into();
        self
    }

    /// How long to wait for admin `/ready` before giving up.
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout;
        self
    }

    /// Renders, validates and starts Envoy, and waits until it is ready.
    pub async fn start(self) -> Result<Envoy, EnvoyError> {
        Envoy::start(self).await
    }

    /// Every placeholder value except the ports, which are chosen per start attempt.
    fn vars(&self, access_log: &std::path::Path) -> Result<BTreeMap<String, String>, EnvoyError> {
        let mut vars = self.vars.clone();
        vars.insert("ACCESS_LOG".into(), access_log.display().to_string());
        vars.insert("POOL_ENDPOINTS".into(), pool_endpoints_yaml(&self.pool));
        let transport = if self.epp_tls {
            EPP_TLS_TRANSPORT_SOCKET
        } else {
            ""
        };
        vars.insert("EPP_TRANSPORT_SOCKET".into(), transport.to_owned());
        let limit = self
            .buffer_limit
            .map(|b| format!("per_connection_buffer_limit_bytes: {b}"))
            .unwrap_or_default();
        vars.insert("LISTENER_BUFFER_LIMIT".into(), limit);
        match self.epps.first() {
            Some(first) => {
                vars.insert("EPP_PORT".into(), first.port().to_string());
                let local: Vec<SocketAddr> = self
                    .epps
                    .iter()
                    .map(|a| SocketAddr::from(([127, 0, 0, 1], a.port())))
                    .collect();
                vars.insert("EPP_ENDPOINTS".into(), pool_endpoints_yaml(&local));
            }
            None if self.template.uses_ext_proc() => {
                return Err(EnvoyError::Template(format!(
                    "{} uses ext_proc: set EnvoyConfig::epp",
                    self.template.path().display()
                )));
            }
            None => {}
        }
        Ok(vars)
    }
}
