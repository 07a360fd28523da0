//! `/v1/completions` and `/v1/chat/completions`: request → one engine stream per
//! choice → a JSON body, or SSE chunks ending in `data: [DONE]`.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::error::ApiError;
use super::protocol::*;
use super::tool_stream::ToolCallStream;
use super::tools::ToolPlan;
use super::{AppState, InFlight};
use crate::sampling::constraint::Constraint;
use crate::sampling::{DEFAULT_MAX_TOKENS, SampledLogprobs};
use crate::{ChatMessage, EngineError, FinishReason, Prompt, RequestOutput, RequestStream, SamplingParams};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Api {
    Completion,
    Chat,
}

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

fn check_model(s: &AppState, model: &Option<String>) -> Result<(), ApiError> {
    match model {
        Some(m) if m != &s.cfg.served_model_name => Err(ApiError::not_found(format!(
            "the model `{m}` does not exist; this server serves `{}`",
            s.cfg.served_model_name
        ))),
        _ => Ok(()),
    }
}

/// The request's sampling parameters: OpenAI's defaults (the library's) with
/// what the body sets, the endpoint's max_tokens and logprobs.
fn sampling(c: &CommonParams, max_tokens: Option<usize>, logprobs: Option<usize>) -> Result<SamplingParams, ApiError> {
    let mut p = c.sampling.apply(SamplingParams::default());
    p.max_tokens = max_tokens;
    p.logprobs = logprobs;
    p.validate().map_err(|e| ApiError::bad_request(e.to_string(), None))?;
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
/// one scheduling group (the first one's id), admitted in turn with others.
fn start(s: &AppState, prompts: Vec<Prompt>, p: &SamplingParams, n: usize) -> Result<Vec<RequestStream>, ApiError> {
    let mut streams: Vec<RequestStream> = Vec::new();
    for prompt in prompts {
        for i in 0..n {
            let mut pi = p.clone();
            pi.seed = p.seed.map(|seed| seed.wrapping_add(i as u64));
            let group = streams.first().map(|st| st.id());
            streams.push(s.engine.generate_in(prompt.clone(), pi, group)?);
        }
    }
    Ok(streams)
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
    check_model(&s, &req.common.model)?;
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
    let streams = start(&s, prompts, &p, n)?;
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
    check_model(&s, &req.common.model)?;
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
            Prompt::Text(tp.render(s.engine.tokenizer(), &messages)?)
        }
        None => Prompt::Chat(messages),
    };
    let n = n_of(&req.common)?;
    let guard = InFlight::enter(&s, n)?;
    let streams = start(&s, vec![prompt], &p, n)?;
    match tools {
        Some(tp) if !req.common.stream.unwrap_or(false) => respond_tools(s, guard, streams, &req.common, tp).await,
        tools => respond(s, guard, Api::Chat, streams, &req.common, want_logprobs, tools).await,
    }
}

/// Awaits the next output of a stream.
async fn next(stream: &mut RequestStream) -> Option<Result<RequestOutput, EngineError>> {
    std::future::poll_fn(|cx| futures_core::Stream::poll_next(Pin::new(&mut *stream), cx)).await
}

fn finish_str(f: Option<FinishReason>) -> Value {
    match f {
        Some(FinishReason::Stop) => json!("stop"),
        Some(FinishReason::Length) => json!("length"),
        Some(FinishReason::Abort) => json!("abort"),
        None => Value::Null,
    }
}

fn logprobs_json(s: &AppState, api: Api, lps: &[SampledLogprobs], offset: &mut usize) -> Value {
    let tok = s.engine.tokenizer();
    let text = |id: u32| tok.decode(&[id]);
    match api {
        Api::Chat => {
            let content: Vec<Value> = lps
                .iter()
                .map(|l| {
                    let t = text(l.chosen.token_id);
                    json!({
                        "token": t,
                        "logprob": l.chosen.logprob,
                        "bytes": t.as_bytes(),
                        "top_logprobs": l.top.iter().map(|x| {
                            let tt = text(x.token_id);
                            json!({"token": tt, "logprob": x.logprob, "bytes": tt.as_bytes()})
                        }).collect::<Vec<_>>(),
                    })
                })
                .collect();
            json!({ "content": content })
        }
        Api::Completion => {
            let mut tokens = Vec::new();
            let mut token_logprobs = Vec::new();
            let mut top = Vec::new();
            let mut offsets = Vec::new();
            for l in lps {
                let t = text(l.chosen.token_id);
                offsets.push(*offset);
                *offset += t.len();
                tokens.push(t);
                token_logprobs.push(l.chosen.logprob);
                let m: serde_json::Map<String, Value> =
                    l.top.iter().map(|x| (text(x.token_id), json!(x.logprob))).collect();
                top.push(Value::Object(m));
            }
            json!({"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets})
        }
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

/// What every chunk of one response repeats.
struct ChunkMeta {
    id: String,
    model: String,
    created: u64,
    prompt_tokens: usize,
}

/// Forwards every choice's outputs as SSE chunks, then usage and `[DONE]`.
#[allow(clippy::too_many_arguments)]
async fn stream_choices(
    s: Arc<AppState>,
    _guard: InFlight,
    api: Api,
    streams: Vec<RequestStream>,
    tx: mpsc::Sender<Event>,
    meta: ChunkMeta,
    include_usage: bool,
    want_logprobs: bool,
    tools: Option<ToolPlan>,
) {
    let object = if api == Api::Chat {
        "chat.completion.chunk"
    } else {
        "text_completion"
    };
    let ChunkMeta {
        id,
        model,
        created,
        prompt_tokens,
    } = meta;
    let chunk = |choices: Value, usage: Value| {
        let mut v = json!({"id": id, "object": object, "created": created, "model": model, "choices": choices});
        if !usage.is_null() {
            v["usage"] = usage;
        }
        Event::default().data(v.to_string())
    };
    let (otx, mut orx) = mpsc::unbounded_channel::<(usize, Result<RequestOutput, EngineError>)>();
    let n_choices = streams.len();
    for (index, mut st) in streams.into_iter().enumerate() {
        let otx = otx.clone();
        tokio::spawn(async move {
            while let Some(item) = next(&mut st).await {
                if otx.send((index, item)).is_err() {
                    return; // the client left: dropping `st` aborts the request
                }
            }
        });
    }
    drop(otx);
    if api == Api::Chat {
        for index in 0..n_choices {
            let c = json!([{"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]);
            if tx.send(chunk(c, Value::Null)).await.is_err() {
                return;
            }
        }
    }
    let mut completion_tokens = 0;
    let mut offsets = vec![0usize; n_choices];
    // With tools, each choice's text becomes content or a tool call as it streams.
    let mut calls: Vec<ToolCallStream> = match &tools {
        Some(tp) => (0..n_choices)
            .map(|i| ToolCallStream::new(tp, format!("call_{}_{i}", id.trim_start_matches("chatcmpl-"))))
            .collect(),
        None => Vec::new(),
    };
    while let Some((index, item)) = orx.recv().await {
        let o = match item {
            Ok(o) => o,
            Err(e) => {
                let err =
                    json!({"error": {"message": e.to_string(), "type": "server_error", "param": null, "code": "500"}});
                let _ = tx.send(Event::default().data(err.to_string())).await;
                return;
            }
        };
        completion_tokens += o.token_ids.len();
        let lp = if want_logprobs {
            logprobs_json(&s, api, &o.logprobs, &mut offsets[index])
        } else {
            Value::Null
        };
        let c = match api {
            Api::Chat if !calls.is_empty() => {
                let call = &mut calls[index];
                let finish = o.finish_reason.is_some();
                let mut deltas = call.push(&o.text, finish);
                if finish {
                    deltas.push(json!({}));
                }
                let n = deltas.len();
                let reason = call.finish_reason(finish_str(o.finish_reason));
                let mut sent = Ok(());
                for (k, d) in deltas.into_iter().enumerate() {
                    let r = if k + 1 == n && finish {
                        reason.clone()
                    } else {
                        Value::Null
                    };
                    let c = json!([{"index": index, "delta": d, "logprobs": null, "finish_reason": r}]);
                    sent = tx.send(chunk(c, Value::Null)).await;
                    if sent.is_err() {
                        break;
                    }
                }
                if sent.is_err() {
                    return;
                }
                continue;
            }
            Api::Chat => {
                json!([{"index": index, "delta": {"content": o.text}, "logprobs": lp, "finish_reason": finish_str(o.finish_reason)}])
            }
            Api::Completion => {
                json!([{"index": index, "text": o.text, "logprobs": lp, "finish_reason": finish_str(o.finish_reason)}])
            }
        };
        if tx.send(chunk(c, Value::Null)).await.is_err() {
            return; // dropping `orx` makes the forwarders stop and abort
        }
    }
    if include_usage {
        let u = Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
        };
        let _ = tx.send(chunk(json!([]), json!(u))).await;
    }
    let _ = tx.send(Event::default().data("[DONE]")).await;
}

/// The SSE body: events from the forwarding task.
struct EventStream(mpsc::Receiver<Event>);

impl futures_core::Stream for EventStream {
    type Item = Result<Event, Infallible>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx).map(|e| e.map(Ok))
    }
}
