//! The poller's HTTP/1.1 client: `GET` over one keep-alive connection per target, that a
//! poller owns and nobody shares.
//!
//! Why not hyper's pooled client, used before: it kept about 32 KB per pod between scrapes
//! (an 8 KiB read buffer, an 8 KiB header write buffer and two 8 KiB blocks of its dispatch
//! channel per connection), 3.2 MB at 100 pods: more than half of epp's idle heap and a third
//! of its peak, by heaptrack (BENCHMARKS.md "Peak RSS: the poller's connections, tonic's buffer, the allocator's delay").
//! This client keeps the socket and nothing else: a response's buffer lives only while it is
//! read.
//!
//! What it reads: a status line and headers (`httparse`, hyper's own parser), then a body
//! framed by `Transfer-Encoding: chunked`, `Content-Length`, or the connection's end; interim
//! `1xx` answers are skipped. A connection is kept when the answer allows it (HTTP/1.1 without
//! `Connection: close`, HTTP/1.0 with `keep-alive`) and nothing followed the body. A kept
//! connection the server has since closed is found out on the next request, which is retried
//! once on a new connection if no byte of an answer had arrived. The caller bounds each call
//! in time; a call dropped midway drops its connection with it (it is out of [`Conn`] while in
//! use), so no later call reads a stale answer.
//!
//! A connection may be TLS ([`Tls`]: a multi-cluster hub scrapes its spokes over https, the
//! peer's certificate verified); the exchange is the same over either stream.

use std::io;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// The largest header section read (status line and headers).
const MAX_HEAD: usize = 64 << 10;
/// Headers parsed per answer; more is a malformed answer.
const MAX_HEADERS: usize = 64;
/// Bytes asked of the socket per read.
const READ_CHUNK: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub(crate) enum HttpError {
    #[error("connecting to {authority} failed: {source}")]
    Connect {
        authority: String,
        #[source]
        source: io::Error,
    },
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("the connection closed before the answer ended")]
    Closed,
    #[error("malformed answer: {0}")]
    Malformed(String),
    #[error("body over {0} bytes")]
    TooLarge(usize),
}

/// An `http://` URL split once into where to connect and what to ask.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Url {
    /// `host:port` as the `Host` header sends it (the port as written, or none).
    pub(crate) authority: String,
    /// Path and query, `/` when the URL has none.
    pub(crate) target: String,
}

/// A URL the client cannot ask: not one, not `http://`, no host, or with credentials.
#[derive(Clone, Debug, thiserror::Error)]
#[error("bad url {url:?}: {why}")]
pub(crate) struct BadUrl {
    pub(crate) url: String,
    pub(crate) why: &'static str,
}

impl Url {
    pub(crate) fn parse(url: &str) -> Result<Self, BadUrl> {
        let bad = |why| BadUrl {
            url: url.to_owned(),
            why,
        };
        let uri: http::Uri = url.parse().map_err(|_| bad("not a URL"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some(_) => return Err(bad("only http:// is supported")),
            None => return Err(bad("no scheme (http://)")),
        }
        let authority = uri.authority().ok_or_else(|| bad("no host"))?;
        if authority.as_str().contains('@') {
            return Err(bad("credentials in the URL are not supported"));
        }
        Ok(Self {
            authority: authority.as_str().to_owned(),
            target: uri.path_and_query().map_or("/", |p| p.as_str()).to_owned(),
        })
    }
}

/// One target's connection: none until the first request, then kept while answers allow.
#[derive(Debug)]
pub(crate) struct Conn {
    authority: String,
    /// `authority` with the default port when it names none (what `connect` resolves).
    addr: String,
    /// How the connection is secured, for an https target.
    tls: Option<Tls>,
    stream: Option<Stream>,
}

/// An https target's TLS: the client configuration (roots, client certificate) and the name
/// the peer's certificate must carry (the URL's host, a name or an IP).
#[derive(Clone)]
pub(crate) struct Tls {
    connector: tokio_rustls::TlsConnector,
    name: rustls::pki_types::ServerName<'static>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("name", &self.name).finish()
    }
}

impl Tls {
    /// TLS to `authority`'s host (`host:port`, an IPv6 host bracketed) with `config`.
    pub(crate) fn new(config: Arc<rustls::ClientConfig>, authority: &str) -> Result<Self, BadUrl> {
        let bad = |why| BadUrl {
            url: authority.to_owned(),
            why,
        };
        let parsed: http::uri::Authority = authority.parse().map_err(|_| bad("not a host"))?;
        let host = parsed.host().trim_start_matches('[').trim_end_matches(']');
        let name = rustls::pki_types::ServerName::try_from(host.to_owned())
            .map_err(|_| bad("not a name a certificate can carry"))?;
        Ok(Self {
            connector: tokio_rustls::TlsConnector::from(config),
            name,
        })
    }
}

/// A kept connection, plain or TLS.
#[derive(Debug)]
enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// An answer's status and, when read, its body.
#[derive(Debug)]
pub(crate) struct Response {
    pub(crate) status: u16,
    pub(crate) body: Vec<u8>,
}

impl Conn {
    pub(crate) fn new(authority: &str) -> Self {
        let addr = match authority.parse::<http::uri::Authority>() {
            Ok(a) if a.port().is_none() => format!("{authority}:80"),
            _ => authority.to_owned(),
        };
        Self {
            authority: authority.to_owned(),
            addr,
            tls: None,
            stream: None,
        }
    }

    /// A connection to an https target (port 443 when `authority` names none).
    pub(crate) fn with_tls(authority: &str, tls: Tls) -> Self {
        let addr = match authority.parse::<http::uri::Authority>() {
            Ok(a) if a.port().is_none() => format!("{authority}:443"),
            _ => authority.to_owned(),
        };
        Self {
            authority: authority.to_owned(),
            addr,
            tls: Some(tls),
            stream: None,
        }
    }

    /// `GET target`, the whole body read (at most `limit` bytes).
    pub(crate) async fn get(&mut self, target: &str, limit: usize) -> Result<Response, HttpError> {
        self.request(target, Some(limit)).await
    }

    /// `GET target` for its status only: the body is not read, and the connection is kept only
    /// when the answer declares none.
    pub(crate) async fn status(&mut self, target: &str) -> Result<u16, HttpError> {
        Ok(self.request(target, None).await?.status)
    }

    /// Whether a connection is held for the next request.
    #[cfg(test)]
    pub(crate) fn connected(&self) -> bool {
        self.stream.is_some()
    }

    async fn request(&mut self, target: &str, limit: Option<usize>) -> Result<Response, HttpError> {
        let head = format!(
            "GET {target} HTTP/1.1\r\nHost: {}\r\nUser-Agent: epp\r\nAccept: */*\r\n\r\n",
            self.authority
        );
        if let Some(stream) = self.stream.take() {
            match exchange_on(stream, head.as_bytes(), limit).await {
                Ok((resp, kept)) => {
                    self.stream = kept;
                    return Ok(resp);
                }
                // The server closed the kept connection since the last answer.
                Err(Failure {
                    answered: false, ..
                }) => {}
                Err(Failure { error, .. }) => return Err(error),
            }
        }
        let stream = self.connect().await?;
        let (resp, kept) = exchange_on(stream, head.as_bytes(), limit)
            .await
            .map_err(|f| f.error)?;
        self.stream = kept;
        Ok(resp)
    }

    async fn connect(&self) -> Result<Stream, HttpError> {
        let failed = |source| HttpError::Connect {
            authority: self.authority.clone(),
            source,
        };
        let stream = TcpStream::connect(self.addr.as_str())
            .await
            .map_err(failed)?;
        // Small requests and answers: no Nagle delay.
        stream.set_nodelay(true)?;
        match &self.tls {
            None => Ok(Stream::Plain(stream)),
            Some(tls) => {
                let shaken = tls.connector.connect(tls.name.clone(), stream).await;
                Ok(Stream::Tls(Box::new(shaken.map_err(failed)?)))
            }
        }
    }
}

/// [`exchange`] over whichever stream the connection is.
async fn exchange_on(
    stream: Stream,
    head: &[u8],
    limit: Option<usize>,
) -> Result<(Response, Option<Stream>), Failure> {
    match stream {
        Stream::Plain(s) => {
            let (resp, kept) = exchange(s, head, limit).await?;
            Ok((resp, kept.map(Stream::Plain)))
        }
        Stream::Tls(s) => {
            let (resp, kept) = exchange(s, head, limit).await?;
            Ok((resp, kept.map(Stream::Tls)))
        }
    }
}

/// What an exchange reads and writes: a socket, or TLS over one.
trait Io: AsyncRead + AsyncWrite + Unpin {}
impl<T: AsyncRead + AsyncWrite + Unpin> Io for T {}

/// A failed exchange, and whether any byte of an answer had arrived (if not, a kept
/// connection may just have been closed by the server, and a new one is tried).
struct Failure {
    error: HttpError,
    answered: bool,
}

impl From<HttpError> for Failure {
    fn from(error: HttpError) -> Self {
        Self {
            error,
            answered: true,
        }
    }
}

/// Sends `head`, reads the answer; gives the stream back when it may carry the next request.
async fn exchange<S: Io>(
    mut stream: S,
    head: &[u8],
    limit: Option<usize>,
) -> Result<(Response, Option<S>), Failure> {
    let unanswered = |error: io::Error| Failure {
        error: HttpError::Io(error),
        answered: false,
    };
    stream.write_all(head).await.map_err(unanswered)?;
    let mut buf = Vec::with_capacity(READ_CHUNK);
    let head = read_head(&mut stream, &mut buf).await?;
    buf.drain(..head.len);
    let status = head.status;
    // No body whatever the headers say (RFC 9112 §6.3), or a declared empty one.
    let framing = if status == 204 || status == 304 {
        Framing::Length(0)
    } else {
        head.framing
    };
    let persistent = head.persistent && framing != Framing::Close;
    let Some(limit) = limit else {
        let kept =
            (persistent && framing == Framing::Length(0) && buf.is_empty()).then_some(stream);
        return Ok((
            Response {
                status,
                body: Vec::new(),
            },
            kept,
        ));
    };
    let (body, clean) = match framing {
        Framing::Length(n) => read_length(&mut stream, buf, n, limit).await?,
        Framing::Chunked => read_chunked(&mut stream, buf, limit).await?,
        Framing::Close => (read_to_end(&mut stream, buf, limit).await?, false),
    };
    let kept = (persistent && clean).then_some(stream);
    Ok((Response { status, body }, kept))
}

/// Reads until a final answer's status line and headers are in `buf` (interim `1xx` answers
/// are dropped from it).
async fn read_head(stream: &mut impl Io, buf: &mut Vec<u8>) -> Result<Head, Failure> {
    loop {
        match parse_head(buf)? {
            Some(h) if (100..200).contains(&h.status) && h.status != 101 => {
                buf.drain(..h.len);
                continue;
            }
            Some(h) => return Ok(h),
            None if buf.len() >= MAX_HEAD => {
                return Err(malformed("header section over 64 KiB").into())
            }
            None => {}
        }
        // Nothing of an answer yet: a kept connection may have been closed by the server.
        let answered = !buf.is_empty();
        match fill(stream, buf).await {
            Ok(0) => {
                return Err(Failure {
                    error: HttpError::Closed,
                    answered,
                })
            }
            Ok(_) => {}
            Err(e) => {
                return Err(Failure {
                    error: HttpError::Io(e),
                    answered,
                })
            }
        }
    }
}

/// How the body's end is found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Framing {
    Length(usize),
    Chunked,
    Close,
}

#[derive(Debug)]
struct Head {
    /// Bytes of the status line and headers, the blank line included.
    len: usize,
    status: u16,
    framing: Framing,
    /// The connection may carry another request (`Connection`, HTTP version).
    persistent: bool,
}

fn malformed(what: impl Into<String>) -> HttpError {
    HttpError::Malformed(what.into())
}

/// The status line and headers at the start of `buf`, if all there.
fn parse_head(buf: &[u8]) -> Result<Option<Head>, HttpError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    let len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(malformed(e.to_string())),
    };
    let status = resp.code.ok_or_else(|| malformed("no status code"))?;
    let http11 = resp.version == Some(1);
    let (mut length, mut coding, mut close, mut keep) = (None, None, false, false);
    for h in resp.headers.iter() {
        let value = std::str::from_utf8(h.value).unwrap_or("");
        if h.name.eq_ignore_ascii_case("content-length") {
            let n: usize = value
                .trim()
                .parse()
                .map_err(|_| malformed(format!("content-length {value:?}")))?;
            if length.is_some_and(|m| m != n) {
                return Err(malformed("two different content-lengths"));
            }
            length = Some(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            // The last coding decides (RFC 9112 §6.3): chunked, or read to the end.
            let last = value.rsplit(',').next().unwrap_or("").trim();
            coding = Some(last.eq_ignore_ascii_case("chunked"));
        } else if h.name.eq_ignore_ascii_case("connection") {
            for token in value.split(',').map(str::trim) {
                close |= token.eq_ignore_ascii_case("close");
                keep |= token.eq_ignore_ascii_case("keep-alive");
            }
        }
    }
    // A transfer coding overrides any length (RFC 9112 §6.3).
    let framing = match (coding, length) {
        (Some(true), _) => Framing::Chunked,
        (Some(false), _) | (None, None) => Framing::Close,
        (None, Some(n)) => Framing::Length(n),
    };
    let persistent = !close && (http11 || keep);
    Ok(Some(Head {
        len,
        status,
        framing,
        persistent,
    }))
}

/// Reads more of the answer into `buf`; 0 at the connection's end.
async fn fill(stream: &mut impl Io, buf: &mut Vec<u8>) -> io::Result<usize> {
    buf.reserve(READ_CHUNK);
    stream.read_buf(buf).await
}

/// A body of `n` bytes (`buf` holds its start); clean when nothing followed it.
async fn read_length(
    stream: &mut impl Io,
    mut buf: Vec<u8>,
    n: usize,
    limit: usize,
) -> Result<(Vec<u8>, bool), HttpError> {
    if n > limit {
        return Err(HttpError::TooLarge(limit));
    }
    if buf.len() < n {
        buf.reserve_exact(n - buf.len());
    }
    while buf.len() < n {
        if stream.read_buf(&mut buf).await? == 0 {
            return Err(HttpError::Closed);
        }
    }
    let clean = buf.len() == n;
    buf.truncate(n);
    Ok((buf, clean))
}

/// A body read until the connection ends.
async fn read_to_end(
    stream: &mut impl Io,
    mut buf: Vec<u8>,
    limit: usize,
) -> Result<Vec<u8>, HttpError> {
    while fill(stream, &mut buf).await? > 0 {
        if buf.len() > limit {
            return Err(HttpError::TooLarge(limit));
        }
    }
    if buf.len() > limit {
        return Err(HttpError::TooLarge(limit));
    }
    Ok(buf)
}

/// A chunked body (`raw` holds its start), decoded; clean when nothing followed it.
async fn read_chunked(
    stream: &mut impl Io,
    mut raw: Vec<u8>,
    limit: usize,
) -> Result<(Vec<u8>, bool), HttpError> {
    let mut body = Vec::new();
    let mut decoder = Chunked::default();
    loop {
        match decoder.decode(&raw, &mut body, limit)? {
            Some(used) => return Ok((body, used == raw.len())),
            None => {
                // Keep only what the decoder has not consumed.
                raw.drain(..decoder.take_consumed());
                if fill(stream, &mut raw).await? == 0 {
                    return Err(HttpError::Closed);
                }
            }
        }
    }
}

/// A chunked-body decoder over a growing buffer.
#[derive(Debug, Default)]
struct Chunked {
    /// Bytes of the buffer already decoded.
    pos: usize,
    /// Data bytes left of the current chunk, and then its CRLF.
    left: usize,
    /// The zero-size chunk was read: trailers follow.
    trailers: bool,
}

impl Chunked {
    /// Decodes what `raw` holds from `pos` on; `Some(end)` (bytes of `raw` used) at the
    /// body's end, `None` when more is needed.
    fn decode(
        &mut self,
        raw: &[u8],
        body: &mut Vec<u8>,
        limit: usize,
    ) -> Result<Option<usize>, HttpError> {
        loop {
            let rest = &raw[self.pos..];
            if self.trailers {
                // Trailer lines up to a blank one; their content is ignored.
                let Some(eol) = memchr::memmem::find(rest, b"\r\n") else {
                    return Ok(None);
                };
                self.pos += eol + 2;
                if eol == 0 {
                    return Ok(Some(self.pos));
                }
                continue;
            }
            if self.left > 0 {
                let data = self.left.saturating_sub(2);
                let take = data.min(rest.len());
                if body.len() + take > limit {
                    return Err(HttpError::TooLarge(limit));
                }
                body.extend_from_slice(&rest[..take]);
                self.pos += take;
                self.left -= take;
                if self.left == 2 {
                    match raw.get(self.pos..self.pos + 2) {
                        Some(b"\r\n") => {
                            self.pos += 2;
                            self.left = 0;
                        }
                        Some(_) => return Err(malformed("chunk not followed by CRLF")),
                        None => return Ok(None),
                    }
                }
                if self.left > 0 {
                    return Ok(None);
                }
                continue;
            }
            match httparse::parse_chunk_size(rest) {
                Ok(httparse::Status::Complete((used, size))) => {
                    self.pos += used;
                    let size = usize::try_from(size).map_err(|_| HttpError::TooLarge(limit))?;
                    if size == 0 {
                        self.trailers = true;
                    } else if body.len().saturating_add(size) > limit {
                        return Err(HttpError::TooLarge(limit));
                    } else {
                        self.left = size + 2;
                    }
                }
                Ok(httparse::Status::Partial) => return Ok(None),
                Err(_) => return Err(malformed("bad chunk size")),
            }
        }
    }

    /// Forgets the decoded bytes (the caller drops them from the buffer's front).
    fn take_consumed(&mut self) -> usize {
        std::mem::take(&mut self.pos)
    }
}

#[cfg(test)]
mod tests;
