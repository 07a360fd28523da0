//! The server's pages: a chat page at `/` (streams through the server's own
//! OpenAI API) and a live engine page at `/engine` that polls `/engine/state`
//! (running and waiting requests, the KV pool, the block map, the last steps'
//! timeline) about once a second; `/engine/trace` is the step trace so far.
//! Plain HTML, CSS and JS embedded in the binary; no external requests.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{Html, IntoResponse, Response};

use super::AppState;
use super::error::ApiError;
use crate::trace::report::VIZ_JS;

const CHAT: &str = include_str!("pages/chat.html");
const ENGINE: &str = include_str!("pages/engine.html");

/// Steps of the live page's timeline.
pub const LIVE_STEPS: usize = 64;

pub async fn chat_page() -> Html<&'static str> {
    Html(CHAT)
}

pub async fn engine_page() -> Html<String> {
    Html(ENGINE.replace("/*VIZ_JS*/", VIZ_JS))
}

pub async fn engine_state(State(s): State<Arc<AppState>>) -> Response {
    let engine = s.engine.clone();
    match tokio::task::spawn_blocking(move || engine.live_state(LIVE_STEPS)).await {
        Ok(Ok(mut v)) => {
            // Every model the server serves and its state (the page shows the primary's engine).
            v["models"] = serde_json::Value::Array(super::models::cards(&s));
            axum::Json(v).into_response()
        }
        Ok(Err(e)) => ApiError::from(e).into_response(),
        Err(e) => ApiError::internal(e.to_string()).into_response(),
    }
}

pub async fn engine_trace(State(s): State<Arc<AppState>>) -> Response {
    let engine = s.engine.clone();
    match tokio::task::spawn_blocking(move || engine.trace()).await {
        Ok(Ok(v)) => (
            [(header::CONTENT_DISPOSITION, "attachment; filename=\"wllm-trace.json\"")],
            axum::Json(v),
        )
            .into_response(),
        Ok(Err(e)) => ApiError::from(e).into_response(),
        Err(e) => ApiError::internal(e.to_string()).into_response(),
    }
}
