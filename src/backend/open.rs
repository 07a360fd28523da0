//! `open`: the one place that turns an `EngineConfig` into a backend — the
//! device it asks for (`--device`), the adapter (`--adapter`), the pipeline
//! cache, gemm tiles and cuBLAS threshold. The engine, `wllm info` and the CLI
//! all open backends here.

use std::time::Instant;

use super::BackendError;
use super::wgsl::Kernels;
use crate::config::EngineConfig;
use crate::gpu::{GpuContext, GpuOptions};

/// A backend opened for a config, and how long opening took.
pub enum OpenBackend {
    /// The WGSL kernels on a wgpu device (shared with other engines opened
    /// with the same adapter options in this process).
    Wgpu(Box<Kernels>),
    #[cfg(feature = "cuda")]
    Cuda(super::cuda::CudaBackend),
}

impl OpenBackend {
    /// The device, in words.
    pub fn describe(&self) -> String {
        use super::Backend;
        match self {
            Self::Wgpu(k) => k.describe(),
            #[cfg(feature = "cuda")]
            Self::Cuda(c) => c.describe(),
        }
    }

    /// The largest buffer one op can address (caps a layer's KV pool).
    pub fn max_buffer(&self) -> u64 {
        use super::Backend;
        match self {
            Self::Wgpu(k) => k.max_buffer(),
            #[cfg(feature = "cuda")]
            Self::Cuda(c) => c.max_buffer(),
        }
    }

    /// The device's memory, where its driver reports it (`Backend::device_memory`).
    pub fn device_memory(&self) -> Option<crate::gpu::DeviceMemory> {
        use super::Backend;
        match self {
            Self::Wgpu(k) => k.device_memory(),
            #[cfg(feature = "cuda")]
            Self::Cuda(c) => c.device_memory(),
        }
    }

    /// Whether the device's memory is the host's (`Backend::shares_host_memory`).
    pub fn shares_host_memory(&self) -> bool {
        use super::Backend;
        match self {
            Self::Wgpu(k) => k.shares_host_memory(),
            #[cfg(feature = "cuda")]
            Self::Cuda(c) => c.shares_host_memory(),
        }
    }

    /// Whether it keeps weights in the narrow layouts (`Backend::reads_narrow_weights`).
    pub fn reads_narrow_weights(&self) -> bool {
        use super::Backend;
        match self {
            Self::Wgpu(k) => Backend::reads_narrow_weights(k.as_ref()),
            #[cfg(feature = "cuda")]
            Self::Cuda(c) => c.reads_narrow_weights(),
        }
    }
}

/// The wgpu options a config asks for.
pub fn gpu_options(cfg: &EngineConfig) -> GpuOptions {
    GpuOptions {
        adapter: cfg.adapter.clone(),
        pipeline_cache: cfg.pipeline_cache.clone(),
        memory_budget_threshold: None,
    }
}

/// How long `open` took, and how much of it went to compiling pipelines.
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenTimings {
    pub seconds: f64,
    pub compile_seconds: f64,
}

/// Opens the backend `cfg.device` resolves to.
pub fn open(cfg: &EngineConfig) -> Result<(OpenBackend, OpenTimings), BackendError> {
    let t0 = Instant::now();
    let (b, compile_seconds) = match cfg.device.resolve()? {
        #[cfg(feature = "cuda")]
        super::Device::Cuda => {
            let mut c = super::cuda::CudaBackend::new(0)?;
            c.cublas_min_t = cfg.cublas_min_t.unwrap_or(super::cuda::DEFAULT_CUBLAS_MIN_T);
            (OpenBackend::Cuda(c), 0.0)
        }
        _ => {
            let ctx = GpuContext::shared(&gpu_options(cfg))?;
            let before = super::wgsl::pipeline_store(&ctx).stats().compile_seconds;
            let k = Kernels::with_tiles(&ctx, cfg.gemm_tiles)?;
            let compiled = k.pipeline_stats().compile_seconds - before;
            (OpenBackend::Wgpu(Box::new(k)), compiled)
        }
    };
    let seconds = t0.elapsed().as_secs_f64();
    Ok((
        b,
        OpenTimings {
            seconds,
            compile_seconds,
        },
    ))
}
