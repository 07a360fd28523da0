//! `--device wgpu|cuda|auto`: which backend an engine runs on. `auto` picks
//! cuda when the binary has the `cuda` feature and an NVIDIA device answers,
//! else wgpu.

use crate::gpu::GpuError;

/// The backend asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// cuda when built with it and an NVIDIA device exists, else wgpu.
    #[default]
    Auto,
    /// WGSL kernels through wgpu (Vulkan, Metal, DX12, lavapipe).
    Wgpu,
    /// CUDA C kernels through the NVIDIA driver (`--features cuda`).
    Cuda,
}

impl std::str::FromStr for Device {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "wgpu" | "vulkan" | "metal" | "dx12" => Ok(Self::Wgpu),
            "cuda" => Ok(Self::Cuda),
            other => Err(format!("unknown device {other:?}: use wgpu, cuda or auto")),
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Wgpu => "wgpu",
            Self::Cuda => "cuda",
        })
    }
}

/// Whether this binary was built with the cuda backend.
pub const CUDA_BUILT: bool = cfg!(feature = "cuda");

impl Device {
    /// The concrete backend: `Wgpu` or `Cuda`. Explicit `Cuda` fails with the
    /// reason when it cannot run; `Auto` falls back to wgpu.
    pub fn resolve(self) -> Result<Device, GpuError> {
        match self {
            Self::Wgpu => Ok(Self::Wgpu),
            Self::Cuda => match cuda_unavailable() {
                None => Ok(Self::Cuda),
                Some(why) => Err(GpuError::Cuda(why)),
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
