//! `wllm serve`: the OpenAI-compatible HTTP server.

use clap::Args;
use wllm::server::{ServerConfig, listener, serve};

use super::{EngineArgs, ModelArg};

#[derive(Args, Clone, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// The model name clients must use (default: the model file or directory name).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Sequences (prompts × n of every request) in flight beyond which new requests get 503.
    #[arg(long, default_value_t = 4096)]
    pub max_pending_requests: usize,
    /// Most sequences one request may ask for (prompts × n); more is a 400.
    #[arg(long, default_value_t = 256)]
    pub max_seqs_per_request: usize,
    /// Require `Authorization: Bearer KEY` on every /v1 route (and /metrics).
    #[arg(long, env = "WLLM_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Serve /metrics and the engine page's data (/engine/state, /engine/trace) without the API key.
    #[arg(long)]
    pub metrics_public: bool,
    /// /metrics also under vLLM's own names (vllm:num_requests_waiting, vllm:kv_cache_usage_perc,
    /// vllm:gpu_cache_usage_perc, vllm:prefix_cache_hits_total, ...), for routers and endpoint pickers
    /// built for vLLM (vllm-router, llm-d).
    #[arg(long)]
    pub vllm_metric_names: bool,
    /// Origins web pages may call the API from (CORS), comma-separated; `*` for any. None by default.
    #[arg(long, value_delimiter = ',')]
    pub allowed_origins: Vec<String>,
    /// Without --api-key: host names (the `Host` header) requests may be addressed to besides
    /// localhost names and IP addresses, comma-separated (`*.lan`: a domain's names; `*`: any). Guards against DNS
    /// rebinding (a web page on another site driving a server on your machine).
    #[arg(long, value_delimiter = ',')]
    pub allowed_hosts: Vec<String>,
    /// Open connections beyond which new ones get 503 and are closed (default: the open-file limit
    /// less 256, at most 16384).
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// Seconds a connection has to send each request head — new or idle between keep-alive
    /// requests — before it is closed.
    #[arg(long, default_value_t = 30)]
    pub head_timeout: u64,
    /// Seconds a request body has to arrive (408 after).
    #[arg(long, default_value_t = 30)]
    pub body_timeout: u64,
    /// Largest request body in bytes (413 beyond).
    #[arg(long, default_value_t = 32 << 20)]
    pub max_body_bytes: usize,
    /// On Ctrl-C or SIGTERM: seconds the requests in progress may take to finish (new connections
    /// are refused meanwhile) before the server exits.
    #[arg(long, default_value_t = 30)]
    pub shutdown_timeout: u64,
    /// Another model beside --model, served under NAME and loaded on its first request
    /// (repeatable): --add-model qwen=models/qwen2.5-0.5b-instruct-q4_k_m.gguf. Same engine flags;
    /// the same as a further --model NAME=PATH.
    #[arg(long, value_name = "NAME=PATH")]
    pub add_model: Vec<String>,
    /// Every .gguf file of this directory served beside --model, each named after its file (no
    /// .gguf) and loaded on its first request.
    #[arg(long, value_name = "DIR")]
    pub models_dir: Option<std::path::PathBuf>,
    /// Seconds an added model may sit with no request before it is unloaded (0: never; the
    /// --model one stays loaded).
    #[arg(long, default_value_t = 300)]
    pub idle_unload: u64,
    /// Warm each model loaded on demand up as it loads (as the first --model is at start): its load
    /// takes the warm-up's steps (on lavapipe 12-14 s for a small model, mostly the driver compiling
    /// kernels its first request would compile anyway); its first request then compiles nothing, and
    /// stall-free batching has its measured step cost from the start.
    #[arg(long)]
    pub warm_up_models: bool,
    /// Bytes the added models may take together (their memory plans); a load past it unloads the
    /// least recently used idle ones first, or is refused naming what is loaded. Default: no limit.
    #[arg(long)]
    pub models_memory: Option<u64>,
}

/// The registry of the models served beside the primary one (`primary`'s
/// settings), if any were given: the further `--model`s (`extra`), the
/// `--add-model`s and the `--models-dir`'s files.
fn added_models(
    a: &ServeArgs,
    primary: &EngineArgs,
    extra: &[ModelArg],
) -> anyhow::Result<Option<std::sync::Arc<wllm::engine::ModelRegistry>>> {
    if extra.is_empty() && a.add_model.is_empty() && a.models_dir.is_none() {
        return Ok(None);
    }
    let mut base = primary.config()?;
    // A draft model is the primary model's; the added ones run without.
    base.speculative = base.speculative.filter(|s| !s.uses_draft_model());
    let ctx = wllm::gpu::GpuContext::shared(&wllm::backend::gpu_options(&base))?;
    let idle = (a.idle_unload > 0).then(|| std::time::Duration::from_secs(a.idle_unload));
    let mut reg = wllm::engine::ModelRegistry::new(&ctx, base, a.models_memory, idle);
    reg.warm_up = a.warm_up_models;
    for m in extra {
        let name = m.name.clone().unwrap_or_else(|| model_name(&m.path));
        reg.add(&name, &m.path)?;
    }
    for spec in &a.add_model {
        let Some((name, path)) = spec.split_once('=') else {
            anyhow::bail!("--add-model takes NAME=PATH, got {spec:?}");
        };
        reg.add(name, path)?;
    }
    if let Some(dir) = &a.models_dir {
        let names = reg.add_dir(dir)?;
        if names.is_empty() {
            anyhow::bail!("--models-dir {}: no .gguf file there", dir.display());
        }
    }
    let names: Vec<String> = reg.list().into_iter().map(|m| m.name).collect();
    eprintln!("also serving, loaded on first use: {}", names.join(", "));
    Ok(Some(std::sync::Arc::new(reg)))
}

/// The default served name of a model path.
pub fn model_name(path: &std::path::Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    name.strip_suffix(".gguf").map(String::from).unwrap_or(name)
}

pub fn run(a: &ServeArgs) -> anyhow::Result<()> {
    if a.api_key.as_deref().is_some_and(str::is_empty) {
        anyhow::bail!("--api-key (or WLLM_API_KEY) is empty");
    }
    let nofile = listener::raise_nofile_limit();
    let (primary, extra) = a.engine.split_models();
    let models = added_models(a, &primary, &extra)?;
    let engine = primary.start_server(256)?;
    let cfg = ServerConfig {
        served_model_name: a
            .served_model_name
            .clone()
            .or_else(|| primary.model.first().and_then(|m| m.name.clone()))
            .unwrap_or_else(|| model_name(&primary.model_path().unwrap_or_default())),
        max_pending_requests: a.max_pending_requests,
        max_seqs_per_request: a.max_seqs_per_request,
        api_key: a.api_key.clone(),
        metrics_public: a.metrics_public,
        allowed_origins: a.allowed_origins.clone(),
        allowed_hosts: a.allowed_hosts.clone(),
        max_connections: a
            .max_connections
            .unwrap_or_else(|| listener::default_max_connections(nofile)),
        head_timeout: std::time::Duration::from_secs(a.head_timeout.max(1)),
        body_timeout: std::time::Duration::from_secs(a.body_timeout.max(1)),
        max_body_bytes: a.max_body_bytes,
        vllm_metric_names: a.vllm_metric_names,
        shutdown_timeout: std::time::Duration::from_secs(a.shutdown_timeout),
        models,
    };
    if let Some(r) = &cfg.models
        && r.contains(&cfg.served_model_name)
    {
        anyhow::bail!(
            "another model is named {} as the first --model is served: rename it (--model NAME=PATH) or set \
             --served-model-name",
            cfg.served_model_name
        );
    }
    if cfg.api_key.is_none() && !a.host.starts_with("127.") && a.host != "localhost" && a.host != "::1" {
        eprintln!(
            "warning: serving on {} without --api-key: anyone who can reach it can use it",
            a.host
        );
    }
    if let Some(problem) = engine.tokenizer().template_budget_problem() {
        eprintln!(
            "warning: the model's chat template cannot render a two-message conversation within the render \
             budget ({problem}); chat requests will be refused: give the model a working template"
        );
    }
    let addr: std::net::SocketAddr = format!("{}:{}", a.host, a.port)
        .parse()
        .map_err(|e| anyhow::anyhow!("bad --host/--port {}:{}: {e}", a.host, a.port))?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    eprintln!("serving {} on http://{addr}/v1 (Ctrl-C stops)", cfg.served_model_name);
    rt.block_on(serve(engine.clone(), cfg, addr))?;
    primary.write_trace(&engine)
}
