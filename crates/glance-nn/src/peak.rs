//! This CPU's arithmetic peak for the instruction each weight format's kernels are built on,
//! measured with a register-only loop (no memory traffic): the yardstick a multi-row pass is
//! judged against (`glance bench decode --rows`).
//!
//! - f32, f16 (and bf16 without AVX-512 BF16): the kernels widen weights to f32 and multiply-add
//!   with FMA ([`crate::matvec`], [`crate::quant::half`]): 512-bit `vfmadd231ps` (AVX-512),
//!   256-bit on AVX2.
//! - bf16 on CPUs with AVX-512 BF16: `vdpbf16ps`, 32 multiply-adds each
//!   ([`crate::quant::half`]'s `vdpbf16ps` kernel); with Intel AMX, `tdpbf16ps` on whole tiles,
//!   8,192 each (`crate::quant::amx`).
//! - q8, q4: 8-bit integer dot products, `vpdpbusd` (AVX-512 VNNI), 64 multiply-adds each; on
//!   AVX2, `vpmaddubsw` (32 multiply-adds, pairs summed in 16 bits: [`crate::quant`]'s AVX2
//!   kernel).
//!
//! Ten independent accumulators keep every pipe busy whatever the instruction's latency.

use crate::quant::WeightFormat;

/// Multiply-adds one thread can do per second with the instruction `format`'s kernels use; `None`
/// where this CPU has no vector kernel for it (the portable fallback has no meaningful peak).
pub fn macs_per_second(format: WeightFormat) -> Option<f64> {
    let iters = 2_000_000u64;
    // The loop's own rate, best of three (the first run also warms the clock up).
    let best = |run: &dyn Fn() -> f64| (0..3).map(|_| run()).fold(0.0f64, f64::max);
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        let int8 = matches!(format, WeightFormat::Q8 | WeightFormat::Q4);
        if int8 && has!("avx512f") && has!("avx512vnni") {
            return Some(best(&|| {
                timed(iters, 640, || {
                    // SAFETY: AVX-512 F and VNNI are present (checked just above).
                    unsafe { x86::dpbusd(iters) }
                })
            }));
        }
        if int8 && has!("avx2") {
            return Some(best(&|| {
                timed(iters, 320, || {
                    // SAFETY: AVX2 is present (checked just above).
                    unsafe { x86::maddubs256(iters) }
                })
            }));
        }
        if format == WeightFormat::Bf16 && crate::quant::amx::available() {
            return Some(best(&|| {
                timed(iters / 100, 4 * 8192, || {
                    // SAFETY: AMX is available (checked just above).
                    unsafe { crate::quant::amx::peak_loop(iters / 100) }
                })
            }));
        }
        if format == WeightFormat::Bf16 && has!("avx512f") && has!("avx512bf16") {
            return Some(best(&|| {
                timed(iters, 320, || {
                    // SAFETY: AVX-512 F and BF16 are present (checked just above).
                    unsafe { x86::dpbf16(iters) }
                })
            }));
        }
        if !int8 && has!("avx512f") {
            return Some(best(&|| {
                timed(iters, 160, || {
                    // SAFETY: AVX-512 F is present (checked just above).
                    unsafe { x86::fma512(iters) }
                })
            }));
        }
        if !int8 && has!("avx2") && has!("fma") {
            return Some(best(&|| {
                timed(iters, 80, || {
                    // SAFETY: AVX2 and FMA are present (checked just above).
                    unsafe { x86::fma256(iters) }
                })
            }));
        }
    }
    let _ = (format, iters, best);
    None
}

/// Multiply-adds per second of `run`, which does `iters` iterations of `per_iter` each.
fn timed(iters: u64, per_iter: u64, run: impl Fn() -> f32) -> f64 {
    let start = std::time::Instant::now();
    std::hint::black_box(run());
    (iters * per_iter) as f64 / start.elapsed().as_secs_f64()
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// `iters` × 10 independent 512-bit FMAs (16 multiply-adds each).
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn fma512(iters: u64) -> f32 {
        let (a, b) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
        let mut acc = [_mm512_set1_ps(1.0); 10];
        for _ in 0..iters {
            for v in acc.iter_mut() {
                *v = _mm512_fmadd_ps(*v, a, b);
            }
            std::arch::asm!("", options(nomem, nostack));
        }
        acc.iter().map(|&v| _mm512_reduce_add_ps(v)).sum()
    }

    /// `iters` × 10 independent 256-bit FMAs (8 multiply-adds each).
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn fma256(iters: u64) -> f32 {
        let (a, b) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
        let mut acc = [_mm256_set1_ps(1.0); 10];
        for _ in 0..iters {
            for v in acc.iter_mut() {
                *v = _mm256_fmadd_ps(*v, a, b);
            }
            std::arch::asm!("", options(nomem, nostack));
        }
        let mut out = [0f32; 8];
        let mut total = 0.0;
        for v in acc {
            _mm256_storeu_ps(out.as_mut_ptr(), v);
            total += out.iter().sum::<f32>();
        }
        total
    }

    /// `iters` × 10 independent `vdpbf16ps` (32 multiply-adds each).
    ///
    /// # Safety
    /// The CPU must support AVX-512 F and BF16.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn dpbf16(iters: u64) -> f32 {
        let a: __m512bh = std::mem::transmute(_mm512_set1_epi16(0x3f80)); // 1.0
        let b: __m512bh = std::mem::transmute(_mm512_set1_epi16(0x3380)); // 2^-24
        let mut acc = [_mm512_set1_ps(1.0); 10];
        for _ in 0..iters {
            for v in acc.iter_mut() {
                *v = _mm512_dpbf16_ps(*v, a, b);
            }
            std::arch::asm!("", options(nomem, nostack));
        }
        acc.iter().map(|&v| _mm512_reduce_add_ps(v)).sum()
    }

    /// `iters` × 10 independent `vpdpbusd` (64 multiply-adds each).
    ///
    /// # Safety
    /// The CPU must support AVX-512 F and VNNI.
    #[target_feature(enable = "avx512f,avx512vnni")]
    pub unsafe fn dpbusd(iters: u64) -> f32 {
        let (a, b) = (_mm512_set1_epi8(1), _mm512_set1_epi8(1));
        let mut acc = [_mm512_setzero_si512(); 10];
        for _ in 0..iters {
            for v in acc.iter_mut() {
                *v = _mm512_dpbusd_epi32(*v, a, b);
            }
            std::arch::asm!("", options(nomem, nostack));
        }
        acc.iter().map(|&v| _mm512_reduce_add_epi32(v) as f32).sum()
    }

    /// `iters` × 10 independent `vpmaddubsw` (32 multiply-adds each), each chain feeding its
    /// result back as the next unsigned operand (the values do not matter, the rate does).
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub unsafe fn maddubs256(iters: u64) -> f32 {
        let b = _mm256_set1_epi8(1);
        let mut acc = [_mm256_set1_epi8(1); 10];
        for _ in 0..iters {
            for v in acc.iter_mut() {
                *v = _mm256_maddubs_epi16(*v, b);
            }
            std::arch::asm!("", options(nomem, nostack));
        }
        let mut out = [0i16; 16];
        let mut total = 0.0;
        for v in acc {
            _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, v);
            total += out.iter().map(|&x| x as f32).sum::<f32>();
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peaks_are_positive_where_measured() {
        for f in WeightFormat::ALL {
            if let Some(r) = macs_per_second(f) {
                assert!(r.is_finite() && r > 1e8, "{f}: {r}");
            }
        }
    }
}
