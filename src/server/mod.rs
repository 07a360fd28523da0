//! The OpenAI-compatible HTTP server (axum): `/v1/models`, `/v1/completions`,
//! `/v1/chat/completions` (streaming over SSE or not), `/health`, and `/metrics`
//! in Prometheus text. The engine's step loop runs on its own thread; a client
//! that disconnects drops its request streams, which aborts them.

mod completions;
pub mod error;
pub mod protocol;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::Engine;
use error::ApiError;

/// How the server runs.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub served_model_name: String,
    /// Requests in flight beyond which new ones get 503.
    pub max_pending_requests: usize,
}

pub(crate) struct AppState {
    pub engine: Engine,
    pub cfg: ServerConfig,
    pub in_flight: AtomicUsize,
    pub created: u64,
}

/// Counts a request in flight until dropped.
pub(crate) struct InFlight(Arc<AppState>);

impl InFlight {
    fn enter(state: &Arc<AppState>) -> Result<Self, ApiError> {
        let n = state.in_flight.fetch_add(1, Ordering::SeqCst);
        let guard = Self(state.clone());
        if n >= state.cfg.max_pending_requests {
            return Err(ApiError::overloaded(format!(
                "the server is overloaded ({n} requests in flight, limit {}); retry later",
                state.cfg.max_pending_requests
            )));
        }
        Ok(guard)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The router, for serving or for tests.
pub fn router(engine: Engine, cfg: ServerConfig) -> Router {
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let state = Arc::new(AppState {
        engine,
        cfg,
        in_flight: AtomicUsize::new(0),
        created,
    });
    Router::new()
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model_by_id))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/chat/completions", post(completions::chat_completions))
        .fallback(|| async {
            ApiError {
                status: StatusCode::NOT_FOUND,
                kind: "not_found_error",
                message: "no such route".into(),
                param: None,
            }
        })
        .with_state(state)
}

/// Serves until the future is dropped or the process gets Ctrl-C.
pub async fn serve(engine: Engine, cfg: ServerConfig, addr: SocketAddr) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    serve_on(listener, engine, cfg).await
}

/// Serves on a bound listener.
pub async fn serve_on(listener: tokio::net::TcpListener, engine: Engine, cfg: ServerConfig) -> std::io::Result<()> {
    axum::serve(listener, router(engine, cfg))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
}

fn model_card(s: &AppState) -> serde_json::Value {
    serde_json::json!({
        "id": s.cfg.served_model_name,
        "object": "model",
        "created": s.created,
        "owned_by": "wllm",
        "max_model_len": s.engine.kv_plan().max_model_len,
    })
}

async fn models(State(s): State<Arc<AppState>>) -> Response {
    axum::Json(serde_json::json!({ "object": "list", "data": [model_card(&s)] })).into_response()
}

async fn model_by_id(State(s): State<Arc<AppState>>, axum::extract::Path(id): axum::extract::Path<String>) -> Response {
    if id == s.cfg.served_model_name {
        axum::Json(model_card(&s)).into_response()
    } else {
        ApiError::not_found(format!(
            "the model `{id}` does not exist; this server serves `{}`",
            s.cfg.served_model_name
        ))
        .into_response()
    }
}

async fn metrics(State(s): State<Arc<AppState>>) -> Response {
    let engine = s.engine.clone();
    match tokio::task::spawn_blocking(move || engine.metrics()).await {
        Ok(Ok(m)) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            m.to_prometheus(&s.cfg.served_model_name),
        )
            .into_response(),
        Ok(Err(e)) => ApiError::from(e).into_response(),
        Err(e) => ApiError::internal(e.to_string()).into_response(),
    }
}
