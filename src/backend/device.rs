//! `--device wgpu|cuda|auto`: which backend an engine runs on. `auto` picks
//! cuda when the binary has the `cuda` feature and an NVIDIA device answers,
//! else wgpu.

use super::BackendError;

pub use crate::config::Device;

/// Whether this binary was built with the cuda backend.
pub const CUDA_BUILT: bool = cfg!(feature = "cuda");

impl Device {
    /// The concrete backend: `Wgpu` or `Cuda`. Explicit `Cuda` fails with the
    /// reason when it cannot run; `Auto` falls back to wgpu.
    pub fn resolve(self) -> Result<Device, BackendError> {
        match self {
            Self::Wgpu => Ok(Self::Wgpu),
            Self::Cuda => match cuda_unavailable() {
                None => Ok(Self::Cuda),
                Some(why) => Err(BackendError::CudaUnavailable(why)),
            },
            Self::Auto => Ok(if cuda_unavailable().is_none() {
                Self::Cuda
            } else {
                Self::Wgpu
            }),
        }
    }
}

/// Why the cuda backend cannot run here, or `None` when it can.
pub fn cuda_unavailable() -> Option<String> {
    #[cfg(feature = "cuda")]
    {
        super::cuda::unavailable()
    }
    #[cfg(not(feature = "cuda"))]
    {
        Some(
            "this wllm was built without the cuda backend: rebuild with `cargo build --release --features cuda`".into(),
        )
    }
}
