//! `wllm info`: the model's shape, the adapter, and the KV-cache plan by the
//! seed's formula (bytes per token = 2·L·H_kv·d_h·b).

use clap::Args;
use wllm::backend::device::cuda_unavailable;
use wllm::engine::KvPlan;
use wllm::model::ModelFiles;

use super::EngineArgs;

#[derive(Args, Clone, Debug)]
pub struct InfoArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Also load the engine and print where start-up time goes (device, tokenizer,
    /// weights, pipelines, KV pool), then run a one-token prompt and print its time.
    #[arg(long)]
    pub timings: bool,
}

pub fn run(a: &InfoArgs) -> anyhow::Result<()> {
    let path = a.engine.model_path()?;
    let files = ModelFiles::open(&path)?;
    let c = files.config()?;
    println!("model: {}", path.display());
    println!(
        "architecture {}: {} layers, hidden {}, {} query heads, {} KV heads, head_dim {}, intermediate {}, vocab {}, \
         context {}, rope theta {}, rms eps {}, tied embeddings {}",
        c.arch,
        c.layers,
        c.hidden,
        c.heads,
        c.kv_heads,
        c.head_dim,
        c.intermediate,
        c.vocab,
        c.max_context,
        c.rope_theta,
        c.rms_eps,
        c.tie_embeddings
    );
    match cuda_unavailable() {
        None => println!("cuda: available"),
        Some(why) => println!("cuda: not available ({why})"),
    }
    let cfg = a.engine.config()?;
    let (backend, _) = wllm::backend::open(&cfg)?;
    let max_buffer = backend.max_buffer();
    println!("device: {}", backend.describe());
    let groups = wllm::engine::KvGroups::of(&c, cfg.hybrid_kv_cache);
    let files = ModelFiles::open_with(&path, cfg.quantize)?;
    let mut memory = wllm::LlmEngine::plan_memory(
        backend.device_memory(),
        backend.shares_host_memory(),
        backend.reads_narrow_weights(),
        &files,
        &c,
        groups.len(),
        &cfg,
        None,
    )?;
    drop(backend);
    let plan = KvPlan::new(
        &groups,
        cfg.kv_dtype(),
        c.kv_bytes_per_token(cfg.kv_dtype()),
        a.engine.block_size,
        a.engine.max_num_batched_tokens,
        Some(memory.kv),
        max_buffer,
        c.max_context,
        a.engine.max_model_len,
    )
    .map_err(anyhow::Error::msg)?;
    println!(
        "KV bytes per token: 2 x {} layers x {} KV heads x {} head_dim x {} bytes ({}) = {}",
        c.layers,
        c.kv_heads,
        c.head_dim,
        plan.dtype.bytes_per_value(),
        plan.dtype,
        plan.bytes_per_token
    );
    memory.kv = plan.pool_bytes;
    println!("{}", memory.describe());
    println!("{}", plan.describe());
    if a.timings {
        let t0 = std::time::Instant::now();
        let engine = wllm::Engine::new(&cfg)?;
        println!("{}", engine.load_timings().describe());
        let params = wllm::SamplingParams {
            max_tokens: Some(1),
            ..wllm::SamplingParams::greedy()
        };
        let mut prompt_seconds = Vec::new();
        for p in ["The capital of France is", "The capital of Spain is"] {
            let t = std::time::Instant::now();
            engine
                .generate(wllm::Prompt::Text(p.into()), params.clone())?
                .collect_all()?;
            prompt_seconds.push(t.elapsed().as_secs_f64());
            if prompt_seconds.len() == 1 {
                println!("start to first token {:.2} s", t0.elapsed().as_secs_f64());
            }
        }
        println!(
            "one-token prompt: first {:.2} s (builds the pipelines it needs), second {:.2} s",
            prompt_seconds[0], prompt_seconds[1]
        );
    }
    Ok(())
}
