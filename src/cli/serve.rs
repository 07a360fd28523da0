//! `wllm serve`: the OpenAI-compatible HTTP server.

use clap::Args;
use wllm::server::{ServerConfig, serve};

use super::EngineArgs;

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
    /// Requests in flight beyond which new ones are refused with 503.
    #[arg(long, default_value_t = 1024)]
    pub max_pending_requests: usize,
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
    let engine = a.engine.start_warm()?;
    let cfg = ServerConfig {
        served_model_name: a
            .served_model_name
            .clone()
            .unwrap_or_else(|| model_name(&a.engine.model_path().unwrap_or_default())),
        max_pending_requests: a.max_pending_requests,
    };
    let addr: std::net::SocketAddr = format!("{}:{}", a.host, a.port)
        .parse()
        .map_err(|e| anyhow::anyhow!("bad --host/--port {}:{}: {e}", a.host, a.port))?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    eprintln!("serving {} on http://{addr}/v1 (Ctrl-C stops)", cfg.served_model_name);
    rt.block_on(serve(engine, cfg, addr))?;
    Ok(())
}
