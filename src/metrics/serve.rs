//! The `--metrics-address` listener: one thread, one route (`GET /metrics`), on std's sockets. A
//! scrape is one short request every few seconds; a web framework (or hyper, which object_store
//! brings only as a client) would be more code to hold than this.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::OnceLock;
use std::time::Duration;

use super::text;

/// How long a scraper may take to send its request, or a scrape to answer: a stalled peer must not
/// hold the one thread that serves.
const PATIENCE: Duration = Duration::from_secs(5);

/// Where this process serves its metrics, once it does.
static SERVING: OnceLock<SocketAddr> = OnceLock::new();

/// The address this process serves its metrics at (the port chosen when port 0 was asked for).
pub fn address() -> Option<SocketAddr> {
    SERVING.get().copied()
}

/// Listens on `address` (`HOST:PORT`) and serves the metrics from a thread of its own for the
/// life of the process; the error is one line naming the address.
pub fn start(address: &str) -> Result<SocketAddr, String> {
    let listener =
        TcpListener::bind(address).map_err(|e| format!("--metrics-address {address}: cannot listen: {e}"))?;
    let bound = listener.local_addr().map_err(|e| format!("--metrics-address {address}: {e}"))?;
    if SERVING.set(bound).is_err() {
        return Err(format!("--metrics-address {address}: this process serves its metrics already"));
    }
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                if let Err(e) = answer(stream) {
                    log::debug!("metrics: {e}");
                }
            }
        })
        .map_err(|e| format!("--metrics-address {address}: cannot start its thread: {e}"))?;
    Ok(bound)
}

/// Answers one request on `stream`: the metrics for `GET /metrics`, 404 or 405 otherwise.
fn answer(stream: TcpStream) -> std::io::Result<()> {
    stream.set_read_timeout(Some(PATIENCE))?;
    stream.set_write_timeout(Some(PATIENCE))?;
    let mut reader = BufReader::new(stream.try_clone()?.take(64 << 10));
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    // The headers are read to their end (and ignored), so that the peer sees a clean close.
    let mut line = String::new();
    while reader.read_line(&mut line)? > 2 {
        line.clear();
    }
    let mut parts = request_line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, body) = match (method, path) {
        ("GET" | "HEAD", "/metrics") => ("200 OK", text::render(&super::snapshot())),
        ("GET" | "HEAD", _) => ("404 Not Found", "only /metrics is served here\n".to_string()),
        _ => ("405 Method Not Allowed", "only GET is served here\n".to_string()),
    };
    let mut stream = stream;
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        text::CONTENT_TYPE,
        body.len()
    )?;
    if method != "HEAD" {
        stream.write_all(body.as_bytes())?;
    }
    stream.flush()
}

/// The metrics text served at `address` (`shardfs status`); the error is one line.
pub fn scrape(address: SocketAddr) -> Result<String, String> {
    // A daemon listening on every address is asked on this machine's own.
    let address = match address.ip().is_unspecified() {
        true => match address {
            SocketAddr::V4(a) => SocketAddr::from(([127, 0, 0, 1], a.port())),
            SocketAddr::V6(a) => SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, a.port())),
        },
        false => address,
    };
    let failed = |e: std::io::Error| format!("metrics at {address}: {e}");
    let target = address.to_socket_addrs().map_err(failed)?.next().ok_or_else(|| format!("{address}: no address"))?;
    let mut stream = TcpStream::connect_timeout(&target, PATIENCE).map_err(failed)?;
    stream.set_read_timeout(Some(PATIENCE)).map_err(failed)?;
    write!(stream, "GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n").map_err(failed)?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).map_err(failed)?;
    let (head, body) = reply.split_once("\r\n\r\n").ok_or_else(|| format!("metrics at {address}: no HTTP answer"))?;
    match head.lines().next().is_some_and(|status| status.split(' ').nth(1) == Some("200")) {
        true => Ok(body.to_string()),
        false => Err(format!("metrics at {address}: {}", head.lines().next().unwrap_or_default())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serves_the_metrics_route_only() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            for stream in listener.incoming().take(2) {
                answer(stream.unwrap()).unwrap();
            }
        });
        super::super::error_given(libc::ENOENT);
        let text = scrape(address).unwrap();
        assert!(text.contains("# TYPE shardfs_store_requests_total counter"), "{text}");
        assert!(text.contains("shardfs_errors_total{errno=\"ENOENT\"}"), "{text}");
        let mut stream = TcpStream::connect(address).unwrap();
        stream.write_all(b"GET /other HTTP/1.1\r\n\r\n").unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).unwrap();
        assert!(reply.starts_with("HTTP/1.1 404"), "{reply}");
        server.join().unwrap();
    }
}
