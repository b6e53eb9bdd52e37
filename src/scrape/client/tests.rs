#![allow(clippy::disallowed_methods)] // the tests' own loopback server

use super::*;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// One scripted answer of the loopback server.
struct Reply {
    bytes: Vec<u8>,
    /// Written a byte at a time (every read boundary is exercised).
    trickle: bool,
    /// The server closes the connection after it, whatever the answer said.
    close: bool,
    /// Never answered: the server holds the connection open.
    silent: bool,
}

fn reply(s: &str) -> Reply {
    Reply {
        bytes: s.as_bytes().to_vec(),
        trickle: false,
        close: false,
        silent: false,
    }
}

#[derive(Default)]
struct Log {
    accepts: usize,
    heads: Vec<String>,
}

/// A loopback server answering each request head with the next scripted reply, one connection
/// at a time, in order.
async fn server(replies: Vec<Reply>) -> (String, Arc<Mutex<Log>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let authority = listener.local_addr().unwrap().to_string();
    let log = Arc::new(Mutex::new(Log::default()));
    let seen = Arc::clone(&log);
    let mut queue: VecDeque<Reply> = replies.into();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            seen.lock().unwrap().accepts += 1;
            let mut buf = Vec::new();
            'conn: loop {
                let end = loop {
                    if let Some(end) = memchr::memmem::find(&buf, b"\r\n\r\n") {
                        break end + 4;
                    }
                    let mut chunk = [0u8; 1024];
                    match sock.read(&mut chunk).await {
                        Ok(0) | Err(_) => break 'conn,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                };
                let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                buf.drain(..end);
                seen.lock().unwrap().heads.push(head);
                let Some(r) = queue.pop_front() else {
                    break;
                };
                if r.silent {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    break;
                }
                if r.trickle {
                    for b in &r.bytes {
                        let _ = sock.write_all(&[*b]).await;
                        let _ = sock.flush().await;
                        tokio::task::yield_now().await;
                    }
                } else {
                    let _ = sock.write_all(&r.bytes).await;
                }
                if r.close {
                    break;
                }
            }
        }
    });
    (authority, log)
}

fn ok(body: &str) -> String {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

const CHUNKED: &str = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nx-trailer: 1\r\n\r\n";

#[tokio::test]
async fn a_length_framed_answer_is_read_and_its_connection_reused() {
    let (authority, log) = server(vec![reply(&ok("page one")), reply(&ok("two"))]).await;
    let mut conn = Conn::new(&authority);
    let first = conn.get("/metrics?name%5B%5D=x", 1 << 20).await.unwrap();
    assert_eq!(
        (first.status, first.body.as_slice()),
        (200, &b"page one"[..])
    );
    assert!(conn.connected());
    let second = conn.get("/metrics", 1 << 20).await.unwrap();
    assert_eq!(second.body, b"two");
    let log = log.lock().unwrap();
    assert_eq!(log.accepts, 1, "one connection for both");
    assert!(
        log.heads[0].starts_with("GET /metrics?name%5B%5D=x HTTP/1.1\r\n"),
        "{:?}",
        log.heads[0]
    );
    assert!(log.heads[0].contains(&format!("\r\nHost: {authority}\r\n")));
}

#[tokio::test]
async fn a_chunked_answer_trickled_a_byte_at_a_time_is_decoded() {
    let trickled = Reply {
        trickle: true,
        ..reply(CHUNKED)
    };
    let (authority, log) = server(vec![trickled, reply(&ok("again"))]).await;
    let mut conn = Conn::new(&authority);
    let resp = conn.get("/", 1 << 20).await.unwrap();
    assert_eq!(resp.body, b"hello, world");
    assert_eq!(conn.get("/", 1 << 20).await.unwrap().body, b"again");
    assert_eq!(log.lock().unwrap().accepts, 1);
}

#[tokio::test]
async fn an_answer_without_length_is_read_to_the_end_and_not_reused() {
    let (authority, log) = server(vec![
        Reply {
            close: true,
            ..reply("HTTP/1.1 200 OK\r\n\r\nto the end")
        },
        Reply {
            close: true,
            ..reply("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 3\r\n\r\nabc")
        },
        reply(&ok("third")),
    ])
    .await;
    let mut conn = Conn::new(&authority);
    assert_eq!(conn.get("/", 1 << 20).await.unwrap().body, b"to the end");
    assert!(!conn.connected());
    assert_eq!(conn.get("/", 1 << 20).await.unwrap().body, b"abc");
    assert!(!conn.connected(), "Connection: close");
    assert_eq!(conn.get("/", 1 << 20).await.unwrap().body, b"third");
    assert_eq!(log.lock().unwrap().accepts, 3);
}

#[tokio::test]
async fn a_kept_connection_the_server_closed_is_replaced_once() {
    let (authority, log) = server(vec![
        Reply {
            close: true,
            ..reply(&ok("first"))
        },
        reply(&ok("second")),
    ])
    .await;
    let mut conn = Conn::new(&authority);
    assert_eq!(conn.get("/", 1 << 20).await.unwrap().body, b"first");
    // The server has closed it; the client does not know yet.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(conn.connected());
    assert_eq!(conn.get("/", 1 << 20).await.unwrap().body, b"second");
    assert_eq!(log.lock().unwrap().accepts, 2);
}

#[tokio::test]
async fn a_fresh_connection_closed_unanswered_is_an_error_not_a_retry() {
    let (authority, log) = server(vec![]).await;
    let mut conn = Conn::new(&authority);
    let err = conn.get("/", 1 << 20).await.unwrap_err();
    assert!(matches!(err, HttpError::Closed), "{err}");
    assert_eq!(log.lock().unwrap().accepts, 1);
}

#[tokio::test]
async fn bodies_over_the_limit_are_refused() {
    let (authority, _) = server(vec![
        reply(&ok("0123456789")),
        reply(CHUNKED),
        Reply {
            close: true,
            ..reply("HTTP/1.1 200 OK\r\n\r\n0123456789")
        },
    ])
    .await;
    let mut conn = Conn::new(&authority);
    for _ in 0..3 {
        let err = conn.get("/", 9).await.unwrap_err();
        assert!(matches!(err, HttpError::TooLarge(9)), "{err}");
        assert!(!conn.connected());
    }
}

#[tokio::test]
async fn malformed_answers_are_errors_naming_the_fault() {
    let cases = [
        ("HTTP/1.1 abc OK\r\n\r\n", "status"),
        (
            "HTTP/1.1 200 OK\r\nContent-Length: 12x\r\n\r\n",
            "content-length",
        ),
        (
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
            "two different",
        ),
        (
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            "chunk size",
        ),
        (
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabX\r\n",
            "CRLF",
        ),
    ];
    for (answer, names) in cases {
        let (authority, _) = server(vec![reply(answer)]).await;
        let err = Conn::new(&authority).get("/", 1 << 20).await.unwrap_err();
        assert!(matches!(err, HttpError::Malformed(_)), "{answer:?}: {err}");
        assert!(err.to_string().contains(names), "{answer:?}: {err}");
    }
}

#[tokio::test]
async fn a_body_cut_short_is_an_error() {
    let (authority, _) = server(vec![Reply {
        close: true,
        ..reply("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
    }])
    .await;
    let err = Conn::new(&authority).get("/", 1 << 20).await.unwrap_err();
    assert!(matches!(err, HttpError::Closed), "{err}");
}

#[tokio::test]
async fn interim_answers_are_skipped() {
    let answer = format!("HTTP/1.1 100 Continue\r\n\r\n{}", ok("final"));
    let (authority, _) = server(vec![reply(&answer)]).await;
    let resp = Conn::new(&authority).get("/", 1 << 20).await.unwrap();
    assert_eq!((resp.status, resp.body.as_slice()), (200, &b"final"[..]));
}

#[tokio::test]
async fn a_status_probe_keeps_the_connection_only_without_a_body() {
    let (authority, log) = server(vec![
        reply("HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"),
        reply(&ok("healthy")),
        reply("HTTP/1.1 204 No Content\r\n\r\n"),
    ])
    .await;
    let mut conn = Conn::new(&authority);
    assert_eq!(conn.status("/health").await.unwrap(), 503);
    assert!(conn.connected());
    assert_eq!(conn.status("/health").await.unwrap(), 200);
    assert!(!conn.connected(), "an unread body ends the connection");
    assert_eq!(conn.status("/health").await.unwrap(), 204);
    assert!(conn.connected());
    assert_eq!(log.lock().unwrap().accepts, 2);
}

#[tokio::test]
async fn a_call_dropped_midway_drops_its_connection() {
    let (authority, _) = server(vec![
        reply(&ok("one")),
        Reply {
            silent: true,
            ..reply("")
        },
    ])
    .await;
    let mut conn = Conn::new(&authority);
    assert_eq!(conn.get("/", 1 << 20).await.unwrap().body, b"one");
    let timed = tokio::time::timeout(Duration::from_millis(100), conn.get("/", 1 << 20)).await;
    assert!(timed.is_err(), "the silent answer times out");
    assert!(!conn.connected(), "the connection went with the call");
}

#[tokio::test]
async fn connecting_nowhere_names_the_target() {
    // A port nothing listens on (bound, then released).
    let addr = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let err = Conn::new(&addr.to_string()).get("/", 10).await.unwrap_err();
    assert!(matches!(err, HttpError::Connect { .. }), "{err}");
    assert!(err.to_string().contains(&addr.to_string()), "{err}");
}

#[test]
fn urls_split_into_authority_and_target() {
    let u = Url::parse("http://10.0.0.1:8000/metrics?name%5B%5D=a").unwrap();
    assert_eq!(u.authority, "10.0.0.1:8000");
    assert_eq!(u.target, "/metrics?name%5B%5D=a");
    let u = Url::parse("http://dcgm.monitoring.svc").unwrap();
    assert_eq!(
        (u.authority.as_str(), u.target.as_str()),
        ("dcgm.monitoring.svc", "/")
    );
    let u = Url::parse("http://[::1]:9400/federate").unwrap();
    assert_eq!(u.authority, "[::1]:9400");
    for (bad, why) in [
        ("https://a/metrics", "only http://"),
        ("dcgm.svc:9400", "scheme"),
        ("http://user:pw@a/metrics", "credentials"),
        ("http://a b/", "not a URL"),
    ] {
        let err = Url::parse(bad).unwrap_err().to_string();
        assert!(err.contains(why), "{bad}: {err}");
    }
}

#[test]
fn an_authority_without_a_port_connects_to_80() {
    assert_eq!(Conn::new("a.b").addr, "a.b:80");
    assert_eq!(Conn::new("a.b:9400").addr, "a.b:9400");
    assert_eq!(Conn::new("[::1]").addr, "[::1]:80");
    assert_eq!(Conn::new("[::1]:8000").addr, "[::1]:8000");
}

/// The chunked decoder reads the same body whatever the read boundaries.
#[test]
fn chunked_decoding_does_not_depend_on_read_boundaries() {
    let raw = b"5;ext=1\r\nhello\r\n1\r\n,\r\n6\r\n world\r\n0\r\nt: 1\r\n\r\nNEXT";
    for split in 0..raw.len() {
        let (mut dec, mut body) = (Chunked::default(), Vec::new());
        let mut buf = raw[..split].to_vec();
        let mut fed = split;
        let used = loop {
            if let Some(used) = dec.decode(&buf, &mut body, 1 << 10).unwrap() {
                break used;
            }
            buf.drain(..dec.take_consumed());
            assert!(fed < raw.len(), "split {split}: needs more than there is");
            buf.push(raw[fed]);
            fed += 1;
        };
        assert_eq!(body, b"hello, world", "split {split}");
        assert!(
            b"NEXT".starts_with(&buf[used..]),
            "split {split}: {:?}",
            &buf[used..]
        );
    }
}
