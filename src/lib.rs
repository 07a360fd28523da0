//! wllm: a vLLM-style LLM inference engine whose kernels are WGSL compute
//! shaders run through wgpu.

pub mod gpu;
pub mod kernels;
pub mod quant;
