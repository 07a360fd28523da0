//! `wllm info`: the model's shape, the adapter, and the KV-cache plan by the
//! seed's formula (bytes per token = 2·L·H_kv·d_h·b).

use clap::Args;
use wllm::backend::device::cuda_unavailable;
use wllm::engine::KvPlan;
use wllm::gpu::{GpuContext, GpuOptions};
use wllm::model::ModelFiles;

use super::EngineArgs;

#[derive(Args, Clone, Debug)]
pub struct InfoArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
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
    let (describe, max_buffer) = match a.engine.device.resolve()? {
        #[cfg(feature = "cuda")]
        wllm::Device::Cuda => {
            use wllm::backend::Backend;
            let b = wllm::backend::cuda::CudaBackend::new(0)?;
            (b.describe(), b.max_buffer())
        }
        _ => {
            let ctx = GpuContext::new(&GpuOptions {
                adapter: a.engine.adapter.clone(),
            })?;
            (ctx.describe(), ctx.max_binding())
        }
    };
    println!("device: {describe}");
    let plan = KvPlan::new(
        c.kv_bytes_per_token(),
        c.layers,
        a.engine.block_size,
        a.engine.kv_cache_memory,
        max_buffer,
        c.max_context,
        a.engine.max_model_len,
    )
    .map_err(anyhow::Error::msg)?;
    println!(
        "KV bytes per token: 2 x {} layers x {} KV heads x {} head_dim x 4 bytes (f32) = {}",
        c.layers, c.kv_heads, c.head_dim, plan.bytes_per_token
    );
    println!("{}", plan.describe());
    Ok(())
}
