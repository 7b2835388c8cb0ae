//! A plain HTTP/1.1 client for the generated servers' tests: one request per connection, the
//! answer read whole (chunked bodies joined).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// An HTTP/1.1 answer: status, headers (names in lower case) and body (chunks joined).
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// The `data:` payloads of a stream of server-sent events.
    pub fn events(&self) -> Vec<String> {
        self.body
            .split("\n\n")
            .filter(|e| !e.trim().is_empty())
            .map(|e| {
                e.strip_prefix("data: ").unwrap_or_else(|| panic!("not a data event: {e:?}")).to_string()
            })
            .collect()
    }
}

pub fn send(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Answer {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    // A server may answer (413) and close before it has read a body it refuses.
    let _ = stream.write_all(body);
    let mut raw = Vec::new();
    let mut buffer = [0; 65536];
    while let Ok(n) = stream.read(&mut buffer) {
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buffer[..n]);
    }
    parse_answer(&raw)
}

pub fn parse_answer(raw: &[u8]) -> Answer {
    let text = String::from_utf8_lossy(raw);
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no header end: {text:?}"));
    let mut lines = head.lines();
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let chunked = headers.iter().any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked { dechunk(rest) } else { rest.to_string() };
    Answer { status, headers, body }
}

fn dechunk(mut rest: &str) -> String {
    let mut body = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n").expect("a chunk size");
        let size = usize::from_str_radix(size.trim(), 16).expect("a hex chunk size");
        if size == 0 {
            return body;
        }
        body.push_str(&after[..size]);
        rest = &after[size + 2..];
    }
}

pub fn post(addr: SocketAddr, path: &str, body: &Value) -> Answer {
    send(addr, "POST", path, &[("Content-Type", "application/json")], body.to_string().as_bytes())
}

/// The value of the Prometheus metric `name` (a line `name value`) on the server at `addr`.
pub fn metric(addr: SocketAddr, name: &str) -> f64 {
    let text = send(addr, "GET", "/metrics", &[], b"").body;
    let line = text.lines().find(|l| l.split(' ').next() == Some(name)).unwrap_or_else(|| panic!("{name}"));
    line.split(' ').nth(1).unwrap().parse().unwrap()
}

/// A generated crate's binary running `serve --model DIR --port 0`, at the loopback address
/// its first line printed.
pub struct ServeProcess {
    pub child: Child,
    pub addr: SocketAddr,
    /// Held open, so that the server's stdout stays writable.
    _stdout: BufReader<ChildStdout>,
}

impl ServeProcess {
    pub fn start(binary: &Path, model: &Path) -> ServeProcess {
        let mut child = Command::new(binary)
            .args(["serve", "--model", model.to_str().unwrap(), "--port", "0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        stdout.read_line(&mut first).unwrap();
        let addr: SocketAddr = first
            .trim()
            .strip_prefix("listening on http://")
            .unwrap_or_else(|| panic!("{first:?}"))
            .parse()
            .unwrap();
        assert!(addr.ip().is_loopback());
        ServeProcess { child, addr, _stdout: stdout }
    }

    /// Sends the process SIG`signal` (`TERM`, `INT`).
    pub fn signal(&self, signal: &str) {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill").args([&format!("-{signal}"), &pid]).status().unwrap().success());
    }

    /// After SIG`signal`: the process exits 0 within 30 seconds, having said it was stopping, and
    /// no longer listens.
    pub fn assert_stopped(mut self, signal: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "SIG{signal}: the server did not exit");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "SIG{signal}: {status}");
        let mut stderr = String::new();
        self.child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
        assert!(stderr.contains("stopping"), "SIG{signal}: {stderr}");
        assert!(TcpStream::connect(self.addr).is_err(), "SIG{signal}: it no longer listens");
    }
}
