//! `BackendError`: an error of whichever backend ran, for the layers above
//! (model, engine) that are generic over the backend. Each backend has its own
//! error type (`gpu::GpuError` for wgpu, `cuda::CudaError`) and converts into it.

use crate::gpu::GpuError;

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error(transparent)]
    Wgpu(#[from] GpuError),
    #[cfg(feature = "cuda")]
    #[error(transparent)]
    Cuda(#[from] super::cuda::CudaError),
    /// `--device cuda` where the cuda backend cannot run (the reason says why).
    #[error("cuda backend: {0}")]
    CudaUnavailable(String),
}
