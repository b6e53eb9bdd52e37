//! Loopback ports for the processes tests and benchmarks start (simulated pods, epp, Envoy).
//!
//! Why not `127.0.0.1:0`: a port the kernel hands out for that is in its ephemeral range
//! (`/proc/sys/net/ipv4/ip_local_port_range`, 32768–60999 by default), and it is free only until
//! the next ephemeral bind. Every outgoing connection (a scrape, Envoy's upstream connections, the
//! load generator's clients) takes an ephemeral port, so a port found that way and handed to a
//! process started a moment later was sometimes taken first: `AddrInUse` from a simulated pod's
//! KV-event socket in a bench run (session 6) and in a CI test run (session 5). Ports below the
//! ephemeral range are never handed out implicitly; a random draw keeps parallel test processes
//! apart, each port is checked by binding it, and this process never hands out a port twice.

use std::io;
use std::net::TcpListener;
use std::ops::Range;
use std::sync::Mutex;

use rand::Rng;

/// Below Linux's default ephemeral range.
const RANGE: Range<u16> = 20_000..32_000;

/// The first of `n` consecutive ports that were free when checked.
pub fn free_range(n: usize) -> io::Result<u16> {
    static GIVEN: Mutex<Vec<Range<u16>>> = Mutex::new(Vec::new());
    let n = u16::try_from(n)
        .ok()
        .filter(|n| *n > 0 && *n < RANGE.len() as u16)
        .ok_or_else(|| io::Error::other(format!("cannot draw {n} consecutive ports")))?;
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let mut rng = rand::rng();
    for _ in 0..10_000 {
        let base = rng.random_range(RANGE.start..RANGE.end - n);
        let want = base..base + n;
        if given
            .iter()
            .any(|g| g.start < want.end && want.start < g.end)
        {
            continue;
        }
        let bound: io::Result<Vec<TcpListener>> = want
            .clone()
            .map(|p| TcpListener::bind(("127.0.0.1", p)))
            .collect();
        if bound.is_ok() {
            given.push(want);
            return Ok(base);
        }
    }
    Err(io::Error::other(format!(
        "no {n} consecutive free ports in {}-{}",
        RANGE.start,
        RANGE.end - 1
    )))
}

/// One port that was free when checked.
pub fn free_port() -> io::Result<u16> {
    free_range(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_below_the_ephemeral_range_and_never_given_twice() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            let base = free_range(3).unwrap();
            assert!(RANGE.contains(&base) && RANGE.contains(&(base + 2)));
            for p in base..base + 3 {
                assert!(seen.insert(p), "port {p} given twice");
            }
        }
        assert!(free_range(0).is_err());
    }
}
