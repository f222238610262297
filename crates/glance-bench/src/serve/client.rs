//! The clients of a serving benchmark: streaming chat requests over plain HTTP/1.1, each timed
//! at every server-sent event as a client sees it.

use crate::{BenchError, Result};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// One request as its client saw it.
#[derive(Debug, Clone)]
pub struct Sample {
    pub ttft: f64,
    /// Time per output token after the first (`None` for a one-token answer).
    pub tpot: Option<f64>,
    pub tokens: usize,
}

/// `clients` threads, each sending `requests` streaming requests one after the other; client
/// `c` sends the `glance` options `options[c mod len]` (null: none). Each sample comes with the
/// index of its options.
pub fn wave(
    addr: SocketAddr,
    images: &[String],
    options: &[Value],
    clients: usize,
    requests: usize,
    ask: (usize, bool),
) -> Result<Vec<(usize, Sample)>> {
    let results: Vec<Result<Vec<(usize, Sample)>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..clients)
            .map(|c| {
                let image = &images[c % images.len()];
                let o = c % options.len();
                let glance = &options[o];
                scope.spawn(move || {
                    (0..requests)
                        .map(|r| stream_once(addr, image, c * requests + r, ask, glance))
                        .map(|s| s.map(|s| (o, s)))
                        .collect::<Result<Vec<_>>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(BenchError::Check("a client panicked".into())))
            })
            .collect()
    });
    let mut all = Vec::new();
    for r in results {
        all.extend(r?);
    }
    Ok(all)
}

/// One streaming chat request over a fresh connection, timed at each SSE event; `glance` holds
/// the request's glance options (or is null).
pub fn stream_once(
    addr: SocketAddr,
    image: &str,
    n: usize,
    (max_tokens, ignore_eos): (usize, bool),
    glance: &Value,
) -> Result<Sample> {
    let questions = [
        "Describe the image.",
        "What is in the image?",
        "What do you see?",
    ];
    let mut content = vec![json!({"type": "text", "text": questions[n % questions.len()]})];
    if !image.is_empty() {
        content.insert(0, json!({"type": "image_url", "image_url": {"url": image}}));
    }
    let mut body = json!({
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens, "ignore_eos": ignore_eos, "temperature": 0, "stream": true,
        "stream_options": {"include_usage": true},
    });
    if !glance.is_null() {
        body["glance"] = glance.clone();
    }
    let body = body.to_string();
    let start = Instant::now();
    let mut conn = TcpStream::connect(addr)?;
    conn.set_read_timeout(Some(Duration::from_secs(600)))?;
    write!(
        conn,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut reader = BufReader::new(conn);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    if !line.starts_with("HTTP/1.1 200") {
        // The error body (OpenAI's shape) says which field and why: show its message.
        let mut rest = String::new();
        let _ = reader.take(64 << 10).read_to_string(&mut rest);
        let body = rest.split("\r\n\r\n").nth(1).unwrap_or("");
        let message = serde_json::from_str::<Value>(body)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
            .unwrap_or_else(|| body.trim().to_string());
        return Err(BenchError::Check(format!(
            "the server answered {}: {message}",
            line.trim()
        )));
    }
    let (mut first, mut last, mut tokens) = (None, None, 0);
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            break;
        }
        let Some(data) = line.trim_end().strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(data)?;
        if let Some(u) = v.get("usage").and_then(|u| u["completion_tokens"].as_u64()) {
            tokens = u as usize;
        }
        let content = v["choices"][0]["delta"]["content"].as_str();
        if content.is_some_and(|c| !c.is_empty()) {
            let now = start.elapsed().as_secs_f64();
            first.get_or_insert(now);
            last = Some(now);
        }
    }
    let end = start.elapsed().as_secs_f64();
    let ttft = first.unwrap_or(end);
    let tpot = (tokens > 1).then(|| (last.unwrap_or(end) - ttft) / (tokens - 1) as f64);
    Ok(Sample { ttft, tpot, tokens })
}

/// The `p`-th percentile (nearest rank); 0 for no samples.
pub fn pct(xs: &[f64], p: f64) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let xs = [4.0, 1.0, 3.0, 2.0];
        assert_eq!(pct(&xs, 50.0), 2.0);
        assert_eq!(pct(&xs, 99.0), 4.0);
        assert_eq!(pct(&xs, 0.0), 1.0);
        assert_eq!(pct(&[], 50.0), 0.0);
    }
}
