//! The tests' one HTTP/1.1 client, shared by the real-kernel tests and the
//! exporter's host tests: a request head sent as written, the reply read
//! until the server closes, a chunked body decoded. Deliberately minimal, so
//! that a test sees exactly the bytes the exporter sent (status, headers,
//! transfer and content encodings) rather than what a client library made
//! of them.

use std::io::{Error, ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::Duration;

/// A reply whose body is text: status, headers and the de-chunked body.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    /// The first header called `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }
}

/// A reply whose body need not be text (gzip).
#[derive(Debug, Clone)]
pub struct RawReply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RawReply {
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }

    /// The reply with its body as text; `Err` if it is not UTF-8.
    pub fn text(self) -> std::io::Result<Reply> {
        let body = String::from_utf8(self.body)
            .map_err(|_| Error::new(ErrorKind::InvalidData, "a non-UTF-8 body"))?;
        Ok(Reply {
            status: self.status,
            headers: self.headers,
            body,
        })
    }
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// `GET path` (path and query, already encoded) with `Connection: close`.
/// `Err` for a connection or protocol failure, so that a caller can poll a
/// server that is still starting.
pub fn http_get(addr: SocketAddr, path: &str, timeout: Duration) -> std::io::Result<Reply> {
    let s = TcpStream::connect_timeout(&addr, timeout)?;
    exchange(s, addr, &get_head(addr, path), timeout)?.text()
}

/// [`http_get`] from the source address `from` (any of 127.0.0.0/8 on the
/// loopback): many clients as many hosts, as the exporter's per-address
/// connection limit sees them.
pub fn http_get_from(
    from: IpAddr,
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> std::io::Result<Reply> {
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        None,
    )?;
    sock.bind(&SocketAddr::new(from, 0).into())?;
    sock.connect_timeout(&addr.into(), timeout)?;
    exchange(sock.into(), addr, &get_head(addr, path), timeout)?.text()
}

/// Sends `head` (a whole request head, ending in an empty line) exactly as
/// written and reads the reply until the server closes the connection.
pub fn request(addr: SocketAddr, head: &str, timeout: Duration) -> std::io::Result<RawReply> {
    let s = TcpStream::connect_timeout(&addr, timeout)?;
    exchange(s, addr, head, timeout)
}

/// The request head of a plain `GET` that asks the server to close.
pub fn get_head(addr: SocketAddr, path: &str) -> String {
    format!("{}Connection: close\r\n\r\n", head_lines(addr, path))
}

/// The request head of a plain `GET` on a connection kept open.
pub fn get_head_keep_alive(addr: SocketAddr, path: &str) -> String {
    format!("{}\r\n", head_lines(addr, path))
}

/// `head` asking for gzip, as Prometheus does (`Accept-Encoding: gzip`).
pub fn asking_gzip(head: &str) -> String {
    head.replace("\r\n\r\n", "\r\nAccept-Encoding: gzip\r\n\r\n")
}

fn head_lines(addr: SocketAddr, path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: prjquota-tests\r\nAccept: */*\r\n")
}

fn exchange(
    mut s: TcpStream,
    addr: SocketAddr,
    head: &str,
    timeout: Duration,
) -> std::io::Result<RawReply> {
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    s.write_all(head.as_bytes())?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    let bad = bad_reply(addr, head);
    let (status, headers, split) = parse_head(&buf)
        .map_err(&bad)?
        .ok_or_else(|| bad("no reply head"))?;
    let raw_body = &buf[split..];
    let chunked =
        header(&headers, "transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
    let body = if chunked {
        dechunk(raw_body).ok_or_else(|| bad("a truncated chunked body"))?
    } else {
        raw_body.to_vec()
    };
    Ok(RawReply {
        status,
        headers,
        body,
    })
}

/// An error naming the request it answers.
fn bad_reply(addr: SocketAddr, head: &str) -> impl Fn(&str) -> Error + '_ {
    let target = head.split(' ').nth(1).unwrap_or_default();
    move |what: &str| {
        Error::new(
            ErrorKind::InvalidData,
            format!("{what} from {addr}{target}"),
        )
    }
}

/// A reply's status and headers, and where its body starts.
type Head = (u16, Vec<(String, String)>, usize);

/// The reply head, once `buf` holds a whole one (`Ok(None)` before); `Err`
/// says what is wrong with it.
fn parse_head(buf: &[u8]) -> Result<Option<Head>, &'static str> {
    let Some(split) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Ok(None);
    };
    let text = std::str::from_utf8(&buf[..split]).map_err(|_| "a non-UTF-8 head")?;
    let mut lines = text.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or("no status line")?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
        .collect();
    Ok(Some((status, headers, split + 4)))
}

/// One connection kept open across requests, as Prometheus keeps its
/// scrape connections: what a scrape costs a server that does not accept
/// and tear down a connection each time. Replies must carry a
/// `Content-Length` (the exporter's always do).
pub struct KeepAlive {
    s: TcpStream,
    addr: SocketAddr,
}

impl KeepAlive {
    pub fn connect(addr: SocketAddr, timeout: Duration) -> std::io::Result<KeepAlive> {
        let s = TcpStream::connect_timeout(&addr, timeout)?;
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
        Ok(KeepAlive { s, addr })
    }

    /// Sends `head` (a request head without `Connection: close`) and reads
    /// one reply, leaving the connection open for the next.
    pub fn request(&mut self, head: &str) -> std::io::Result<RawReply> {
        let bad = bad_reply(self.addr, head);
        self.s.write_all(head.as_bytes())?;
        let mut buf = Vec::new();
        let mut chunk = vec![0u8; 64 * 1024];
        let (status, headers, split) = loop {
            if let Some(h) = parse_head(&buf).map_err(&bad)? {
                break h;
            }
            let n = self.s.read(&mut chunk)?;
            if n == 0 {
                return Err(bad("the connection closed before the reply head"));
            }
            buf.extend_from_slice(&chunk[..n]);
        };
        let len: usize = header(&headers, "content-length")
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| bad("a reply without Content-Length on a kept connection"))?;
        let mut body = buf.split_off(split);
        if body.len() > len {
            return Err(bad("more bytes than Content-Length"));
        }
        let have = body.len();
        body.resize(len, 0);
        self.s.read_exact(&mut body[have..])?;
        Ok(RawReply {
            status,
            headers,
            body,
        })
    }
}

/// Decodes a chunked body; `None` unless it ends with the last (empty) chunk.
pub fn dechunk(mut s: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = s.windows(2).position(|w| w == b"\r\n")?;
        let size = std::str::from_utf8(&s[..eol]).ok()?;
        let size = size.split(';').next()?.trim();
        let n = usize::from_str_radix(size, 16).ok()?;
        s = &s[eol + 2..];
        if n == 0 {
            return Some(out);
        }
        out.extend_from_slice(s.get(..n)?);
        s = s.get(n + 2..)?;
    }
}

/// Percent-encodes a query parameter value (RFC 3986 unreserved kept).
pub fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunked_body_is_decoded_only_when_it_ends_with_the_last_chunk() {
        let whole = b"4\r\nWiki\r\n6;ext=1\r\npedia \r\nE\r\nin \r\n\r\nchunks.\r\n0\r\n\r\n";
        assert_eq!(
            dechunk(whole).as_deref(),
            Some(&b"Wikipedia in \r\n\r\nchunks."[..])
        );
        assert_eq!(dechunk(b"4\r\nWiki\r\n"), None, "no last chunk");
        assert_eq!(dechunk(b"4\r\nWi"), None, "a short chunk");
        assert_eq!(dechunk(b"zz\r\n"), None, "not a hex size");
    }

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(url_encode("up == 1"), "up%20%3D%3D%201");
        assert_eq!(url_encode("a-b_c.d~e"), "a-b_c.d~e");
    }
}
