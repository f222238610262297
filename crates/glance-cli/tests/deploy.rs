//! `deploy/nginx.conf` in front of replicas, with a real nginx on loopback: a replica that answers
//! 503 (its queue full) has the request retried on another one, so every client gets its answer;
//! streaming passes through. The compose file runs this configuration in Docker; here the
//! `upstream` names two loopback replicas instead of the compose service, and nginx listens on
//! a free port. Needs `nginx` (`.ci/deploy-deps` installs it in CI; elsewhere the test says it
//! skipped).
#![cfg(unix)]

mod common;
mod serve_common;

use common::*;
use serde_json::json;
use serve_common::{parse_response, request_bytes, sse_data, Server};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The nginx binary: on `PATH`, else Debian's `/usr/sbin/nginx`.
fn nginx_binary() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join("nginx"))
            .find(|p| p.is_file())
    });
    on_path.or_else(|| Some(PathBuf::from("/usr/sbin/nginx")).filter(|p| p.is_file()))
}

/// A replica whose queue is always full: every request gets glance's 503 answer. Counts them.
fn busy_replica() -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            counter.fetch_add(1, Ordering::SeqCst);
            let _ = answer_503(conn);
        }
    });
    (addr, hits)
}

/// Reads one request (headers, then `Content-Length` bytes) and answers 503.
fn answer_503(conn: TcpStream) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    let error = r#"{"error":{"message":"server busy","type":"server_busy","code":503}}"#;
    let mut conn = conn;
    write!(
        conn,
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{error}",
        error.len()
    )
}

/// A free loopback port (bound, then released for nginx to take).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `deploy/nginx.conf` with the compose service's upstream server replaced by `replicas` and
/// nginx listening on `port`; fails if the file no longer has the lines this replaces.
fn site_config(replicas: &[&str], port: u16) -> String {
    let conf = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/nginx.conf"),
    )
    .unwrap();
    let server = "server glance:8000 ";
    let line = conf
        .lines()
        .find(|l| l.trim_start().starts_with(server))
        .unwrap_or_else(|| panic!("deploy/nginx.conf has no `{server}…` line"));
    let servers: Vec<String> = replicas
        .iter()
        .map(|r| line.replacen("glance:8000", r, 1))
        .collect();
    let listen = "listen 80;";
    assert!(conf.contains(listen), "deploy/nginx.conf has no `{listen}`");
    conf.replacen(line, &servers.join("\n"), 1).replacen(
        listen,
        &format!("listen 127.0.0.1:{port};"),
        1,
    )
}

/// nginx in the foreground, one process, everything under `dir`; stopped when dropped.
struct Nginx {
    child: Child,
    addr: String,
}

impl Nginx {
    fn start(bin: &Path, dir: &Path, site: &str, port: u16) -> Nginx {
        std::fs::create_dir_all(dir).unwrap();
        let site_path = dir.join("site.conf");
        std::fs::write(&site_path, site).unwrap();
        let main = format!(
            "daemon off;\nmaster_process off;\npid {pid};\nerror_log stderr;\n\
             events {{ worker_connections 64; }}\n\
             http {{\n    access_log off;\n    client_body_temp_path {tmp}/body;\n    \
             proxy_temp_path {tmp}/proxy;\n    include {site};\n}}\n",
            pid = dir.join("nginx.pid").display(),
            tmp = dir.display(),
            site = site_path.display(),
        );
        let conf = dir.join("nginx.conf");
        std::fs::write(&conf, main).unwrap();
        let args = |c: &mut Command| {
            c.arg("-e")
                .arg("stderr")
                .arg("-p")
                .arg(dir)
                .arg("-c")
                .arg(&conf);
        };
        let mut check = Command::new(bin);
        args(&mut check);
        let o = check.arg("-t").output().unwrap();
        assert!(o.status.success(), "nginx -t: {}", stderr(&o));
        let mut run = Command::new(bin);
        args(&mut run);
        let mut child = run.stdin(Stdio::null()).spawn().unwrap();
        let addr = format!("127.0.0.1:{port}");
        let start = Instant::now();
        while TcpStream::connect(&addr).is_err() {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("nginx exited: {status}");
            }
            assert!(start.elapsed() < Duration::from_secs(20), "nginx not up");
            std::thread::sleep(Duration::from_millis(50));
        }
        Nginx { child, addr }
    }

    /// One request through nginx: (status, body).
    fn request(&self, path: &str, body: &str) -> (u16, String) {
        let mut s = TcpStream::connect(&self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        s.write_all(&request_bytes("POST", path, Some(body)))
            .unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        parse_response(&out)
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn nginx_retries_a_busy_replica_on_another() {
    let Some(bin) = nginx_binary() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "no nginx in CI: .ci/deploy-deps installs it"
        );
        eprintln!("skipped: no nginx (Debian's nginx-light has it)");
        return;
    };
    let dir = scratch("deploy");
    let (busy, hits) = busy_replica();
    let server = Server::start(&["--max-batch", "2"]);
    let port = free_port();
    let nginx = Nginx::start(&bin, &dir, &site_config(&[&busy, &server.addr], port), port);

    let ask = json!({
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 3,
        "temperature": 0,
    });
    // Every request is answered, although the busy replica refuses each one it is given.
    for i in 0..4 {
        let (status, body) = nginx.request("/v1/chat/completions", &ask.to_string());
        assert_eq!(status, 200, "request {i}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["object"], "chat.completion", "{v}");
    }
    assert!(
        hits.load(Ordering::SeqCst) >= 1,
        "nginx never tried the busy replica: the retry was not exercised"
    );
    // Streaming passes through, ending with [DONE].
    let mut stream = ask.clone();
    stream["stream"] = json!(true);
    let (status, body) = nginx.request("/v1/chat/completions", &stream.to_string());
    assert_eq!(status, 200, "{body}");
    let events = sse_data(&body);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{body}");
    assert!(events.len() >= 2, "{body}");
    drop(nginx);
    let _ = std::fs::remove_dir_all(&dir);
}
