//! lavapipe's thread count. lavapipe (Mesa's software Vulkan, the adapter of
//! machines without a GPU) runs each dispatch's workgroups on a pool of
//! `LP_NUM_THREADS` threads, one per core by default. On small machines twice
//! as many threads as cores is faster: a step is hundreds of short dispatches,
//! and with spare threads a dispatch's workgroups do not wait on a core that
//! went idle between them (2 cores: a decode step of the default model at
//! batch 1 35 -> 28 ms, at 16 143 -> 117 ms in `wllm profile`; output tok/s
//! in `side-by-side.sh` 0.23x -> 0.27x of llama.cpp at 1 stream, 0.34x ->
//! 0.37x at 16).

/// Sets `LP_NUM_THREADS` to twice the cores on machines of up to 8 cores,
/// unless the user set it (larger machines keep Mesa's default). Only Mesa's
/// llvmpipe reads the variable, when a device is first opened.
///
/// # Safety
/// Writes the process environment: call it before any other thread exists
/// (first thing in `main`), as `std::env::set_var` requires.
pub unsafe fn default_llvmpipe_threads() {
    if std::env::var_os("LP_NUM_THREADS").is_some() {
        return;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores <= 8 {
        // SAFETY: the caller guarantees no other thread exists (see above).
        unsafe { std::env::set_var("LP_NUM_THREADS", (2 * cores).to_string()) };
    }
}
