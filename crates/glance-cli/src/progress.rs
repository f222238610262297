//! The progress display of training commands: an indicatif bar on a terminal; when stderr is not
//! one (a log file), a plain progress line at most every 30 seconds and at the last step.

use indicatif::{ProgressBar, ProgressStyle};
use std::time::Instant;

/// One bar at a time, restarted per stage.
#[derive(Default)]
pub struct TrainBar {
    bar: Option<ProgressBar>,
    /// When the last plain-text progress line was written (hidden bar only).
    last_line: Option<Instant>,
}

impl TrainBar {
    /// A new bar labelled `prefix` at `step` of `total` (unknown: 0), replacing any other.
    pub fn start(&mut self, prefix: &str, step: u64, total: Option<u64>) {
        self.finish();
        let bar = ProgressBar::new(total.unwrap_or(0));
        bar.set_style(
            ProgressStyle::with_template(
                "{prefix:>6} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_prefix(prefix.to_string());
        bar.set_position(step);
        self.bar = Some(bar);
    }

    /// Step `step` (of `total` once known) done; `msg` describes it.
    pub fn update(&mut self, label: &str, step: u64, total: Option<u64>, msg: String) {
        let Some(b) = &self.bar else {
            return;
        };
        if let Some(t) = total {
            b.set_length(t);
        }
        b.set_position(step);
        if b.is_hidden() {
            let last = total == Some(step);
            if last || self.last_line.is_none_or(|t| t.elapsed().as_secs() >= 30) {
                let total = total.map_or("?".to_string(), |t| t.to_string());
                eprintln!("{label} step {step}/{total}: {msg}");
                self.last_line = Some(Instant::now());
            }
        }
        b.set_message(msg);
    }

    /// A line above the bar (plain stderr when the bar is hidden).
    pub fn print(&self, text: &str) {
        match &self.bar {
            Some(b) if !b.is_hidden() => b.println(text),
            _ => eprintln!("{text}"),
        }
    }

    /// A validation's line above the bar: `[step N] validation: SUMMARY (S s)`.
    pub fn validation(&self, step: u64, summary: &str, seconds: f64) {
        self.print(&format!(
            "[step {step}] validation: {summary} ({seconds:.0} s)"
        ));
    }

    pub fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish();
        }
    }
}
