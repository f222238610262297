//! Software prefetch of the weights a kernel reads next, into L2: the one mechanism of the q8 /
//! q4 register tiles and row blocks and of the `vdpbf16ps` tiles (docs/kernels.md, "Prefetching
//! into L2, past a task's rows"). L1 is too small to hold what is fetched far enough ahead to
//! hide the memory; L2 is not. A kernel spreads its prefetches over its steps (groups or
//! chunks of a row), and the calls that compute the same weight rows for different input rows
//! split them into parts, so each line is asked for once.

use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};

/// Bytes to prefetch: one part of what the calls over the same weight rows share.
#[derive(Clone, Copy)]
pub(super) struct Ahead {
    start: *const u8,
    bytes: usize,
}

impl Ahead {
    /// Nothing to prefetch.
    pub(super) const NONE: Ahead = Ahead {
        start: std::ptr::null(),
        bytes: 0,
    };

    /// `bytes` from `start`, in `parts` equal parts of whole lines ([`Ahead::part`]). `start`
    /// may lie past the weights' allocation (the next task's rows, or past the matrix, where a
    /// prefetch only wastes a read): it is never dereferenced.
    pub(super) fn new(start: *const u8, bytes: usize, parts: usize) -> Self {
        Ahead {
            start,
            bytes: bytes.div_ceil(parts.max(1)).next_multiple_of(64),
        }
    }

    /// Part `k` of the bytes.
    pub(super) fn part(self, k: usize) -> Self {
        Ahead {
            start: self.start.wrapping_add(k * self.bytes),
            bytes: self.bytes,
        }
    }

    /// Step `step` of `steps`' share of this part's lines.
    #[inline(always)]
    pub(super) fn fetch(self, step: usize, steps: usize) {
        let share = self.bytes.div_ceil(steps.max(1)).next_multiple_of(64);
        let mut line = step * share;
        while line < ((step + 1) * share).min(self.bytes) {
            // SAFETY: SSE, which `prefetcht1` belongs to, is in every x86-64 CPU, and a
            // prefetch never faults whatever the address.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(self.start.wrapping_add(line) as *const i8) };
            line += 64;
        }
    }
}
