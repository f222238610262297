//! Process-level settings that make candle training fast on a few CPU cores.
//!
//! * **Element-wise ops on one thread.** candle 0.11 runs element-wise / reduction kernels on a
//!   spinning barrier pool sized like rayon's. In a training step those kernels are short and
//!   numerous; with 2 cores the pool's spin-waits cost more than the parallelism gains, and when
//!   anything else is running the spinning thread starves the working one (measured: 4–7× slower
//!   steps on the 2-core build machine under load). `CANDLE_NUM_THREADS=1` keeps the pool empty
//!   while GEMMs still use `RAYON_NUM_THREADS` threads.
//! * **Keep freed buffers in the heap** ([`glance_nn::runtime::tune_allocator`], which every
//!   glance command applies).
//!
//! Both must happen before the first candle CPU op (the pool is created on first use).

/// What [`prepare_cpu_for_training`] did.
#[derive(Debug, Clone, Copy)]
pub struct CpuSetup {
    /// `CANDLE_NUM_THREADS` was unset and is now 1.
    pub elementwise_single_thread: bool,
    /// glibc's mmap / trim thresholds were raised.
    pub allocator_tuned: bool,
}

/// Applies both settings (an explicit `CANDLE_NUM_THREADS` is respected). Call from the main
/// thread at start-up, before any tensor work and while no other thread reads the environment.
pub fn prepare_cpu_for_training() -> CpuSetup {
    let elementwise_single_thread = std::env::var_os("CANDLE_NUM_THREADS").is_none();
    if elementwise_single_thread {
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
    CpuSetup {
        elementwise_single_thread,
        allocator_tuned: tune_allocator(),
    }
}

/// Keeps large freed blocks in the process heap (see [`glance_nn::runtime`]).
pub fn tune_allocator() -> bool {
    glance_nn::runtime::tune_allocator()
}
