//! A real Kubernetes API server for tests: etcd 3.6 and kube-apiserver 1.36 (built by
//! `hack/install-kube.sh`) on 127.0.0.1, with generated certificates, RBAC authorization, the
//! default admission plugins and ServiceAccount token signing.
//!
//! One server per test binary ([`KubeApiServer::shared`]; under cargo-nextest, which runs each
//! test in its own process, one per test: start-up takes about 2 s), one namespace per test
//! ([`KubeApiServer::namespace`]) so tests stay independent. The admin client authenticates
//! with a client certificate in `system:masters`; [`KubeApiServer::token_kubeconfig`] writes a
//! kubeconfig for a ServiceAccount token minted with TokenRequest, so epp can run with exactly
//! the permissions the chart grants. There is no controller-manager, scheduler or kubelet:
//! tests create a namespace's `default` ServiceAccount themselves, bind pods to a node name
//! when they need graceful deletion, and patch pod status (IP, Ready) through `pods/status`.
//!
//! The binaries come from `$EPP_KUBE_BIN` or `<repo>/.kube-bin`; without them every test
//! fails with a message naming `hack/install-kube.sh`. Processes run under a supervisor that
//! stops them by PID when the test binary exits ([`process`]); their directory (certificates,
//! etcd data, logs) is removed then, unless `EPP_KEEP_KUBE_DIR=1`.

pub mod apply;
pub mod certs;
pub mod objects;
pub mod process;

use crate::ports;
use certs::CertFiles;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, ObjectMeta, PostParams};
use process::Supervised;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

/// How long a server may take to become ready (2 shared cores, cold page cache).
const READY_WITHIN: Duration = Duration::from_secs(120);

#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error(
        "no {binary} in {dir}: run hack/install-kube.sh first (it builds kube-apiserver and etcd \
         from the Go module proxy into .kube-bin; EPP_KUBE_BIN overrides the directory)"
    )]
    Missing { binary: &'static str, dir: PathBuf },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("generating certificates: {0}")]
    Cert(#[from] rcgen::Error),
    #[error("{what} did not start: {detail}; log {log}")]
    Start {
        what: &'static str,
        detail: String,
        log: PathBuf,
    },
    #[error("Kubernetes client: {0}")]
    Kube(#[from] kube::Error),
    #[error("kubeconfig: {0}")]
    Config(String),
    #[error("etcd: {0}")]
    Etcd(String),
}

impl KubeError {
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            path: path.to_owned(),
            source,
        }
    }
}

/// Where the fixture looks for `kube-apiserver` and `etcd`.
pub fn bin_dir() -> PathBuf {
    std::env::var_os("EPP_KUBE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.kube-bin"))
}

/// A running etcd + kube-apiserver pair.
#[derive(Debug)]
pub struct KubeApiServer {
    dir: PathBuf,
    certs: CertFiles,
    bin: PathBuf,
    apiserver_port: u16,
    etcd_port: u16,
    _etcd: Supervised,
    apiserver: Mutex<Option<Supervised>>,
}

/// A namespace of one test, with an admin client defaulting to it.
#[derive(Clone)]
pub struct TestNamespace {
    pub name: String,
    pub client: kube::Client,
}

static SHARED: tokio::sync::OnceCell<KubeApiServer> = tokio::sync::OnceCell::const_new();

impl KubeApiServer {
    /// The test binary's server, started on first use. Panics (failing the test) with the
    /// reason, e.g. missing binaries.
    pub async fn shared() -> &'static Self {
        match SHARED.get_or_try_init(Self::start).await {
            Ok(server) => server,
            Err(e) => panic!("real API server: {e}"),
        }
    }

    /// Starts etcd and kube-apiserver and waits until the API server is ready.
    pub async fn start() -> Result<Self, KubeError> {
        let bin = bin_dir();
        for binary in ["etcd", "kube-apiserver"] {
            if !bin.join(binary).is_file() {
                return Err(KubeError::Missing { binary, dir: bin });
            }
        }
        let dir = std::env::temp_dir().join(format!(
            "epp-kube-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).map_err(|e| KubeError::io(&dir, e))?;
        let certs = certs::write(&dir)?;
        let etcd_port = ports::free_range(2).map_err(|e| KubeError::io(&dir, e))?;
        let apiserver_port = ports::free_port().map_err(|e| KubeError::io(&dir, e))?;
        let keep = std::env::var_os("EPP_KEEP_KUBE_DIR").is_some_and(|v| v == "1");
        let etcd = Supervised::start(
            "etcd",
            &bin.join("etcd"),
            &etcd_args(&dir, etcd_port),
            &dir.join("etcd.log"),
            (!keep).then_some(dir.as_path()),
        )?;
        let server = Self {
            dir,
            certs,
            bin,
            apiserver_port,
            etcd_port,
            _etcd: etcd,
            apiserver: Mutex::new(None),
        };
        server.wait_etcd().await?;
        server.start_apiserver().await?;
        Ok(server)
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.apiserver_port)
    }

    /// The API server's address (what [`Self::url`] names).
    pub fn addr(&self) -> std::net::SocketAddr {
        ([127, 0, 0, 1], self.apiserver_port).into()
    }

    /// The cluster CA (PEM file) clients must trust.
    pub fn ca_file(&self) -> &Path {
        &self.certs.ca
    }

    /// The directory with certificates, etcd data and logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The API server's PID, while it runs.
    pub fn apiserver_pid(&self) -> Option<u32> {
        self.lock().as_ref().map(|p| p.pid)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Supervised>> {
        self.apiserver.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts kube-apiserver (again) on the same port and waits until `/readyz` answers ok.
    pub async fn start_apiserver(&self) -> Result<(), KubeError> {
        let proc = Supervised::start(
            "kube-apiserver",
            &self.bin.join("kube-apiserver"),
            &self.apiserver_args(),
            &self.dir.join("kube-apiserver.log"),
            None,
        )?;
        *self.lock() = Some(proc);
        self.wait_ready().await
    }

    /// Stops kube-apiserver: SIGKILL by PID when `kill`, else SIGTERM; waits for it to exit.
    pub fn stop_apiserver(&self, kill: bool) {
        let Some(proc) = self.lock().take() else {
            return;
        };
        if kill {
            proc.signal("KILL");
        }
        proc.stop();
    }

    fn apiserver_args(&self) -> Vec<String> {
        let c = &self.certs;
        let p = |p: &Path| p.display().to_string();
        vec![
            format!("--etcd-servers=http://127.0.0.1:{}", self.etcd_port),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={}", self.apiserver_port),
            format!("--cert-dir={}", p(&self.dir.join("apiserver-certs"))),
            format!("--tls-cert-file={}", p(&c.serving_cert)),
            format!("--tls-private-key-file={}", p(&c.serving_key)),
            format!("--client-ca-file={}", p(&c.ca)),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-account-key-file={}", p(&c.sa_public)),
            format!("--service-account-signing-key-file={}", p(&c.sa_private)),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            "--authorization-mode=RBAC".into(),
            // Tests compact etcd themselves (compact_etcd) when they want 410 Gone.
            "--etcd-compaction-interval=0".into(),
            // Fewer goroutines and no throttling of the tests' own bursts.
            "--enable-priority-and-fairness=false".into(),
        ]
    }

    async fn wait_etcd(&self) -> Result<(), KubeError> {
        let addr = ([127, 0, 0, 1], self.etcd_port).into();
        let deadline = tokio::time::Instant::now() + READY_WITHIN;
        loop {
            if let Ok(r) = crate::client::get(addr, "/health").await {
                if r.text().contains("\"true\"") {
                    return Ok(());
                }
            }
            if tokio::time::Instant::now() > deadline || !self._etcd.running() {
                return Err(KubeError::Start {
                    what: "etcd",
                    detail: self._etcd.tail(20),
                    log: self._etcd.log.clone(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the API server answers `/readyz` with ok.
    pub async fn wait_ready(&self) -> Result<(), KubeError> {
        let client = self.admin_client("default").await?;
        let deadline = tokio::time::Instant::now() + READY_WITHIN;
        loop {
            let req = http::Request::get("/readyz").body(Vec::new());
            if let Ok(req) = req {
                if client.request_text(req).await.is_ok_and(|t| t == "ok") {
                    return Ok(());
                }
            }
            let (alive, log, tail) = match self.lock().as_ref() {
                Some(p) => (p.running(), p.log.clone(), p.tail(20)),
                None => (false, self.dir.join("kube-apiserver.log"), String::new()),
            };
            if !alive || tokio::time::Instant::now() > deadline {
                return Err(KubeError::Start {
                    what: "kube-apiserver",
                    detail: tail,
                    log,
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Writes a kubeconfig for the admin (client certificate in `system:masters`).
    pub fn admin_kubeconfig(&self, path: &Path, namespace: &str) -> Result<(), KubeError> {
        let user = format!(
            "client-certificate: {}\n    client-key: {}",
            self.certs.admin_cert.display(),
            self.certs.admin_key.display()
        );
        self.write_kubeconfig(path, namespace, &user)
    }

    /// Writes a kubeconfig that authenticates with a bearer `token` (a ServiceAccount's).
    pub fn token_kubeconfig(
        &self,
        path: &Path,
        namespace: &str,
        token: &str,
    ) -> Result<(), KubeError> {
        self.write_kubeconfig(path, namespace, &format!("token: {token}"))
    }

    fn write_kubeconfig(&self, path: &Path, namespace: &str, user: &str) -> Result<(), KubeError> {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {}\n    certificate-authority: {}\nusers:\n- name: test\n  user:\n    {user}\ncontexts:\n- name: test\n  context: {{cluster: test, user: test, namespace: {namespace}}}\ncurrent-context: test\n",
            self.url(),
            self.certs.ca.display()
        );
        std::fs::write(path, text).map_err(|e| KubeError::io(path, e))
    }

    /// A client from a kubeconfig file.
    pub async fn client_from(path: &Path) -> Result<kube::Client, KubeError> {
        let kc = kube::config::Kubeconfig::read_from(path)
            .map_err(|e| KubeError::Config(e.to_string()))?;
        let config =
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| KubeError::Config(e.to_string()))?;
        Ok(kube::Client::try_from(config)?)
    }

    /// An admin client defaulting to `namespace`.
    pub async fn admin_client(&self, namespace: &str) -> Result<kube::Client, KubeError> {
        let path = self
            .dir
            .join(format!("admin-{}.kubeconfig", rand::random::<u32>()));
        self.admin_kubeconfig(&path, namespace)?;
        let client = Self::client_from(&path).await;
        let _ = std::fs::remove_file(&path);
        client
    }

    /// Creates a fresh namespace `<prefix>-<random>` and its `default` ServiceAccount (no
    /// controller-manager runs to create it, and the ServiceAccount admission plugin needs it).
    pub async fn namespace(&self, prefix: &str) -> Result<TestNamespace, KubeError> {
        let name = format!("{prefix}-{:08x}", rand::random::<u32>());
        let client = self.admin_client(&name).await?;
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await?;
        self.create_service_account(&client, &name, "default")
            .await?;
        Ok(TestNamespace { name, client })
    }

    /// Creates ServiceAccount `name` in `namespace`.
    pub async fn create_service_account(
        &self,
        client: &kube::Client,
        namespace: &str,
        name: &str,
    ) -> Result<(), KubeError> {
        let sa = ServiceAccount {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<ServiceAccount>::namespaced(client.clone(), namespace)
            .create(&PostParams::default(), &sa)
            .await?;
        Ok(())
    }

    /// Mints a token for ServiceAccount `namespace/name` (TokenRequest, 1 hour).
    pub async fn mint_token(&self, namespace: &str, name: &str) -> Result<String, KubeError> {
        let client = self.admin_client(namespace).await?;
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                expiration_seconds: Some(3600),
                ..Default::default()
            }),
            ..Default::default()
        };
        let answer = Api::<ServiceAccount>::namespaced(client, namespace)
            .create_token_request(name, &PostParams::default(), &request)
            .await?;
        answer
            .status
            .and_then(|s| s.token)
            .ok_or_else(|| KubeError::Config("TokenRequest answered without a token".into()))
    }

    /// Compacts etcd's history up to its current revision (through etcd's JSON gateway), so
    /// any watch resumed from an older resourceVersion gets `410 Gone`.
    pub async fn compact_etcd(&self) -> Result<i64, KubeError> {
        let addr = ([127, 0, 0, 1], self.etcd_port).into();
        let etcd_err = |e: &dyn std::fmt::Display| KubeError::Etcd(e.to_string());
        let range = crate::client::post_json(addr, "/v3/kv/range", r#"{"key":"Lw=="}"#)
            .await
            .map_err(|e| etcd_err(&e))?;
        let json = range.json().map_err(|e| etcd_err(&e))?;
        let revision: i64 = json["header"]["revision"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .ok_or_else(|| KubeError::Etcd(format!("no revision in {json}")))?;
        let body = format!(r#"{{"revision":"{revision}","physical":true}}"#);
        let answer = crate::client::post_json(addr, "/v3/kv/compaction", body)
            .await
            .map_err(|e| etcd_err(&e))?;
        if !answer.status.is_success() {
            return Err(KubeError::Etcd(answer.text()));
        }
        Ok(revision)
    }
}

fn etcd_args(dir: &Path, port: u16) -> Vec<String> {
    let peer = format!("http://127.0.0.1:{}", port + 1);
    let client = format!("http://127.0.0.1:{port}");
    vec![
        "--name=default".into(),
        format!("--data-dir={}", dir.join("etcd").display()),
        format!("--listen-client-urls={client}"),
        format!("--advertise-client-urls={client}"),
        format!("--listen-peer-urls={peer}"),
        format!("--initial-advertise-peer-urls={peer}"),
        format!("--initial-cluster=default={peer}"),
        // Test data: durability across a machine crash is not needed, speed is.
        "--unsafe-no-fsync".into(),
        "--log-level=warn".into(),
    ]
}
