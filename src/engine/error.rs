//! The engine's error type: what was wrong and what to do.

use crate::gpu::GpuError;
use crate::model::ModelError;
use crate::sampling::InvalidParams;
use crate::tokenizer::TokenizerError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error(transparent)]
    Backend(#[from] crate::backend::BackendError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Params(#[from] InvalidParams),
    #[error(
        "the prompt has {prompt} tokens and asks for up to {max_tokens} more, but the model's context \
         (max model len) is {max_model_len} tokens: shorten the prompt or lower max_tokens"
    )]
    PromptTooLong {
        prompt: usize,
        max_tokens: usize,
        max_model_len: usize,
    },
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("engine configuration: {0}")]
    Config(String),
    #[error("the engine has stopped")]
    Stopped,
    /// The engine or the registry cannot take this now; a retry later may succeed.
    #[error("{0}")]
    Busy(String),
    /// A model does not fit the models' memory budget even with every other model unloaded.
    #[error("{0}")]
    OverBudget(String),
    #[error("the engine failed while running this request: {0}")]
    Step(String),
}
