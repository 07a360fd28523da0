//! `wllm kernels --dump DIR`: writes every WGSL kernel variant the engine would
//! run on this adapter for the model (gemm tiles, embed, attention shape), as
//! rendered from the templates in shaders/.

use std::path::PathBuf;

use anyhow::Context;
#[cfg(feature = "cuda")]
use anyhow::bail;
use clap::Args;
use wllm::backend::OpenBackend;
use wllm::model::ModelFiles;

use super::EngineArgs;

#[derive(Args, Clone, Debug)]
pub struct KernelsArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Directory to write the rendered .wgsl files into (created if missing).
    #[arg(long)]
    pub dump: PathBuf,
}

pub fn run(a: &KernelsArgs) -> anyhow::Result<()> {
    let mut cfg = a.engine.config()?;
    cfg.device = wllm::Device::Wgpu;
    let c = ModelFiles::open(&cfg.model)?.config()?;
    let (backend, _) = wllm::backend::open(&cfg)?;
    // Without the cuda feature the match has one arm; with it, two.
    #[allow(clippy::infallible_destructuring_match)]
    let kernels = match backend {
        OpenBackend::Wgpu(k) => *k,
        #[cfg(feature = "cuda")]
        OpenBackend::Cuda(_) => {
            bail!("kernels --dump renders the WGSL kernels; the cuda backend's are the .cu files in shaders/cuda/")
        }
    };
    let variants = kernels.rendered_variants(c.head_dim as u32, c.heads as u32, c.kv_heads as u32)?;
    std::fs::create_dir_all(&a.dump).with_context(|| format!("creating {}", a.dump.display()))?;
    for v in &variants {
        let p = a.dump.join(&v.file);
        std::fs::write(&p, &v.source).with_context(|| format!("writing {}", p.display()))?;
    }
    println!(
        "wrote {} kernels for {} to {}",
        variants.len(),
        kernels.ctx.describe(),
        a.dump.display()
    );
    Ok(())
}
