//! The running Envoy process: start-up (free ports, render, validate, spawn, wait for `/ready`),
//! the admin and access-log readers, and shutdown by PID on drop.
//!
//! Ports come from [`crate::ports`] (below the kernel's ephemeral range, checked by binding);
//! another process may still take one before Envoy binds it, and start-up then retries with new
//! ports when Envoy reports a bind failure.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::access_log::{parse_all, AccessLogEntry};
use super::template::{envoy_binary, render};
use super::{EnvoyConfig, EnvoyError};
use crate::client;

/// Start attempts when a chosen port was taken before Envoy could bind it.
const START_ATTEMPTS: u32 = 3;
/// How often start-up and log readers look again at the external process.
const POLL_INTERVAL: Duration = Duration::from_millis(25);

/// A running Envoy; dropping it kills the process and waits for it.
#[derive(Debug)]
pub struct Envoy {
    // Field order is drop order: stop the process before removing its directory.
    child: Child,
    admin: SocketAddr,
    listener: SocketAddr,
    config: PathBuf,
    access_log: PathBuf,
    log: PathBuf,
    dir: WorkDir,
}

impl Envoy {
    pub(super) async fn start(cfg: EnvoyConfig) -> Result<Self, EnvoyError> {
        let binary = envoy_binary()?;
        let template_path = cfg.template.path();
        let template = std::fs::read_to_string(&template_path).map_err(EnvoyError::io(format!(
            "reading {}",
            template_path.display()
        )))?;
        let mut dir = WorkDir::create()?;
        let vars = cfg.vars(&dir.path.join("access.log"))?;
        let launch = Launch {
            binary: &binary,
            template: &template,
            vars: &vars,
            cfg: &cfg,
        };
        let mut attempt = 1;
        loop {
            let mut envoy = launch.spawn(dir, attempt == 1)?;
            match envoy.wait_ready(cfg.ready_timeout).await {
                Ok(()) => return Ok(envoy),
                Err(err) if attempt < START_ATTEMPTS && envoy.failed_to_bind() => {
                    tracing::warn!(%err, "envoy could not bind its ports; retrying with new ones");
                    // Take the directory back for the next attempt; the failed process is killed.
                    dir = std::mem::replace(&mut envoy.dir, WorkDir::none());
                    attempt += 1;
                }
                Err(err) => return Err(err),
            }
        }
    }

    /// The ext_proc (or baseline) listener that clients send requests to.
    pub fn listener_addr(&self) -> SocketAddr {
        self.listener
    }

    /// The admin interface (`/ready`, `/stats`, `/clusters`, ...).
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
    }

    /// Envoy's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The temporary directory with the rendered config and the logs.
    pub fn work_dir(&self) -> &Path {
        &self.dir.path
    }

    /// The rendered bootstrap config.
    pub fn config_path(&self) -> &Path {
        &self.config
    }

    /// The access log file (flushed every 100 ms).
    pub fn access_log_path(&self) -> &Path {
        &self.access_log
    }

    /// Envoy's own stdout and stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The access log entries written so far (possibly none yet: see
    /// [`wait_for_access_log`](Self::wait_for_access_log)).
    pub fn access_log(&self) -> Result<Vec<AccessLogEntry>, EnvoyError> {
        match std::fs::read_to_string(&self.access_log) {
            Ok(text) => Ok(parse_all(&text)),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(err) => Err(EnvoyError::io(format!(
                "reading {}",
                self.access_log.display()
            ))(err)),
        }
    }

    /// Waits until the access log holds at least `count` entries. Envoy writes the log from a
    /// flush timer, so polling the file is the only way to observe it.
    pub async fn wait_for_access_log(
        &self,
        count: usize,
        timeout: Duration,
    ) -> Result<Vec<AccessLogEntry>, EnvoyError> {
        let deadline = Instant::now() + timeout;
        loop {
            let entries = self.access_log()?;
            if entries.len() >= count {
                return Ok(entries);
            }
            if Instant::now() >= deadline {
                return Err(EnvoyError::Timeout {
                    what: format!("{count} access log entries (have {})", entries.len()),
                    waited: timeout,
                });
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Admin `/stats?filter=<regex>` as name → value (values stay text: histograms are not numbers).
    pub async fn stats(&self, filter: &str) -> Result<BTreeMap<String, String>, EnvoyError> {
        let path = format!("/stats?filter={}", percent_encode(filter));
        let body = self.admin_get(&path).await?;
        Ok(body
            .lines()
            .filter_map(|line| line.split_once(": "))
            .map(|(name, value)| (name.to_owned(), value.to_owned()))
            .collect())
    }

    /// One counter or gauge by its exact name; `None` if Envoy has no such stat.
    pub async fn counter(&self, name: &str) -> Result<Option<u64>, EnvoyError> {
        let stats = self.stats(&format!("^{}$", regex_escape(name))).await?;
        Ok(stats.get(name).and_then(|v| v.parse().ok()))
    }

    /// `GET path` on the admin interface; the body as text (non-200 is an error).
    pub async fn admin_get(&self, path: &str) -> Result<String, EnvoyError> {
        let admin_err = |source| EnvoyError::Admin {
            path: path.to_owned(),
            source,
        };
        let response = client::get(self.admin, path).await.map_err(admin_err)?;
        if response.status != http::StatusCode::OK {
            return Err(EnvoyError::AdminStatus {
                path: path.to_owned(),
                status: response.status,
                body: response.text(),
            });
        }
        Ok(response.text())
    }

    async fn wait_ready(&mut self, timeout: Duration) -> Result<(), EnvoyError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(self.not_ready(format!("envoy exited during start-up ({status})")));
            }
            if self.is_ready().await {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(self.not_ready(format!("admin /ready not LIVE after {timeout:?}")));
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    async fn is_ready(&self) -> bool {
        let ready = matches!(client::get(self.admin, "/ready").await, Ok(r) if r.status == http::StatusCode::OK);
        ready && tokio::net::TcpStream::connect(self.listener).await.is_ok()
    }

    fn not_ready(&self, reason: String) -> EnvoyError {
        EnvoyError::NotReady {
            reason,
            log: self.log(),
        }
    }

    fn failed_to_bind(&self) -> bool {
        let log = self.log();
        log.contains("Address already in use") || log.contains("cannot bind")
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        // `Child::kill` signals this child's PID only; then reap it so no zombie is left.
        if let Err(err) = self.child.kill() {
            tracing::debug!(%err, pid = self.child.id(), "envoy already gone");
        }
        let _ = self.child.wait();
    }
}

/// Everything one start attempt needs besides the ports, which are new on every attempt.
struct Launch<'a> {
    binary: &'a Path,
    template: &'a str,
    vars: &'a BTreeMap<String, String>,
    cfg: &'a EnvoyConfig,
}

impl Launch<'_> {
    /// Picks ports, writes the config into `dir`, validates it if asked, and starts Envoy.
    fn spawn(&self, dir: WorkDir, validate_first: bool) -> Result<Envoy, EnvoyError> {
        let [admin, listener] = free_ports()?;
        let mut vars = self.vars.clone();
        vars.insert("ADMIN_PORT".into(), admin.port().to_string());
        vars.insert("LISTENER_PORT".into(), listener.port().to_string());
        let config = dir.path.join("envoy.yaml");
        std::fs::write(&config, render(self.template, &vars)?)
            .map_err(EnvoyError::io(format!("writing {}", config.display())))?;
        if validate_first {
            validate(self.binary, &config)?;
        }
        let log = dir.path.join("envoy.log");
        let child = spawn(self.binary, &config, self.cfg, &log)?;
        Ok(Envoy {
            child,
            admin,
            listener,
            config,
            access_log: dir.path.join("access.log"),
            log,
            dir,
        })
    }
}

fn validate(binary: &Path, config: &Path) -> Result<(), EnvoyError> {
    let output = Command::new(binary)
        .args([
            "--mode",
            "validate",
            "--disable-hot-restart",
            "--log-level",
            "warn",
            "-c",
        ])
        .arg(config)
        .stdin(Stdio::null())
        .output()
        .map_err(EnvoyError::io(format!(
            "running {} --mode validate",
            binary.display()
        )))?;
    if output.status.success() {
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    Err(EnvoyError::Invalid {
        config: config.to_owned(),
        output: text,
    })
}

fn spawn(binary: &Path, config: &Path, cfg: &EnvoyConfig, log: &Path) -> Result<Child, EnvoyError> {
    let log_file = std::fs::File::create(log)
        .map_err(EnvoyError::io(format!("creating {}", log.display())))?;
    let log_err = log_file
        .try_clone()
        .map_err(EnvoyError::io("duplicating the log file handle"))?;
    Command::new(binary)
        .arg("-c")
        .arg(config)
        .args(["--concurrency", &cfg.concurrency.to_string()])
        .args(["--log-level", &cfg.log_level])
        .args(["--file-flush-interval-msec", "100", "--disable-hot-restart"])
        .stdin(Stdio::null())
        .stdout(log_file)
        .stderr(log_err)
        .spawn()
        .map_err(EnvoyError::io(format!("starting {}", binary.display())))
}

/// Two distinct free ports on 127.0.0.1 ([`crate::ports`]).
fn free_ports() -> Result<[SocketAddr; 2], EnvoyError> {
    let port = || {
        crate::ports::free_port()
            .map(|p| SocketAddr::from(([127, 0, 0, 1], p)))
            .map_err(EnvoyError::io("finding a free port"))
    };
    Ok([port()?, port()?])
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn regex_escape(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let special = "\\.+*?()|[]{}^$".contains(c);
            special.then_some('\\').into_iter().chain([c])
        })
        .collect()
}

/// A per-Envoy temporary directory, removed on drop unless a test is panicking (then its path is
/// printed so the config and logs can be inspected) or `EPP_KEEP_ENVOY_DIR` is set.
#[derive(Debug)]
struct WorkDir {
    path: PathBuf,
    keep: bool,
}

impl WorkDir {
    fn create() -> Result<Self, EnvoyError> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("epp-e2e-envoy-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path); // left over from an earlier process with this pid
        std::fs::create_dir_all(&path)
            .map_err(EnvoyError::io(format!("creating {}", path.display())))?;
        Ok(Self { path, keep: false })
    }

    /// Owns nothing: left behind in an [`Envoy`] whose directory was taken back.
    fn none() -> Self {
        Self {
            path: PathBuf::new(),
            keep: true,
        }
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if self.keep || std::env::var_os("EPP_KEEP_ENVOY_DIR").is_some() {
            return;
        }
        if std::thread::panicking() {
            eprintln!(
                "envoy work dir kept for inspection: {}",
                self.path.display()
            );
            return;
        }
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
