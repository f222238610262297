//! A `glance serve` started by a test on a free loopback port, and a minimal HTTP/1.1 client over
//! `std::net::TcpStream` (no HTTP crate to build for the tests).
#![allow(dead_code)] // each test binary uses its own subset

use base64::Engine as _;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The glance home of the tests (the shipped models are installed there, once).
pub const TEST_HOME: &str = concat!(env!("CARGO_TARGET_TMPDIR"), "/glance-home");

/// A running server; killed when dropped.
pub struct Server {
    child: Child,
    pub addr: String,
}

impl Server {
    /// Starts `glance serve --port 0 args…` and waits for its "listening on" line.
    pub fn start(args: &[&str]) -> Server {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_glance"));
        cmd.env("GLANCE_HOME", TEST_HOME);
        Self::start_command(cmd, args)
    }

    /// [`Server::start`] with `cmd` (a program, its directory and environment) in place of the
    /// built binary.
    pub fn start_command(cmd: Command, args: &[&str]) -> Server {
        Self::start_with_stderr(cmd, args, Stdio::inherit())
    }

    /// [`Server::start_command`] with the server's stderr (its request logs) sent to `stderr`.
    pub fn start_with_stderr(mut cmd: Command, args: &[&str], stderr: Stdio) -> Server {
        let mut child = cmd
            .arg("serve")
            .args(["--port", "0", "--threads", "1"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("binary runs");
        let out = child.stdout.take().expect("piped");
        let mut line = String::new();
        BufReader::new(out).read_line(&mut line).expect("stdout");
        let addr = line
            .split("http://")
            .nth(1)
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .trim()
            .to_string();
        Server { child, addr }
    }

    /// One request on a fresh connection: (status, body).
    pub fn request(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        let raw = self.raw(&request_bytes(method, path, body));
        parse_response(&raw)
    }

    /// `POST /v1/chat/completions` with a JSON body: (status, parsed body).
    pub fn chat(&self, body: &Value) -> (u16, Value) {
        let (status, text) = self.request("POST", "/v1/chat/completions", Some(&body.to_string()));
        let v = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{status}: not JSON ({e}): {text}"));
        (status, v)
    }

    /// A streaming chat: (status, the `data:` payloads in order).
    pub fn chat_stream(&self, body: &Value) -> (u16, Vec<String>) {
        let (status, text) = self.request("POST", "/v1/chat/completions", Some(&body.to_string()));
        (status, sse_data(&text))
    }

    /// Sends `bytes` and reads the whole answer (the server closes: `Connection: close`). A
    /// server that answers before reading everything may close early: the write error is
    /// ignored and the answer read.
    pub fn raw(&self, bytes: &[u8]) -> Vec<u8> {
        let mut s = self.connect();
        let _ = s.write_all(bytes);
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        out
    }

    pub fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(&self.addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        s
    }

    /// The Prometheus text of `/metrics`.
    pub fn metrics(&self) -> String {
        let (status, text) = self.request("GET", "/metrics", None);
        assert_eq!(status, 200);
        text
    }

    /// A sample of `/metrics` (`name{labels…}`, the value), 0 when absent.
    pub fn metric(&self, name_and_labels: &str) -> f64 {
        self.metrics()
            .lines()
            .find_map(|l| l.strip_prefix(name_and_labels)?.trim().parse().ok())
            .unwrap_or(0.0)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn request_bytes(method: &str, path: &str, body: Option<&str>) -> Vec<u8> {
    let body = body.unwrap_or("");
    format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// (status, body) of a raw HTTP/1.1 response, de-chunked.
pub fn parse_response(raw: &[u8]) -> (u16, String) {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP response: {text:?}"));
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status: {head}"));
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    (status, body)
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].strip_prefix("\r\n").unwrap_or(&rest[n..]);
    }
    out
}

/// The `data:` payloads of an SSE body.
pub fn sse_data(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

/// The text of a stream's content deltas.
pub fn stream_text(events: &[String]) -> String {
    events
        .iter()
        .filter(|e| e.as_str() != "[DONE]")
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(String::from)
        })
        .collect()
}

/// A `data:image/png` URL of the fixture image `fixtures/images/<name>`.
pub fn image_url(name: &str) -> String {
    let bytes = std::fs::read(crate::common::fixture(&format!("images/{name}"))).unwrap();
    data_url(&bytes, "image/png")
}

/// A `data:image/…;base64,…` URL of `bytes`.
pub fn data_url(bytes: &[u8], mime: &str) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(bytes);
    format!("data:{mime};base64,{b64}")
}
