//! The cuda backend's own errors.

/// What can go wrong on the cuda backend.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// The driver, NVRTC or cuBLAS refused, or the device cannot be used.
    #[error("cuda backend: {0}")]
    Driver(String),
    /// An op was asked for more than the backend supports.
    #[error("cuda backend: {0}")]
    Limit(String),
    #[error("cuda backend: readback failed: {0}")]
    Readback(String),
}
