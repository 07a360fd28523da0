//! `/v1/completions` and `/v1/chat/completions`: request → one engine stream per
//! choice → a JSON body, or SSE chunks ending in `data: [DONE]`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::error::ApiError;
use super::protocol::*;
use super::streaming::{Api, ChunkMeta, EventStream, finish_str, logprobs_json, next, stream_choices};
use super::tools::ToolPlan;
use super::{AppState, InFlight};
use crate::sampling::DEFAULT_MAX_TOKENS;
use crate::sampling::constraint::Constraint;
use crate::{ChatMessage, Prompt, RequestStream, SamplingParams};

/// The typed request, its structured-output constraint and its tools.
async fn parse<T: serde::de::DeserializeOwned>(
    s: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<(T, Option<Constraint>, Option<ToolPlan>), ApiError> {
    let v = super::request::json_body(s, headers, body).await?;
    let c = super::structured::constraint_of(&v)?;
    let tools = super::tools::plan(&v)?;
    let t =
        serde_json::from_value(v).map_err(|e| ApiError::bad_request(format!("malformed request body: {e}"), None))?;
    Ok((t, c, tools))
}

/// Chat roles wllm renders.
const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// The request's sampling parameters: OpenAI's defaults (the library's) with
/// what the body sets, the endpoint's max_tokens and logprobs.
fn sampling(c: &CommonParams, max_tokens: Option<usize>, logprobs: Option<usize>) -> Result<SamplingParams, ApiError> {
    let mut p = c.sampling.apply(SamplingParams::default());
    p.max_tokens = max_tokens;
    p.logprobs = logprobs;
    p.validate()
        .map_err(|e| ApiError::bad_request(e.to_string(), Some(e.0)))?;
    Ok(p)
}

fn n_of(c: &CommonParams) -> Result<usize, ApiError> {
    match c.n.unwrap_or(1) {
        0 => Err(ApiError::bad_request("n must be at least 1", Some("n"))),
        n if n > 64 => Err(ApiError::bad_request(
            format!("n must be at most 64, got {n}"),
            Some("n"),
        )),
        n => Ok(n),
    }
}

/// Starts `n` streams per prompt; choice index = prompt * n + i. They form
/// one scheduling group (the first one's id), admitted in turn with others,
/// and reach the engine together, sharing one `SamplingParams` (the i-th
/// draws with seed + i). Tokenizing, the chat template and the grammar run
/// on the blocking pool, never on the async runtime's workers.
async fn start(
    s: &AppState,
    prompts: Vec<Prompt>,
    p: SamplingParams,
    n: usize,
) -> Result<Vec<RequestStream>, ApiError> {
    let engine = s.engine.clone();
    Ok(blocking(move || engine.generate_n(prompts, p, n)).await??)
}

/// Runs `f` on tokio's blocking pool (CPU-bound work a request brings).
pub(crate) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("a request's preparation failed: {e}")))
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn request_id(api: Api) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let prefix = if api == Api::Chat { "chatcmpl" } else { "cmpl" };
    format!("{prefix}-{:x}{:06x}", now_secs(), N.fetch_add(1, Ordering::Relaxed))
}

pub async fn completions(State(s): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let (req, constraint, tools): (CompletionRequest, _, _) = parse(&s, &headers, body).await?;
    if tools.is_some() {
        return Err(ApiError::bad_request("tools are for chat completions", Some("tools")));
    }
    let s = s.for_model(req.common.model.as_deref(), req.common.keep_alive).await?;
    let prompts = match req.prompt {
        PromptInput::Text(t) => vec![Prompt::Text(t)],
        PromptInput::Texts(v) => v.into_iter().map(Prompt::Text).collect(),
        PromptInput::Tokens(t) => vec![Prompt::Tokens(t)],
        PromptInput::TokenLists(v) => v.into_iter().map(Prompt::Tokens).collect(),
    };
    if prompts.is_empty() {
        return Err(ApiError::bad_request("prompt must not be empty", Some("prompt")));
    }
    let mut p = sampling(
        &req.common,
        Some(req.common.sampling.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS)),
        req.logprobs,
    )?;
    p.constraint = constraint;
    let n = n_of(&req.common)?;
    let guard = InFlight::enter(&s, prompts.len().saturating_mul(n))?;
    let streams = start(&s, prompts, p, n).await?;
    respond(
        s,
        guard,
        Api::Completion,
        streams,
        &req.common,
        req.logprobs.is_some(),
        None,
    )
    .await
}

fn message_text(c: &ContentInput) -> Result<String, ApiError> {
    match c {
        ContentInput::Text(t) => Ok(t.clone()),
        ContentInput::Null => Ok(String::new()),
        ContentInput::Parts(parts) => {
            let mut out = String::new();
            for part in parts {
                match (part["type"].as_str(), part["text"].as_str()) {
                    (Some("text"), Some(t)) => out.push_str(t),
                    (kind, _) => {
                        return Err(ApiError::bad_request(
                            format!("content part of type {kind:?} is not supported (text only)"),
                            Some("messages"),
                        ));
                    }
                }
            }
            Ok(out)
        }
    }
}

pub async fn chat_completions(
    State(s): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (req, constraint, tools): (ChatRequest, _, _) = parse(&s, &headers, body).await?;
    let s = s.for_model(req.common.model.as_deref(), req.common.keep_alive).await?;
    if req.messages.is_empty() {
        return Err(ApiError::bad_request("messages must not be empty", Some("messages")));
    }
    if let Some(m) = req.messages.iter().find(|m| !ROLES.contains(&m.role.as_str())) {
        return Err(ApiError::bad_request(
            format!("unknown message role {:?}; wllm takes {}", m.role, ROLES.join(", ")),
            Some("messages"),
        ));
    }
    let messages = req
        .messages
        .iter()
        .map(|m| {
            // An assistant turn that called tools is shown as its call(s).
            let content = match (&m.content, &m.tool_calls) {
                (ContentInput::Null, Some(calls)) => calls
                    .iter()
                    .map(|c| {
                        let f = &c["function"];
                        let args: Value = f["arguments"]
                            .as_str()
                            .and_then(|a| serde_json::from_str(a).ok())
                            .unwrap_or_else(|| f["arguments"].clone());
                        json!({"name": f["name"], "arguments": args}).to_string()
                    })
                    .collect::<Vec<_>>()
                    .join("\n"),
                (c, _) => message_text(c)?,
            };
            Ok(ChatMessage {
                role: m.role.clone(),
                content,
            })
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    let want_logprobs = req.logprobs.unwrap_or(false);
    let logprobs = want_logprobs.then(|| req.top_logprobs.unwrap_or(0));
    let mut p = sampling(
        &req.common,
        req.max_completion_tokens.or(req.common.sampling.max_tokens),
        logprobs,
    )?;
    p.constraint = constraint;
    let prompt = match &tools {
        Some(tp) => {
            if let Some(c) = tp.constraint() {
                if p.constraint.is_some() {
                    return Err(ApiError::bad_request(
                        "tool_choice \"required\" or a named function cannot be combined with response_format",
                        Some("tool_choice"),
                    ));
                }
                p.constraint = Some(c);
            }
            // A rendered chat template: no second BOS where it wrote one (as Prompt::Chat).
            let tok = s.engine.tokenizer().clone();
            let max_model_len = s.engine.kv_plan().max_model_len;
            let plan = tp.clone();
            let ids = blocking(move || {
                let given: usize = messages.iter().map(|m| m.content.len() + m.role.len()).sum();
                let bad = |e: crate::tokenizer::TokenizerError| ApiError::bad_request(e.to_string(), Some("messages"));
                tok.check_prompt_bytes(given, max_model_len).map_err(bad)?;
                let text = plan.render(&tok, &messages, tok.max_prompt_bytes(max_model_len))?;
                tok.encode_rendered(&text).map_err(bad)
            })
            .await??;
            Prompt::Tokens(ids)
        }
        None => Prompt::Chat(messages),
    };
    let n = n_of(&req.common)?;
    let guard = InFlight::enter(&s, n)?;
    let streams = start(&s, vec![prompt], p, n).await?;
    match tools {
        Some(tp) if !req.common.stream.unwrap_or(false) => respond_tools(s, guard, streams, &req.common, tp).await,
        tools => respond(s, guard, Api::Chat, streams, &req.common, want_logprobs, tools).await,
    }
}

async fn respond(
    s: Arc<AppState>,
    guard: InFlight,
    api: Api,
    streams: Vec<RequestStream>,
    c: &CommonParams,
    want_logprobs: bool,
    tools: Option<ToolPlan>,
) -> Result<Response, ApiError> {
    let id = request_id(api);
    let model = s.cfg.served_model_name.clone();
    let created = now_secs();
    // Streams come n per prompt: count each prompt's tokens once.
    let n = c.n.unwrap_or(1).max(1);
    let prompt_tokens: usize = streams.iter().step_by(n).map(|st| st.prompt_token_ids().len()).sum();
    if c.stream.unwrap_or(false) {
        let include_usage = c.stream_options.as_ref().is_some_and(|o| o.include_usage);
        let (tx, rx) = mpsc::channel::<Event>(64);
        let meta = ChunkMeta {
            id,
            model,
            created,
            prompt_tokens,
        };
        tokio::spawn(stream_choices(
            s,
            guard,
            api,
            streams,
            tx,
            meta,
            include_usage,
            want_logprobs,
            tools,
        ));
        return Ok(Sse::new(EventStream(rx)).into_response());
    }
    let mut choices = Vec::new();
    let mut completion_tokens = 0;
    for (index, mut st) in streams.into_iter().enumerate() {
        let (mut text, mut finish, mut lps, mut ntok) = (String::new(), None, Vec::new(), 0);
        while let Some(item) = next(&mut st).await {
            let o = item?;
            text.push_str(&o.text);
            ntok += o.token_ids.len();
            lps.extend(o.logprobs);
            finish = finish.or(o.finish_reason);
        }
        completion_tokens += ntok;
        let lp = if want_logprobs {
            logprobs_json(&s, api, &lps, &mut 0)
        } else {
            Value::Null
        };
        choices.push(match api {
            Api::Chat => json!({"index": index, "message": {"role": "assistant", "content": text}, "logprobs": lp, "finish_reason": finish_str(finish)}),
            Api::Completion => json!({"index": index, "text": text, "logprobs": lp, "finish_reason": finish_str(finish)}),
        });
    }
    drop(guard);
    let object = if api == Api::Chat {
        "chat.completion"
    } else {
        "text_completion"
    };
    let usage = Usage {
        prompt_tokens,
        completion_tokens,
        total_tokens: prompt_tokens + completion_tokens,
    };
    Ok(axum::Json(
        json!({"id": id, "object": object, "created": created, "model": model, "choices": choices, "usage": usage}),
    )
    .into_response())
}

/// A chat response with tools, unstreamed: each choice is read to the end,
/// then it is a tool call (finish_reason "tool_calls") when its text is one,
/// else a message. (Streamed, `stream_choices` sends calls as they are
/// generated: see `tool_stream`.)
async fn respond_tools(
    s: Arc<AppState>,
    guard: InFlight,
    streams: Vec<RequestStream>,
    c: &CommonParams,
    tools: ToolPlan,
) -> Result<Response, ApiError> {
    let id = request_id(Api::Chat);
    let (model, created) = (s.cfg.served_model_name.clone(), now_secs());
    let n = c.n.unwrap_or(1).max(1);
    let prompt_tokens: usize = streams.iter().step_by(n).map(|st| st.prompt_token_ids().len()).sum();
    let mut choices = Vec::new();
    let mut completion_tokens = 0;
    for (index, mut st) in streams.into_iter().enumerate() {
        let (mut text, mut finish) = (String::new(), None);
        while let Some(item) = next(&mut st).await {
            let o = item?;
            text.push_str(&o.text);
            completion_tokens += o.token_ids.len();
            finish = finish.or(o.finish_reason);
        }
        let call_id = format!("call_{}_{index}", id.trim_start_matches("chatcmpl-"));
        choices.push(match tools.parse_output(&text, &call_id) {
            Some(calls) => (index, Value::Null, calls, json!("tool_calls")),
            None => (index, json!(text), Value::Null, finish_str(finish)),
        });
    }
    drop(guard);
    let usage = Usage {
        prompt_tokens,
        completion_tokens,
        total_tokens: prompt_tokens + completion_tokens,
    };
    let choices: Vec<Value> = choices
        .into_iter()
        .map(|(index, content, calls, finish)| {
            let mut msg = json!({"role": "assistant", "content": content});
            if !calls.is_null() {
                msg["tool_calls"] = calls;
            }
            json!({"index": index, "message": msg, "logprobs": null, "finish_reason": finish})
        })
        .collect();
    Ok(axum::Json(
        json!({"id": id, "object": "chat.completion", "created": created, "model": model,
        "choices": choices, "usage": usage}),
    )
    .into_response())
}
