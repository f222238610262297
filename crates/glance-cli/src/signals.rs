//! Ctrl-C (SIGINT) and SIGTERM during training: the first one asks the training loop to write a
//! checkpoint and stop ([`glance_train::interrupt`]); the handler then resets itself, so a second
//! one ends the process at once.

use std::path::Path;

#[cfg(unix)]
extern "C" fn on_signal(signal: libc::c_int) {
    // One atomic store: async-signal-safe.
    glance_train::interrupt::request(signal);
}

/// Installs the handler for SIGINT and SIGTERM (on Unix; elsewhere the default handling stays).
pub fn checkpoint_on_signals() {
    #[cfg(unix)]
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: `sigaction` with a zeroed struct, an empty mask and a handler that only stores
        // to an atomic; SA_RESETHAND restores the default action after the first delivery.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            action.sa_flags = libc::SA_RESETHAND;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    }
}

/// Reports a run stopped by `signal` (its checkpoint at `checkpoint`) and exits with the
/// shell's code for it, 128 + the signal number.
pub fn exit_interrupted(signal: i32, step: u64, checkpoint: &Path) -> ! {
    eprintln!(
        "interrupted (signal {signal}) at step {step}: checkpoint written to {}; continue with \
         --resume",
        checkpoint.display()
    );
    std::process::exit(128 + signal)
}
