//! The wgpu layer: one device on the best adapter, compute pipelines built from
//! the WGSL in `shaders/`, and a `StepEncoder` that records a step's dispatches
//! into one submission.

mod context;
mod encoder;
mod kernel;
mod llvmpipe;
mod memory;
mod pipelines;

pub use context::{GpuContext, GpuError, GpuOptions};
pub use encoder::{BindCache, Bound, BufSlice, StepEncoder};
pub use kernel::{Binding, Kernel};
pub use llvmpipe::default_llvmpipe_threads;
pub use memory::DeviceMemory;
pub use pipelines::{PipelineStats, PipelineStore, user_cache_dir};
