//! wllm: a vLLM-style LLM inference engine whose kernels are WGSL compute
//! shaders run through wgpu.

pub mod engine;
pub mod gpu;
pub mod kernels;
pub mod model;
pub mod quant;
pub mod tokenizer;
