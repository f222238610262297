//! A stop requested from outside the training loop: the CLI's SIGINT / SIGTERM handler calls
//! [`request`] (one atomic store, safe in a signal handler). The step loops ([`crate::trainer`]'s
//! and the single-stage trainers' shared loop) check [`requested`] before each step: when it is
//! set they write a checkpoint and return [`crate::trainer::RunEnd::Interrupted`], and `--resume`
//! continues from there.

use std::sync::atomic::{AtomicI32, Ordering};

/// The signal number that asked to stop (0: none).
static SIGNAL: AtomicI32 = AtomicI32::new(0);

/// Asks the running loop to checkpoint and stop; `signal` is reported back (any value ≤ 0
/// counts as 1). Async-signal-safe.
pub fn request(signal: i32) {
    SIGNAL.store(signal.max(1), Ordering::SeqCst);
}

/// The signal of a pending stop request.
pub fn requested() -> Option<i32> {
    match SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// Forgets a stop request (a loop that honoured one clears it).
pub fn clear() {
    SIGNAL.store(0, Ordering::SeqCst);
}
