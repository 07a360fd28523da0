//! Streamed responses: every choice's outputs forwarded as SSE chunks as
//! they come (chat deltas or completion text, logprobs, tool calls through
//! `ToolCallStream`), then usage and `[DONE]`; a client that leaves aborts
//! its requests.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::response::sse::Event;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::protocol::Usage;
use super::tool_stream::ToolCallStream;
use super::tools::ToolPlan;
use super::{AppState, InFlight};
use crate::sampling::SampledLogprobs;
use crate::{EngineError, FinishReason, RequestOutput, RequestStream};

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Api {
    Completion,
    Chat,
}

/// Awaits the next output of a stream.
pub(super) async fn next(stream: &mut RequestStream) -> Option<Result<RequestOutput, EngineError>> {
    std::future::poll_fn(|cx| futures_core::Stream::poll_next(Pin::new(&mut *stream), cx)).await
}

pub(super) fn finish_str(f: Option<FinishReason>) -> Value {
    match f {
        Some(FinishReason::Stop) => json!("stop"),
        Some(FinishReason::Length) => json!("length"),
        Some(FinishReason::Abort) => json!("abort"),
        None => Value::Null,
    }
}

pub(super) fn logprobs_json(s: &AppState, api: Api, lps: &[SampledLogprobs], offset: &mut usize) -> Value {
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

/// What every chunk of one response repeats.
pub(super) struct ChunkMeta {
    pub(super) id: String,
    pub(super) model: String,
    pub(super) created: u64,
    pub(super) prompt_tokens: usize,
}

/// Forwards every choice's outputs as SSE chunks, then usage and `[DONE]`.
#[allow(clippy::too_many_arguments)]
pub(super) async fn stream_choices(
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
pub(super) struct EventStream(pub(super) mpsc::Receiver<Event>);

impl futures_core::Stream for EventStream {
    type Item = Result<Event, Infallible>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx).map(|e| e.map(Ok))
    }
}
