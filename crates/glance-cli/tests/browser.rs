//! The chat page of `glance serve` (`GET /`) in a real headless Chromium: a world image is
//! uploaded through the file input, a question asked with pruning to 12.5% and speculative
//! decoding; the streamed answer must equal `glance run`'s with the same options, the kept-token
//! overlay must dim exactly the pruned patches, "compare" must give `glance run`'s plain answer,
//! a follow-up with a second image must draw both images' overlays, and bad requests (max_tokens 0, an image over the pixel limit) must show their errors while
//! the page stays usable. The first paint is printed and a screenshot saved to
//! `target/ci-artifacts/page.png`.
//!
//! Chromium comes from Debian's packages (`.ci/browser-deps`, run by `.ci/run`); without one the
//! test fails and says how to install it.
#![cfg(unix)]

mod cdp;
mod common;
mod serve_common;

use cdp::Browser;
use common::*;
use glance_prune::Budget;
use serde_json::Value;
use serve_common::Server;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const QUESTION: &str = "Describe the image.";
const MAX_TOKENS: &str = "48";

/// `glance run --json` on the image with `flags`.
fn run_json(image: &Path, flags: &[&str]) -> Value {
    let args = [
        &[
            "run",
            "--image",
            s(image),
            "--prompt",
            QUESTION,
            "--max-new-tokens",
            MAX_TOKENS,
            "--json",
        ][..],
        flags,
    ]
    .concat();
    let o = glance(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_str(&stdout(&o)).unwrap()
}

/// A JavaScript string literal.
fn js(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// Sets the value of the element with id `id`.
fn set(page: &mut Browser, id: &str, value: &str) {
    let js_set = format!("document.getElementById({}).value = {}", js(id), js(value));
    page.eval(&js_set).unwrap();
}

/// Types `question` and presses send.
fn ask(page: &mut Browser, question: &str) {
    set(page, "question", question);
    page.eval("document.getElementById('send').click()")
        .unwrap();
}

/// Chooses `image` in the file input and waits for it among the next question's images.
fn attach(page: &mut Browser, image: &Path) {
    page.set_files("#files", &[image]).unwrap();
    page.wait_for(
        "document.querySelectorAll('#pending img').length === 1",
        Duration::from_secs(10),
    )
    .unwrap_or_else(|e| panic!("{e}"));
}

/// Waits for an answer that failed; the message the page shows.
fn shown_error(page: &mut Browser) -> String {
    let text = page
        .wait_for(
            "(() => { const t = document.querySelector('.turn.assistant[data-state=error]'); \
             return t && t.textContent; })()",
            Duration::from_secs(20),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    text.as_str().unwrap_or_default().to_string()
}

/// Where CI collects what it keeps: `target/ci-artifacts/`.
fn artifacts() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("../ci-artifacts")
}

#[test]
fn the_page_answers_like_glance_run_and_draws_what_each_accelerator_did() {
    let started = Instant::now();
    let dir = scratch("browser");
    // The browser first: without one there is nothing to test, and the test says why.
    let mut page = Browser::launch(&dir, 1200, 780).unwrap_or_else(|e| panic!("{e}"));
    let world = dir.join("world");
    let image = world_sample(&world, 0);
    let pruned = run_json(
        &image,
        &[
            "--prune", "adaptive", "--keep", "0.125", "--decode", "vispec",
        ],
    );
    let plain = run_json(&image, &[]);
    let server = Server::start(&[]);

    page.open(&format!("http://{}/", server.addr))
        .unwrap_or_else(|e| panic!("{e}"));
    // Paint timing is recorded once the first frame is presented, after the load.
    let paint = page
        .wait_for(
            "(() => { const p = performance.getEntriesByName('first-contentful-paint')[0]; \
             return p && p.startTime; })()",
            Duration::from_secs(10),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    let paint = paint.as_f64().unwrap_or(f64::NAN);
    let nav = page
        .eval(
            "(() => { const n = performance.getEntriesByType('navigation')[0]; \
             return [n.responseEnd, n.domContentLoadedEventEnd]; })()",
        )
        .unwrap();
    println!(
        "first contentful paint: {paint:.1} ms after navigation start (target: 100 ms); \
         page received, DOM ready at {nav} ms"
    );
    assert!(
        paint < 500.0,
        "first paint {paint} ms after navigation start"
    );

    // The real question: a world image through the file input, pruning to 12.5%, vispec.
    set(&mut page, "max-tokens", MAX_TOKENS);
    set(&mut page, "prune", "adaptive");
    set(&mut page, "keep", "12.5");
    set(&mut page, "decode", "vispec");
    set(&mut page, "temperature", "0");
    attach(&mut page, &image);
    ask(&mut page, QUESTION);
    let done = "document.querySelectorAll('.turn.assistant[data-state=done]').length === 1";
    page.wait_for(done, Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{e}\n{}", page.log()));
    let answer = page
        .eval("document.querySelector('.turn.assistant[data-state=done] .answer-text').textContent")
        .unwrap();
    assert_eq!(answer, pruned["text"], "the page's answer and glance run's");

    // The overlay dims every pruned patch: of the image's visual tokens, 12.5% are kept.
    let canvas = "document.querySelector('.turn.assistant[data-state=done] canvas[data-drawn]')";
    page.wait_for(canvas, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{e}"));
    let dimmed: usize = page
        .eval(&format!("{canvas}.dataset.dimmed"))
        .unwrap()
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap();
    let visual = pruned["usage"]["visual_tokens"].as_u64().unwrap() as usize;
    let kept = pruned["usage"]["kept_visual_tokens"].as_u64().unwrap() as usize;
    assert_eq!(kept, Budget::Ratio(0.125).resolve(visual));
    assert_eq!(dimmed, visual - kept, "dimmed patches");

    // Speculative decoding accepted drafts: some tokens share a target pass, shaded together.
    let shaded = page
        .eval("document.querySelectorAll('.turn.assistant[data-state=done] .step').length")
        .unwrap();
    assert!(
        shaded.as_u64().unwrap_or(0) > 0,
        "no multi-token step shaded"
    );

    // "compare": the same request with plain autoregressive decoding and every visual token.
    page.eval("document.querySelector('.turn.assistant[data-state=done] .compare').click()")
        .unwrap();
    page.wait_for(
        "document.querySelector('.run[data-state=done] .answer-text')",
        Duration::from_secs(30),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let compared = page
        .eval("document.querySelector('.run[data-state=done] .answer-text').textContent")
        .unwrap();
    assert_eq!(
        compared, plain["text"],
        "compare's answer and plain glance run's"
    );
    let ttfts = page
        .eval("Array.from(document.querySelectorAll('.stats')).map(s => s.dataset.ttftMs)")
        .unwrap();
    println!("time to first token on the page (pruned + vispec, plain ar): {ttfts} ms");

    let shot = artifacts().join("page.png");
    page.screenshot(&shot).unwrap_or_else(|e| panic!("{e}"));
    assert!(std::fs::metadata(&shot).unwrap().len() > 10_000);
    println!("screenshot: {}", shot.display());

    // A bad request (max_tokens 0) shows the server's message; the page stays usable.
    set(&mut page, "max-tokens", "0");
    ask(&mut page, QUESTION);
    let error = shown_error(&mut page);
    assert!(
        error.contains("400") && error.contains("max_tokens"),
        "{error}"
    );

    // ... and the conversation goes on, with a second image: each image of the conversation
    // gets its overlay, pruned to 12.5% on its own.
    set(&mut page, "max-tokens", MAX_TOKENS);
    attach(&mut page, &world_sample(&world, 1));
    ask(&mut page, "How many objects are there?");
    page.wait_for(
        "document.querySelectorAll('.turn.assistant[data-state=done]').length === 2",
        Duration::from_secs(30),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let last = "Array.from(document.querySelectorAll('.turn.assistant[data-state=done]')).pop()";
    let follow_up = page
        .eval(&format!("{last}.querySelector('.answer-text').textContent"))
        .unwrap();
    assert!(
        !follow_up.as_str().unwrap_or_default().is_empty(),
        "{follow_up}"
    );
    let overlays = page
        .wait_for(
            &format!(
                "(() => {{ const c = {last}.querySelectorAll('canvas[data-drawn]'); \
                 return c.length === 2 && Array.from(c).map(c => c.dataset.dimmed); }})()"
            ),
            Duration::from_secs(10),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    let per_image = (visual - kept).to_string();
    assert_eq!(overlays, serde_json::json!([per_image, per_image]));

    // An image over a server's pixel limit is refused with a message the page shows.
    let strict = Server::start(&["--max-image-pixels", "4096"]);
    page.open(&format!("http://{}/", strict.addr))
        .unwrap_or_else(|e| panic!("{e}"));
    attach(&mut page, &image);
    ask(&mut page, QUESTION);
    let error = shown_error(&mut page);
    assert!(error.contains("400") && error.contains("pixels"), "{error}");
    assert_eq!(
        page.eval("document.getElementById('send').disabled")
            .unwrap(),
        Value::Bool(false),
        "the page takes the next question"
    );
    println!("the test took {:.1} s", started.elapsed().as_secs_f64());
}
