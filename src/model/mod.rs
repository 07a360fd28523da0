//! Model loading: configuration (GGUF metadata or config.json), tensors (GGUF or
//! safetensors, memory-mapped), the architecture layer (one file a family),
//! and the decoder forward pass on the GPU.

pub mod arch;
pub mod config;
pub mod decoder;
pub mod fusion;
pub mod gguf;
pub mod gguf_writer;
pub mod hf_config;
pub mod layer_weights;
pub mod rope;
pub mod safetensors;
pub mod source;

pub use config::ModelConfig;
pub use decoder::DecoderModel;
pub use source::{ModelFiles, RawTensor, hf_tensor_name, hf_tensor_name_for};

/// Everything that can go wrong reading a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("cannot read {0}: {1}")]
    Io(String, std::io::Error),
    #[error("corrupt model file: {0}")]
    Corrupt(String),
    #[error("model file is missing tensor {0:?}")]
    MissingTensor(String),
    #[error("tensor {name} has shape {got:?}, but the config implies {want:?}")]
    Shape {
        name: String,
        got: Vec<usize>,
        want: Vec<usize>,
    },
    #[error(
        "tensor {name} has type {ty}, which wllm cannot read; supported: F32, F16, BF16, Q8_0, Q5_0, Q5_1, \
         Q4_0, Q4_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS (re-quantise the model to one of these, \
         e.g. `wllm quantize IN OUT Q4_K_M`)"
    )]
    UnsupportedType { name: String, ty: String },
    #[error(
        "unsupported architecture {0:?}: wllm runs {archs} (GGUF names; in config.json: llama, mistral, qwen2, \
         qwen3, gemma2, gemma3_text, phi3)",
        archs = arch::supported()
    )]
    UnsupportedArch(String),
    #[error("bad model config: {0}")]
    Config(String),
    #[error("{0:?} is neither a .gguf file nor a directory with config.json and safetensors")]
    UnknownFormat(std::path::PathBuf),
    #[error(transparent)]
    Format(#[from] crate::quant::FormatError),
    #[error("tensor {name}: {source}")]
    Tensor {
        name: String,
        source: crate::quant::FormatError,
    },
    #[error(transparent)]
    Gpu(#[from] crate::gpu::GpuError),
    #[error(transparent)]
    Backend(#[from] crate::backend::BackendError),
}

/// A backend's own error as a `ModelError` (`.map_err(backend_err)`).
pub fn backend_err<E: Into<crate::backend::BackendError>>(e: E) -> ModelError {
    ModelError::Backend(e.into())
}
