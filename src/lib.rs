//! wllm: a vLLM-style LLM inference engine whose kernels are WGSL compute
//! shaders run through wgpu, so one binary serves on any Vulkan, Metal or DX12
//! GPU (and on lavapipe in CI).
//!
//! Embedding it:
//! ```no_run
//! use wllm::{Engine, EngineConfig, Prompt, SamplingParams};
//! let engine = Engine::new(&EngineConfig { model: "models/SmolLM2-135M-Instruct.Q4_1.gguf".into(), ..Default::default() })?;
//! for out in engine.generate(Prompt::Text("The capital of France is".into()), SamplingParams::greedy())? {
//!     print!("{}", out?.text);
//! }
//! # Ok::<(), wllm::EngineError>(())
//! ```

pub mod backend;
pub mod client;
pub mod config;
pub mod engine;
pub mod gpu;
pub mod metrics;
pub mod model;
pub mod quant;
pub mod sampling;
pub mod server;
pub mod tokenizer;

pub use backend::Device;
pub use engine::{
    CompletedRequest, Engine, EngineConfig, EngineError, FinishReason, LlmEngine, Prompt, RequestMetrics,
    RequestOutput, RequestStream,
};
pub use metrics::Metrics;
pub use sampling::SamplingParams;
pub use tokenizer::ChatMessage;

/// Where `cargo run` looks for (and fetches) the default model.
pub fn default_model_path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
}
