//! OpenAI-compatible request and response bodies (completions, chat
//! completions, models, errors), with vLLM's extra sampling fields.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::sampling::SamplingOverrides;

/// `prompt`: a string, a list of strings, token ids, or a list of token-id lists.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum PromptInput {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// Fields shared by both endpoints: the sampling parameters (the same list as
/// `SamplingParams` and the CLI's flags, vLLM's extras included) and these.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct CommonParams {
    pub model: Option<String>,
    #[serde(flatten)]
    pub sampling: SamplingOverrides,
    pub n: Option<usize>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    /// Ollama's `keep_alive` for a model loaded on demand: how long it stays
    /// loaded after this request (seconds, or "30s", "5m", "1h"; 0: unload
    /// when done; negative: never unload).
    #[serde(default, deserialize_with = "keep_alive")]
    pub keep_alive: Option<std::time::Duration>,
}

/// Ollama's `keep_alive`: a number of seconds or a duration string; negative: forever.
pub fn keep_alive<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<std::time::Duration>, D::Error> {
    use serde::de::Error;
    let secs = match Option::<Value>::deserialize(d)? {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Number(n)) => n.as_f64().ok_or_else(|| D::Error::custom("keep_alive: not a number"))?,
        Some(Value::String(s)) => {
            let t = s.trim();
            let (num, unit) = match t.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
                Some((i, _)) => (&t[..i], &t[i..]),
                None => (t, "s"),
            };
            let mult = match unit {
                "ms" => 0.001,
                "s" => 1.0,
                "m" => 60.0,
                "h" => 3600.0,
                _ => {
                    return Err(D::Error::custom(format!(
                        "keep_alive {s:?}: use seconds, or a number with s, m or h"
                    )));
                }
            };
            num.trim()
                .parse::<f64>()
                .map_err(|_| D::Error::custom(format!("keep_alive {s:?} is not a duration")))?
                * mult
        }
        Some(v) => {
            return Err(D::Error::custom(format!(
                "keep_alive must be a number or a string, got {v}"
            )));
        }
    };
    Ok(Some(if secs < 0.0 {
        std::time::Duration::MAX
    } else {
        std::time::Duration::from_secs_f64(secs)
    }))
}

#[derive(Clone, Debug, Deserialize)]
pub struct CompletionRequest {
    pub prompt: PromptInput,
    /// Top-n logprobs per token (legacy completions API).
    pub logprobs: Option<usize>,
    #[serde(flatten)]
    pub common: CommonParams,
}

/// A chat message's content: a string or a list of typed parts.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum ContentInput {
    Text(String),
    Parts(Vec<Value>),
    Null,
}

#[derive(Clone, Debug, Deserialize)]
pub struct ChatMessageIn {
    pub role: String,
    #[serde(default = "null_content")]
    pub content: ContentInput,
    /// An assistant turn's tool calls (OpenAI's shape).
    #[serde(default)]
    pub tool_calls: Option<Vec<Value>>,
}

fn null_content() -> ContentInput {
    ContentInput::Null
}

#[derive(Clone, Debug, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessageIn>,
    pub max_completion_tokens: Option<usize>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<usize>,
    #[serde(flatten)]
    pub common: CommonParams,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
}

/// OpenAI's error object.
#[derive(Clone, Debug, Serialize)]
pub struct ErrorBody {
    pub error: ErrorObject,
}

#[derive(Clone, Debug, Serialize)]
pub struct ErrorObject {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub param: Option<String>,
    pub code: Option<String>,
}
