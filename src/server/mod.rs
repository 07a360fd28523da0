//! The OpenAI-compatible HTTP server (axum): `/v1/models`, `/v1/completions`,
//! `/v1/chat/completions` (streaming over SSE or not), `/health`, and `/metrics`
//! in Prometheus text. The engine's step loop runs on its own thread; a client
//! that disconnects drops its request streams, which aborts them. Limits
//! (connections, timeouts, body size, sequences in flight and per request),
//! the API key and CORS are `ServerConfig`'s; every error is an OpenAI error
//! object.

mod access;
pub use access::ct_eq;
mod catch_panic;
mod completions;
mod embeddings;
pub mod error;
pub mod listener;
mod models;
mod pages;
pub mod protocol;
mod request;
mod streaming;
mod structured;
mod tool_stream;
mod tools;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::{get, post};

use crate::Engine;
use error::ApiError;

/// How the server runs.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub served_model_name: String,
    /// Sequences (prompts × n of every request) in flight beyond which new
    /// requests get 503.
    pub max_pending_requests: usize,
    /// Most sequences one request may ask for (prompts × n); more is a 400.
    pub max_seqs_per_request: usize,
    /// `Authorization: Bearer` key every `/v1` route (and `/metrics`) needs.
    pub api_key: Option<String>,
    /// `/metrics` answers without the key.
    pub metrics_public: bool,
    /// Origins browsers may call from (CORS); `*` for any; none by default.
    pub allowed_origins: Vec<String>,
    /// Host names a request's `Host` may carry when no `api_key` is set,
    /// beyond localhost names and IP addresses (`*`: any); see `access::host_check`.
    pub allowed_hosts: Vec<String>,
    /// Open connections beyond which new ones get a 503 and are closed.
    pub max_connections: usize,
    /// A connection must send each request head within this long (new and
    /// idle keep-alive connections alike), else it is closed.
    pub head_timeout: Duration,
    /// A request body must arrive within this long (408 otherwise).
    pub body_timeout: Duration,
    /// Largest request body (413 beyond).
    pub max_body_bytes: usize,
    /// /metrics also under vLLM's `vllm:` names (for routers built for vLLM).
    pub vllm_metric_names: bool,
    /// On Ctrl-C or SIGTERM, how long requests in progress may take to finish.
    pub shutdown_timeout: Duration,
    /// More models beside the engine's, served by their registry names
    /// (loaded on a request's first use; `/v1/models/{id}/load|unload`).
    pub models: Option<Arc<crate::engine::ModelRegistry>>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            served_model_name: "model".into(),
            max_pending_requests: 4096,
            max_seqs_per_request: 256,
            api_key: None,
            metrics_public: false,
            allowed_origins: Vec::new(),
            allowed_hosts: Vec::new(),
            max_connections: 1024,
            head_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(30),
            max_body_bytes: 32 << 20,
            vllm_metric_names: false,
            shutdown_timeout: Duration::from_secs(30),
            models: None,
        }
    }
}

pub(crate) struct AppState {
    /// The engine of the model a request names (the server's primary model
    /// in the router's state; a registry model's in a request's, `for_model`).
    pub engine: Engine,
    /// `served_model_name` is the request's model.
    pub cfg: ServerConfig,
    /// Sequences in flight, all models together.
    pub in_flight: Arc<AtomicUsize>,
    pub created: u64,
}

impl AppState {
    /// The state a request for `model` runs with: this one for the primary
    /// model (or none named), else one whose engine is the registry's model,
    /// loaded now if it is not (the registry's observer logs the load and
    /// traces it).
    /// `keep_alive` (a request's, Ollama's meaning) sets how long a registry
    /// model stays loaded once idle.
    pub async fn for_model(
        self: &Arc<Self>,
        model: Option<&str>,
        keep_alive: Option<Duration>,
    ) -> Result<Arc<Self>, ApiError> {
        let m = match model {
            None => return Ok(self.clone()),
            Some(m) if m == self.cfg.served_model_name => return Ok(self.clone()),
            Some(m) => m.to_string(),
        };
        let Some(reg) = self.cfg.models.clone().filter(|r| r.contains(&m)) else {
            let mut names = vec![self.cfg.served_model_name.clone()];
            if let Some(r) = &self.cfg.models {
                names.extend(r.list().into_iter().map(|i| i.name));
            }
            return Err(ApiError::not_found(format!(
                "the model `{m}` does not exist; this server serves {}",
                names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
            )));
        };
        if keep_alive.is_some() {
            reg.set_keep_alive(&m, keep_alive)?;
        }
        let name = m.clone();
        let engine = tokio::task::spawn_blocking(move || reg.get(&name))
            .await
            .map_err(|e| ApiError::internal(e.to_string()))??;
        Ok(Arc::new(Self {
            engine,
            cfg: ServerConfig {
                served_model_name: m,
                ..self.cfg.clone()
            },
            in_flight: self.in_flight.clone(),
            created: self.created,
        }))
    }
}

/// Counts a request's sequences in flight until dropped.
pub(crate) struct InFlight(Arc<AppState>, usize);

impl InFlight {
    /// Admits a request of `seqs` sequences (prompts × n): a 400 over the
    /// per-request cap, a 503 when the sequences in flight would pass the limit.
    fn enter(state: &Arc<AppState>, seqs: usize) -> Result<Self, ApiError> {
        if seqs > state.cfg.max_seqs_per_request {
            return Err(ApiError::bad_request(
                format!(
                    "this request asks for {seqs} sequences (prompts × n); the limit is {} \
                     (--max-seqs-per-request): split it into smaller requests",
                    state.cfg.max_seqs_per_request
                ),
                Some("n"),
            ));
        }
        let n = state.in_flight.fetch_add(seqs, Ordering::SeqCst);
        let guard = Self(state.clone(), seqs);
        if n + seqs > state.cfg.max_pending_requests {
            return Err(ApiError::overloaded(format!(
                "the server is overloaded ({n} sequences in flight, limit {}); retry later",
                state.cfg.max_pending_requests
            )));
        }
        Ok(guard)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(self.1, Ordering::SeqCst);
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
        in_flight: Arc::new(AtomicUsize::new(0)),
        created,
    });
    Router::new()
        .route("/", get(pages::chat_page))
        .route("/engine", get(pages::engine_page))
        .route("/engine/state", get(pages::engine_state))
        .route("/engine/trace", get(pages::engine_trace))
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/metrics", get(models::metrics))
        .route("/v1/models", get(models::list))
        .route("/v1/models/{id}", get(models::by_id))
        .route("/v1/models/{id}/load", post(models::load))
        .route("/v1/models/{id}/unload", post(models::unload))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/chat/completions", post(completions::chat_completions))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .fallback(|| async {
            ApiError {
                status: StatusCode::NOT_FOUND,
                kind: "not_found_error",
                message: "no such route".into(),
                param: None,
            }
        })
        .method_not_allowed_fallback(|req: axum::extract::Request| async move {
            ApiError {
                status: StatusCode::METHOD_NOT_ALLOWED,
                kind: "invalid_request_error",
                message: format!("{} is not allowed on {}", req.method(), req.uri().path()),
                param: None,
            }
        })
        .layer(axum::middleware::from_fn_with_state(state.clone(), access::auth))
        .layer(axum::middleware::from_fn_with_state(state.clone(), access::host_check))
        .layer(axum::middleware::from_fn_with_state(state.clone(), access::cors))
        .layer(axum::middleware::from_fn(catch_panic::catch_panic))
        .with_state(state)
}

/// Serves until the future is dropped or the process gets Ctrl-C.
pub async fn serve(engine: Engine, cfg: ServerConfig, addr: SocketAddr) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    serve_on(listener, engine, cfg).await
}

/// Serves on a bound listener until Ctrl-C or SIGTERM (then drains: see
/// `serve_until`).
pub async fn serve_on(listener: tokio::net::TcpListener, engine: Engine, cfg: ServerConfig) -> std::io::Result<()> {
    serve_until(listener, engine, cfg, stop_signal()).await
}

/// Ctrl-C, or SIGTERM where there is one (what a service manager or
/// Kubernetes sends to stop a process).
async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// Serves on a bound listener until `shutdown` resolves; then stops
/// accepting and lets the requests in progress finish, for at most
/// `cfg.shutdown_timeout`.
pub async fn serve_until(
    listener: tokio::net::TcpListener,
    engine: Engine,
    cfg: ServerConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let (max, head, drain) = (cfg.max_connections, cfg.head_timeout, cfg.shutdown_timeout);
    if let Some(reg) = cfg.models.clone() {
        // Every load and unload: logged, and in the primary engine's step trace.
        let primary = engine.clone();
        reg.set_observer(Arc::new(move |e| {
            eprintln!("{}", e.describe());
            primary.trace_model_event(e);
        }));
        tokio::spawn(models::unload_idle_models(reg));
    }
    listener::run(listener, router(engine, cfg), max, head, drain, shutdown).await
}
