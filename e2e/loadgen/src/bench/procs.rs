//! Child processes of the harness: started with their output in a log file, stopped by their
//! own PID (SIGKILL, then reaped) when dropped, and measured by CPU time from `/proc/<pid>/stat`.

use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::BenchError;

/// A running child process; killed and reaped on drop.
#[derive(Debug)]
pub struct Proc {
    pub name: String,
    child: Child,
    pub log: PathBuf,
}

impl Proc {
    /// Starts `program args` with stdout and stderr appended to `<dir>/<name>.log`.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        dir: &Path,
    ) -> Result<Self, BenchError> {
        Self::spawn_env(name, program, args, &[], dir)
    }

    /// [`Proc::spawn`] with extra environment variables.
    pub fn spawn_env(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(String, String)],
        dir: &Path,
    ) -> Result<Self, BenchError> {
        let log = dir.join(format!("{name}.log"));
        let out =
            File::create(&log).map_err(BenchError::io(format!("creating {}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(BenchError::io("duplicating a log handle"))?;
        let child = Command::new(program)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(BenchError::io(format!("starting {}", program.display())))?;
        Ok(Self {
            name: name.to_owned(),
            child,
            log,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails with the tail of the log if the process has exited.
    pub fn check_alive(&mut self) -> Result<(), BenchError> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            _ => Err(BenchError::Exited {
                name: self.name.clone(),
                log: log_tail(&self.log),
            }),
        }
    }

    /// Sends `signal` (`TERM`, `KILL`, ... as `kill -s` names them) to this process alone.
    pub fn signal(&self, signal: &str) -> Result<(), BenchError> {
        let status = Command::new("kill")
            .args(["-s", signal, &self.pid().to_string()])
            .status()
            .map_err(BenchError::io(format!("kill -s {signal} {}", self.name)))?;
        if status.success() {
            Ok(())
        } else {
            Err(BenchError::Setup(format!(
                "kill -s {signal} {} (pid {}) failed: {status}",
                self.name,
                self.pid()
            )))
        }
    }

    /// Waits (polling, bounded by `timeout`) until the process has exited; its exit status, or
    /// `None` if it is still running when the time is up.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// User + system CPU time used so far.
    pub fn cpu(&self) -> Duration {
        cpu_time(self.pid()).unwrap_or_default()
    }

    /// Resident memory in bytes.
    pub fn rss(&self) -> u64 {
        status_kb(self.pid(), "VmRSS:") * 1024
    }

    /// Peak resident memory (VmHWM) in bytes.
    pub fn peak_rss(&self) -> u64 {
        status_kb(self.pid(), "VmHWM:") * 1024
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `kB` field of `/proc/<pid>/status` (0 if absent).
pub fn status_kb(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(0)
}

/// The last 40 lines of a log file.
pub fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// utime + stime of a process (all its threads), from `/proc/<pid>/stat`.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces) start at state (field 3).
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_secs_f64(ticks as f64 / clock_ticks()))
}

/// `getconf CLK_TCK` (100 on Linux unless configured otherwise).
fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// `n` distinct ports that were free a moment ago ([`harness::ports`]).
pub fn free_ports(n: usize) -> Result<Vec<u16>, BenchError> {
    (0..n)
        .map(|_| harness::ports::free_port().map_err(BenchError::io("finding free ports")))
        .collect()
}

/// `n` consecutive free ports starting at the returned port ([`harness::ports`]).
pub fn free_port_range(n: usize) -> Result<u16, BenchError> {
    harness::ports::free_range(n).map_err(BenchError::io("finding a range of free ports"))
}

/// Polls `GET path` on `addr` until it answers 200, the process dies, or `timeout` passes.
pub async fn wait_http_ok(
    proc_: &mut Proc,
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> Result<(), BenchError> {
    let deadline = Instant::now() + timeout;
    loop {
        proc_.check_alive()?;
        if let Ok(r) = harness::client::get(addr, path).await {
            if r.status.is_success() {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            return Err(BenchError::NotReady {
                what: format!("{} at http://{addr}{path}", proc_.name),
                log: log_tail(&proc_.log),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_measurable_cpu_time() {
        let start = Instant::now();
        let mut x = 0u64;
        while start.elapsed() < Duration::from_millis(50) {
            x = x.wrapping_add(1);
        }
        assert!(x > 0);
        assert!(cpu_time(std::process::id()).unwrap() > Duration::ZERO);
    }

    #[test]
    fn a_port_range_is_free_when_returned() {
        let base = free_port_range(4).unwrap();
        let held: Vec<_> = (0..4)
            .map(|i| std::net::TcpListener::bind(("127.0.0.1", base + i)).unwrap())
            .collect();
        assert_eq!(held.len(), 4);
    }
}
