//! A headless Chromium driven over the Chrome DevTools Protocol on a pipe
//! (`--remote-debugging-pipe`: the browser reads commands on fd 3 and writes answers and events
//! on fd 4, each a JSON message ending in a NUL byte). No WebSocket, no port, no crate to build:
//! the handful of commands the page test needs (open a page, evaluate, set a file input, take a
//! screenshot) over `std` pipes.
#![allow(dead_code)] // each test binary uses its own subset

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

/// Where a browser is looked for: `$GLANCE_CHROMIUM`, else these names on `PATH`.
const NAMES: [&str; 4] = [
    "chromium",
    "chromium-browser",
    "google-chrome",
    "google-chrome-stable",
];

/// How long one command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// The Chromium binary, or why there is none.
pub fn find_chromium() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("GLANCE_CHROMIUM") {
        return Ok(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    NAMES
        .iter()
        .flat_map(|n| std::env::split_paths(&path).map(move |d| d.join(n)))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            format!(
                "no Chromium found (looked for {} on PATH, and $GLANCE_CHROMIUM): install it \
                 with `apt-get install -y --no-install-recommends chromium` (.ci/browser-deps \
                 does this in CI)",
                NAMES.join(", ")
            )
        })
}

/// A running headless browser with one page attached; killed when dropped.
pub struct Browser {
    child: Child,
    commands: std::io::PipeWriter,
    messages: Receiver<Value>,
    next_id: u64,
    /// The attached page's session.
    session: Option<String>,
    profile: PathBuf,
    log: PathBuf,
}

impl Browser {
    /// Starts `chromium --headless --remote-debugging-pipe` with a fresh profile under
    /// `scratch` and a `width × height` window.
    pub fn launch(scratch: &Path, width: u32, height: u32) -> Result<Self, String> {
        use std::os::fd::AsRawFd;
        use std::os::unix::process::CommandExt;
        let exe = find_chromium()?;
        let profile = scratch.join("chromium-profile");
        let log = scratch.join("chromium.log");
        let io = |e: std::io::Error| format!("starting {}: {e}", exe.display());
        let (cmd_read, cmd_write) = std::io::pipe().map_err(io)?;
        let (msg_read, msg_write) = std::io::pipe().map_err(io)?;
        let (a, b) = (cmd_read.as_raw_fd(), msg_write.as_raw_fd());
        let mut cmd = Command::new(&exe);
        cmd.args([
            "--headless",
            "--remote-debugging-pipe",
            // Containers run the tests as root, where Chromium's sandbox cannot start.
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--hide-scrollbars",
            &format!("--window-size={width},{height}"),
            &format!("--user-data-dir={}", profile.display()),
            "about:blank",
        ]);
        let out = std::fs::File::create(&log).map_err(io)?;
        cmd.stdin(Stdio::null())
            .stdout(out.try_clone().map_err(io)?)
            .stderr(out);
        // SAFETY: only async-signal-safe calls (fcntl, dup2) between fork and exec. The pipe ends
        // are first copied above 10 (close-on-exec) so that neither dup2 overwrites the other's
        // source; the dup2 copies at 3 and 4 stay open across exec.
        unsafe {
            cmd.pre_exec(move || {
                let a2 = libc::fcntl(a, libc::F_DUPFD_CLOEXEC, 10);
                let b2 = libc::fcntl(b, libc::F_DUPFD_CLOEXEC, 10);
                if a2 < 0 || b2 < 0 || libc::dup2(a2, 3) < 0 || libc::dup2(b2, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(io)?;
        // The child's ends: closed here, so that the reader sees the end when the browser exits.
        drop(cmd_read);
        drop(msg_write);
        let (tx, messages) = channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(msg_read);
            let mut buf = Vec::new();
            while matches!(r.read_until(0, &mut buf), Ok(n) if n > 0) {
                if buf.last() == Some(&0) {
                    buf.pop();
                }
                if let Ok(v) = serde_json::from_slice::<Value>(&buf) {
                    if tx.send(v).is_err() {
                        return;
                    }
                }
                buf.clear();
            }
        });
        Ok(Self {
            child,
            commands: cmd_write,
            messages,
            next_id: 0,
            session: None,
            profile,
            log,
        })
    }

    /// The browser's own output so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends `method` (to the attached page when there is one, else to the browser) and waits
    /// for its result; events in between are dropped.
    pub fn call(&mut self, method: &str, params: Value) -> Result<Value, String> {
        let session = self.session.clone();
        self.call_in(session.as_deref(), method, params)
    }

    fn call_in(
        &mut self,
        session: Option<&str>,
        method: &str,
        params: Value,
    ) -> Result<Value, String> {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        let mut bytes = msg.to_string().into_bytes();
        bytes.push(0);
        self.commands.write_all(&bytes).map_err(|e| {
            format!(
                "{method}: the browser is gone ({e}); its log:\n{}",
                self.log()
            )
        })?;
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let v = self.messages.recv_timeout(left).map_err(|e| {
                format!(
                    "{method}: no answer from the browser ({e}); its log:\n{}",
                    self.log()
                )
            })?;
            if v["id"].as_u64() != Some(id) {
                continue;
            }
            if let Some(e) = v.get("error") {
                return Err(format!("{method}: {e}"));
            }
            return Ok(v["result"].clone());
        }
    }

    /// Opens a new page at `url` and attaches to it (later calls go to it).
    pub fn open(&mut self, url: &str) -> Result<(), String> {
        let target = self.call_in(None, "Target.createTarget", json!({"url": "about:blank"}))?;
        let attached = self.call_in(
            None,
            "Target.attachToTarget",
            json!({"targetId": target["targetId"], "flatten": true}),
        )?;
        self.session = attached["sessionId"].as_str().map(String::from);
        self.call("Page.enable", json!({}))?;
        self.call("Page.navigate", json!({"url": url}))?;
        self.wait_for(
            "document.readyState === 'complete'",
            Duration::from_secs(20),
        )?;
        Ok(())
    }

    /// The value of a JavaScript expression (promises awaited); a thrown exception is an error.
    pub fn eval(&mut self, expression: &str) -> Result<Value, String> {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
        )?;
        if let Some(e) = r.get("exceptionDetails") {
            return Err(format!("{expression}: {e}"));
        }
        Ok(r["result"]["value"].clone())
    }

    /// Evaluates `expression` every 50 ms until it is truthy; its value.
    pub fn wait_for(&mut self, expression: &str, timeout: Duration) -> Result<Value, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let v = self.eval(expression)?;
            let truthy = !matches!(&v, Value::Null | Value::Bool(false))
                && v.as_str() != Some("")
                && v.as_f64() != Some(0.0);
            if truthy {
                return Ok(v);
            }
            if Instant::now() > deadline {
                return Err(format!("waited {timeout:?} for `{expression}` (last: {v})"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Puts `files` into the `<input type=file>` at `selector`, as a user choosing them does
    /// (the input's `change` event fires).
    pub fn set_files(&mut self, selector: &str, files: &[&Path]) -> Result<(), String> {
        let doc = self.call("DOM.getDocument", json!({}))?;
        let node = self.call(
            "DOM.querySelector",
            json!({"nodeId": doc["root"]["nodeId"], "selector": selector}),
        )?;
        let files: Vec<String> = files.iter().map(|p| p.display().to_string()).collect();
        self.call(
            "DOM.setFileInputFiles",
            json!({"nodeId": node["nodeId"], "files": files}),
        )?;
        Ok(())
    }

    /// A PNG of the page's viewport, written to `path`.
    pub fn screenshot(&mut self, path: &Path) -> Result<(), String> {
        use base64::Engine as _;
        let shot = self.call("Page.captureScreenshot", json!({"format": "png"}))?;
        let data = shot["data"].as_str().ok_or("no screenshot data")?;
        let png = base64::engine::general_purpose::STANDARD
            .decode(data)
            .map_err(|e| e.to_string())?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        }
        std::fs::write(path, png).map_err(|e| format!("{}: {e}", path.display()))
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}
