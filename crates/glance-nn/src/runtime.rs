//! Process-level allocator setting that makes candle fast on CPU, for inference and training,
//! and what the system says about memory.
//!
//! candle allocates a fresh buffer for every op result. glibc serves blocks above its mmap
//! threshold with `mmap` / `munmap`: a system call and page faults for every large intermediate
//! (profiles show it as a large share of system time). Raising the mmap and trim thresholds
//! lets the heap reuse freed blocks. Measured on one CLIP ViT-L layer (577 tokens, 2 threads):
//! attention 36–38 ms → 20–23 ms.

/// Keeps large freed blocks in the process heap (glibc only; a no-op elsewhere). Call once at
/// start-up. Returns whether the settings were applied.
pub fn tune_allocator() -> bool {
    imp::tune()
}

/// Hands the heap's free pages back to the system (glibc `malloc_trim`; a no-op elsewhere), so
/// that resident memory measures what is in use.
pub fn release_free_memory() {
    imp::trim()
}

/// Memory the system can still give this process (`MemAvailable` of `/proc/meminfo`), bytes;
/// `None` where that is not known. For refusing a model that cannot fit before loading it.
pub fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Resident memory of this process (`VmRSS` of `/proc/self/status`), bytes; `None` where that is
/// not known. Free heap pages are not handed back first ([`release_free_memory`] does that).
pub fn resident_bytes() -> Option<u64> {
    status_bytes("VmRSS:")
}

/// The most resident memory this process has held (`VmHWM`), bytes, since it started or since
/// [`reset_peak_resident`]; `None` where that is not known.
pub fn peak_resident_bytes() -> Option<u64> {
    status_bytes("VmHWM:")
}

/// Starts [`peak_resident_bytes`] again from the present resident memory (writes `5` to
/// `/proc/self/clear_refs`, Linux 4.0 and later). Returns whether it could.
pub fn reset_peak_resident() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// A `kB` line of `/proc/self/status`, in bytes.
fn status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod imp {
    use std::os::raw::c_int;

    extern "C" {
        fn mallopt(param: c_int, value: c_int) -> c_int;
        fn malloc_trim(pad: usize) -> c_int;
    }

    pub fn trim() {
        // SAFETY: malloc_trim only returns free heap memory to the system; it is thread-safe.
        unsafe {
            malloc_trim(0);
        }
    }

    /// glibc `malloc.h`.
    const M_TRIM_THRESHOLD: c_int = -1;
    const M_MMAP_THRESHOLD: c_int = -3;

    pub fn tune() -> bool {
        // 512 MiB: effectively "never mmap / never trim" for activation-sized buffers.
        const LIMIT: c_int = 1 << 29;
        // SAFETY: mallopt only changes allocator parameters; it is safe to call at any time.
        unsafe { mallopt(M_MMAP_THRESHOLD, LIMIT) == 1 && mallopt(M_TRIM_THRESHOLD, LIMIT) == 1 }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
mod imp {
    pub fn tune() -> bool {
        false
    }

    pub fn trim() {}
}
