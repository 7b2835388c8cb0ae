//! The generated server's request handling on arbitrary bytes: each input is written, as it
//! is, to a fresh loopback connection of a running server (`stories260k-chat-cpu-f32`, which
//! serves completions and chat completions, on the real stories260k model), followed by a
//! request that closes the connection. Whatever the bytes (a malformed request line, wrong
//! headers, a body cut short, JSON of any shape, pipelined requests), the server never answers
//! with a 5xx, every JSON answer it gives is well formed (an error's an OpenAI error object),
//! and it answers the next connection: nothing an input does stops it. The model is found through `MONOGEN_MODELS`, else
//! `../shared/models` beside the repository.
#![no_main]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use stories260k_chat_cpu_f32::serve::{Options, Server};

/// The server, started once for the whole run.
fn server() -> SocketAddr {
    static ADDR: OnceLock<SocketAddr> = OnceLock::new();
    *ADDR.get_or_init(|| {
        let models = std::env::var_os("MONOGEN_MODELS")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/models")));
        let options = Options { model: models.join("stories260k"), host: "127.0.0.1".into(), port: 0, api_key: None };
        let server = Server::start(&options).unwrap_or_else(|e| panic!("the server does not start: {e}"));
        let addr = server.addr();
        // It serves until the process ends.
        std::mem::forget(server);
        addr
    })
}

/// The answers in `bytes`, in order, as (status, head, body): each head up to its blank line,
/// then a body of its Content-Length, or its chunks; an answer cut short ends the list.
fn answers(bytes: &[u8]) -> Vec<(u16, String, Vec<u8>)> {
    fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
        hay.windows(needle.len()).position(|w| w == needle)
    }
    let mut out = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let Some(end) = find(rest, b"\r\n\r\n") else { break };
        let head = String::from_utf8_lossy(&rest[..end]).into_owned();
        let status = head.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
        rest = &rest[end + 4..];
        let lower = head.to_ascii_lowercase();
        let mut body = Vec::new();
        if lower.contains("\r\ntransfer-encoding: chunked") {
            loop {
                let Some(line) = find(rest, b"\r\n") else { return out };
                let size = std::str::from_utf8(&rest[..line]).ok().and_then(|s| usize::from_str_radix(s.trim(), 16).ok());
                let Some(size) = size else { return out };
                rest = &rest[line + 2..];
                if rest.len() < size + 2 {
                    return out;
                }
                body.extend_from_slice(&rest[..size]);
                rest = &rest[size + 2..];
                if size == 0 {
                    break;
                }
            }
        } else {
            let length = lower
                .lines()
                .find_map(|l| l.strip_prefix("content-length: ").and_then(|n| n.trim().parse::<usize>().ok()))
                .unwrap_or(0);
            // An answer to HEAD has the length of the body it leaves out.
            let length = if rest.starts_with(b"HTTP/1.") { 0 } else { length };
            if rest.len() < length {
                return out;
            }
            body.extend_from_slice(&rest[..length]);
            rest = &rest[length..];
        }
        out.push((status, head, body));
    }
    out
}

/// Checks what the server answered: HTTP status lines, no 5xx, and a well-formed body where
/// it says JSON (an error's an OpenAI error object).
fn check_answer(bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    assert!(bytes.is_empty() || text.starts_with("HTTP/1."), "not an HTTP answer: {text:?}");
    for (status, head, body) in answers(bytes) {
        assert!(head.starts_with("HTTP/1.") && (100..500).contains(&status), "a 5xx or no status: {text:?}");
        if head.to_ascii_lowercase().contains("\r\ncontent-type: application/json") {
            let value: serde_json::Value = serde_json::from_slice(&body)
                .unwrap_or_else(|e| panic!("a JSON answer that is not JSON ({e}): {text:?}"));
            if status >= 400 {
                assert!(value["error"]["message"].is_string(), "an error that is not an OpenAI error object: {text:?}");
            }
        }
    }
}

/// A request after the input that asks the server to close the connection once it has
/// answered: the end of the answers to a complete input. (Closing our side instead would end
/// the exchange early: hyper drops a connection whose client half-closes mid-request.)
const LAST: &[u8] = b"GET /health HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\n\r\n";

/// Writes `data` and [`LAST`] to a fresh connection, and reads until the server closes it, or
/// until it has been quiet for a second (it waits for the rest of a request cut short); then the
/// server must still answer a request of its own, within 10 s. Returns what it answered.
fn exchange(addr: SocketAddr, data: &[u8]) -> Vec<u8> {
    let mut stream = TcpStream::connect(addr).expect("the server takes connections");
    stream.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    // The server may answer and close before it has read everything: a failed write is fine.
    let _ = stream.write_all(data).and_then(|()| stream.write_all(LAST));
    stream.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let started = Instant::now();
    let mut answer = Vec::new();
    let mut buffer = [0u8; 16384];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buffer[..n]),
            Err(_) => break, // Quiet (a request cut short waits for more), or reset.
        }
        assert!(started.elapsed() < Duration::from_secs(60), "an answer that does not end");
    }
    drop(stream);
    let mut health = TcpStream::connect(addr).expect("the server still takes connections");
    health.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    health.write_all(LAST).unwrap();
    let mut alive = Vec::new();
    let _ = health.read_to_end(&mut alive);
    assert!(alive.starts_with(b"HTTP/1.1 200"), "the server stopped answering: {:?}", String::from_utf8_lossy(&alive));
    answer
}

fuzz_target!(|data: &[u8]| {
    let answer = exchange(server(), data);
    check_answer(&answer);
});
