//! `/v1/embeddings` in OpenAI's shape: `input` (a string, strings, token ids
//! or lists of them) → one engine embedding sequence each, as one scheduling
//! group beside everything else → `{"object": "list", "data": [{"object":
//! "embedding", "index", "embedding"}], "model", "usage"}`, each vector a
//! list of floats or, with `encoding_format: "base64"` (what the official
//! clients ask for), its little-endian f32 bytes in base64. wllm's
//! `pooling` (`mean`, `cls`, `last`; default: the model file's, else mean)
//! and `normalize` (default true: unit length) may be given too.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::ApiError;
use super::protocol::PromptInput;
use super::streaming::next;
use super::{AppState, InFlight};
use crate::Prompt;
use crate::config::{EmbedSpec, Pooling};

#[derive(Debug, Deserialize)]
struct EmbeddingRequest {
    input: PromptInput,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    encoding_format: Option<String>,
    #[serde(default)]
    dimensions: Option<usize>,
    #[serde(default)]
    pooling: Option<Pooling>,
    #[serde(default)]
    normalize: Option<bool>,
    #[serde(default, deserialize_with = "super::protocol::keep_alive")]
    keep_alive: Option<std::time::Duration>,
    #[allow(dead_code)]
    #[serde(default)]
    user: Option<String>,
}

/// The most inputs one embeddings request may give (OpenAI's limit); each
/// is held to the model's context (and its text to `Tokenizer::max_prompt_bytes`).
pub const MAX_EMBEDDING_INPUTS: usize = 2048;

/// Standard base64 (RFC 4648, padded) of `bytes`.
fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n =
            (u32::from(c[0]) << 16) | (u32::from(*c.get(1).unwrap_or(&0)) << 8) | u32::from(*c.get(2).unwrap_or(&0));
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            out.push(if i <= c.len() {
                A[(n >> shift) as usize & 63] as char
            } else {
                '='
            });
        }
    }
    out
}

pub async fn embeddings(State(s): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let v = super::request::json_body(&s, &headers, body).await?;
    let req: EmbeddingRequest =
        serde_json::from_value(v).map_err(|e| ApiError::bad_request(format!("malformed request body: {e}"), None))?;
    let s = s.for_model(req.model.as_deref(), req.keep_alive).await?;
    let base64_out = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(f) => {
            return Err(ApiError::bad_request(
                format!("encoding_format must be \"float\" or \"base64\", got {f:?}"),
                Some("encoding_format"),
            ));
        }
    };
    let hidden = s.engine.model_config().hidden;
    if let Some(d) = req.dimensions
        && d != hidden
    {
        return Err(ApiError::bad_request(
            format!("this model's embeddings have {hidden} dimensions; `dimensions` {d} cannot be given"),
            Some("dimensions"),
        ));
    }
    let inputs: Vec<Prompt> = match req.input {
        PromptInput::Text(t) => vec![Prompt::Text(t)],
        PromptInput::Texts(v) => v.into_iter().map(Prompt::Text).collect(),
        PromptInput::Tokens(t) => vec![Prompt::Tokens(t)],
        PromptInput::TokenLists(v) => v.into_iter().map(Prompt::Tokens).collect(),
    };
    if inputs.is_empty() || inputs.iter().any(|p| matches!(p, Prompt::Text(t) if t.is_empty())) {
        return Err(ApiError::bad_request("input must not be empty", Some("input")));
    }
    let spec = EmbedSpec {
        pooling: req.pooling.unwrap_or_else(|| s.engine.default_pooling()),
        normalize: req.normalize.unwrap_or(true),
    };
    if inputs.len() > MAX_EMBEDDING_INPUTS {
        return Err(ApiError::bad_request(
            format!("input takes at most {MAX_EMBEDDING_INPUTS} items, got {}", inputs.len()),
            Some("input"),
        ));
    }
    let _guard = InFlight::enter(&s, inputs.len())?;
    let engine = s.engine.clone();
    let streams = super::completions::blocking(move || engine.embed(inputs, spec)).await??;
    let mut data = Vec::with_capacity(streams.len());
    let mut tokens = 0;
    for (i, mut st) in streams.into_iter().enumerate() {
        tokens += st.prompt_token_ids().len();
        let mut vector = None;
        while let Some(item) = next(&mut st).await {
            if let Some(e) = item?.embedding {
                vector = Some(e);
            }
        }
        let e = vector.ok_or_else(|| ApiError::internal("the engine ended an embedding without its vector"))?;
        let embedding = if base64_out {
            let bytes: Vec<u8> = e.iter().flat_map(|x| x.to_le_bytes()).collect();
            Value::String(base64(&bytes))
        } else {
            json!(e)
        };
        data.push(json!({"object": "embedding", "index": i, "embedding": embedding}));
    }
    Ok(axum::Json(json!({
        "object": "list",
        "data": data,
        "model": s.cfg.served_model_name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
    .into_response())
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_is_rfc_4648() {
        assert_eq!(super::base64(b""), "");
        assert_eq!(super::base64(b"f"), "Zg==");
        assert_eq!(super::base64(b"fo"), "Zm8=");
        assert_eq!(super::base64(b"foo"), "Zm9v");
        assert_eq!(super::base64(b"foobar"), "Zm9vYmFy");
        assert_eq!(super::base64(&[0xff, 0xfe, 0x00, 0x80]), "//4AgA==");
    }
}
