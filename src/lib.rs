//! wllm: a vLLM-style LLM inference engine whose kernels are WGSL compute
//! shaders run through wgpu, so one binary serves on any Vulkan, Metal or DX12
//! GPU (and on lavapipe in CI).
//!
//! Embedding it (this example is the README's, and runs as a doc test on the
//! default model, so it cannot rot):
//! ```
//! use std::io::Write;
//!
//! use wllm::{ChatMessage, Engine, EngineConfig, Prompt, SamplingParams};
//!
//! let engine = Engine::new(&EngineConfig {
//!     model: "models/SmolLM2-135M-Instruct.Q4_1.gguf".into(),
//!     ..Default::default()
//! })?;
//! let prompt = Prompt::Chat(vec![ChatMessage::new("user", "What is the capital of France?")]);
//! let params = SamplingParams {
//!     max_tokens: Some(32),
//!     ..SamplingParams::greedy()
//! };
//! let mut reply = String::new();
//! for out in engine.generate(prompt, params)? {
//!     let out = out?;
//!     print!("{}", out.text);
//!     std::io::stdout().flush()?; // show each token as it comes
//!     reply.push_str(&out.text);
//! }
//! println!();
//! assert!(reply.contains("Paris"), "{reply}");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod backend;
pub mod client;
pub mod config;
pub mod convert;
pub mod engine;
pub mod gpu;
pub mod kv_dtype;
pub mod metrics;
pub mod model;
pub mod quant;
pub mod sampling;
pub mod server;
pub mod tokenizer;
pub mod trace;

pub use backend::Device;
pub use config::KvDtype;
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
