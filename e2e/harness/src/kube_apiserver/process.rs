//! One external server process (etcd or kube-apiserver) under a tiny `sh` supervisor.
//!
//! Why a supervisor: the test fixture lives in a `static` (one server per test binary), and
//! statics are never dropped, so a `Child` kill-on-drop would leak both servers when the test
//! binary exits. The supervisor starts the server in the background, prints its PID, and blocks
//! reading its stdin, a pipe whose write end only this process holds. When the test process
//! exits (or [`Supervised::stop`] closes the pipe), the read returns and the supervisor stops the
//! server by its PID (SIGTERM, then SIGKILL after 5 s: kube-apiserver can hang in shutdown
//! once etcd is gone), waits for it, and optionally removes a directory.

use super::KubeError;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};

const SUPERVISOR: &str = r#"log=$1; rmdir=$2; shift 2
"$@" >>"$log" 2>&1 &
c=$!
echo "$c"
read -r _ || true
kill "$c" 2>/dev/null
i=0
while kill -0 "$c" 2>/dev/null && [ "$i" -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
kill -9 "$c" 2>/dev/null
wait "$c"
if [ -n "$rmdir" ]; then rm -rf "$rmdir"; fi
"#;

/// A running, supervised server process.
#[derive(Debug)]
pub struct Supervised {
    pub name: &'static str,
    pub pid: u32,
    pub log: PathBuf,
    supervisor: Child,
    stdin: Option<ChildStdin>,
}

impl Supervised {
    /// Starts `binary args…`, appending its output to `log`; `remove_after` is deleted once the
    /// server has stopped.
    pub fn start(
        name: &'static str,
        binary: &Path,
        args: &[String],
        log: &Path,
        remove_after: Option<&Path>,
    ) -> Result<Self, KubeError> {
        let rmdir = remove_after.map(|p| p.display().to_string());
        let mut supervisor = Command::new("sh")
            .arg("-c")
            .arg(SUPERVISOR)
            .arg("sh")
            .arg(log)
            .arg(rmdir.unwrap_or_default())
            .arg(binary)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| KubeError::io(binary, e))?;
        let stdout = supervisor.stdout.take();
        let mut line = String::new();
        if let Some(out) = stdout {
            BufReader::new(out)
                .read_line(&mut line)
                .map_err(|e| KubeError::io(binary, e))?;
        }
        let pid = line.trim().parse().map_err(|_| KubeError::Start {
            what: name,
            detail: format!("the supervisor printed no PID ({line:?})"),
            log: log.to_owned(),
        })?;
        Ok(Self {
            name,
            pid,
            log: log.to_owned(),
            stdin: supervisor.stdin.take(),
            supervisor,
        })
    }

    /// Whether the server process is still alive (the supervisor outlives it only briefly).
    pub fn running(&self) -> bool {
        Path::new(&format!("/proc/{}", self.pid)).exists()
    }

    /// Sends `signal` (e.g. "KILL") to the server by PID, without waiting.
    pub fn signal(&self, signal: &str) {
        let _ = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid.to_string())
            .status();
    }

    /// Stops the server (SIGTERM by PID, SIGKILL after 5 s, through the supervisor) and waits
    /// for both.
    pub fn stop(mut self) {
        self.stdin = None;
        let _ = self.supervisor.wait();
    }

    /// The log's last `n` lines, for error messages.
    pub fn tail(&self, n: usize) -> String {
        tail(&self.log, n)
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.stdin = None;
        let _ = self.supervisor.wait();
    }
}

pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
