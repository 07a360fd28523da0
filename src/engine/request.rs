//! What a request is before the engine takes it: its prompt (text, chat
//! messages or token ids), tokenised, and checked against the vocabulary, the
//! context length and its sampling parameters.

use super::EngineError;
use crate::sampling::SamplingParams;
use crate::tokenizer::{ChatMessage, Tokenizer};

/// What to complete.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    /// Raw text (special tokens parsed).
    Text(String),
    /// Messages rendered with the model's chat template, generation prompt added.
    Chat(Vec<ChatMessage>),
    /// Token ids as they are.
    Tokens(Vec<u32>),
}

/// Token ids of a prompt: text with special tokens parsed, chat messages
/// through the template. A text (or rendered chat) too long to fit
/// `max_model_len` tokens whatever its tokens (`Tokenizer::max_prompt_bytes`)
/// is refused before it is tokenized; the template runs on a fuel budget
/// and an output cap of the same size.
pub fn tokenize_prompt(tokenizer: &Tokenizer, prompt: &Prompt, max_model_len: usize) -> Result<Vec<u32>, EngineError> {
    let cap = tokenizer.max_prompt_bytes(max_model_len);
    Ok(match prompt {
        Prompt::Text(t) => {
            tokenizer.check_prompt_bytes(t.len(), max_model_len)?;
            tokenizer.encode(t)?
        }
        Prompt::Chat(m) => {
            let given: usize = m.iter().map(|m| m.content.len() + m.role.len()).sum();
            tokenizer.check_prompt_bytes(given, max_model_len)?;
            let text = tokenizer.apply_chat_template_capped(m, None, cap)?;
            tokenizer.encode_rendered(&text)?
        }
        Prompt::Tokens(t) => t.clone(),
    })
}

/// Validates a request; returns the most tokens (prompt + output) it may reach.
pub fn validate_request(
    prompt: &[u32],
    params: &SamplingParams,
    vocab: usize,
    max_model_len: usize,
) -> Result<usize, EngineError> {
    params.validate()?;
    if prompt.is_empty() {
        return Err(EngineError::InvalidRequest("the prompt is empty".into()));
    }
    if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
        return Err(EngineError::InvalidRequest(format!(
            "token id {bad} is outside the vocabulary of {vocab}"
        )));
    }
    if prompt.len() >= max_model_len {
        return Err(EngineError::PromptTooLong {
            prompt: prompt.len(),
            max_tokens: 1,
            max_model_len,
        });
    }
    match params.max_tokens {
        // prompt.len() < max_model_len (checked above): no sum that can wrap.
        Some(m) if m > max_model_len - prompt.len() => Err(EngineError::PromptTooLong {
            prompt: prompt.len(),
            max_tokens: m,
            max_model_len,
        }),
        Some(m) => Ok(prompt.len() + m),
        None => Ok(max_model_len),
    }
}
