//! `wllm perplexity --file TEXT`: llama.cpp's perplexity (windows of `--ctx`
//! tokens, the second half of each scored), the running value on a progress bar.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use super::EngineArgs;

#[derive(Args, Clone, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// The text to score (UTF-8).
    #[arg(long)]
    pub file: PathBuf,
    /// Tokens per window (llama.cpp's -c); the second half of each window is scored.
    #[arg(long, default_value_t = 512)]
    pub ctx: usize,
    /// Score at most this many windows (default: as many as the text holds).
    #[arg(long)]
    pub chunks: Option<usize>,
    /// Also run the model with this KV cache dtype (e.g. f32) and report the KL
    /// divergence of the distributions from it (llama-perplexity's --kl-divergence).
    #[arg(long)]
    pub kl_base_kv_dtype: Option<wllm::config::KvDtype>,
}

pub fn run(a: &PerplexityArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&a.file).with_context(|| format!("reading {}", a.file.display()))?;
    if a.ctx < 4 {
        bail!("--ctx {} is too small (at least 4)", a.ctx);
    }
    let mut cfg = a.engine.config()?;
    // A window is prefilled in steps of up to 512 tokens, each with a logits
    // row per token: as many rows as bind as one buffer (Gemma's 262,144-token
    // vocabulary: 128 rows in a 128 MiB binding).
    let vocab = wllm::model::ModelFiles::open(&cfg.model)?.config()?.vocab;
    let (backend, _) = wllm::backend::open(&cfg)?;
    let max_rows = wllm::engine::llm_engine::max_logits_rows(vocab, backend.max_buffer());
    drop(backend);
    let step = a.ctx.min(512).min(max_rows);
    cfg.max_num_batched_tokens = step;
    cfg.max_num_seqs = step;
    cfg.max_model_len = Some(a.ctx);
    let t0 = std::time::Instant::now();
    let mut engine = wllm::engine::LlmEngine::new(&cfg)?;
    let tokens = engine.tokenizer.encode(&text).context("tokenizing the text")?;
    eprintln!(
        "{}: {} tokens; {} windows of {} ({} loaded in {:.1} s)",
        a.file.display(),
        tokens.len(),
        (tokens.len() / a.ctx).min(a.chunks.unwrap_or(usize::MAX)),
        a.ctx,
        cfg.model.display(),
        t0.elapsed().as_secs_f64()
    );
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} windows  {elapsed}  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let t1 = std::time::Instant::now();
    let mut running = Vec::new();
    let ppl = match a.kl_base_kv_dtype {
        None => engine.perplexity(&tokens, a.ctx, a.chunks, |done, total, p| {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
            bar.set_message(format!("PPL {:.4}", p.value()));
            running.push(format!("[{done}]{:.4}", p.value()));
        })?,
        Some(base_dtype) => {
            let base_cfg = wllm::EngineConfig {
                kv_cache_dtype: Some(base_dtype),
                ..cfg.clone()
            };
            let mut base = wllm::engine::LlmEngine::new(&base_cfg)?;
            let (ppl, kl) = engine.perplexity_against(&mut base, &tokens, a.ctx, a.chunks, |done, total, p, kl| {
                bar.set_length(total as u64);
                bar.set_position(done as u64);
                bar.set_message(format!("PPL {:.4}  KL {:.6}", p.value(), kl.mean()));
                running.push(format!("[{done}]{:.4}", p.value()));
            })?;
            bar.finish_and_clear();
            println!(
                "KL divergence from the {base_dtype} KV cache's distributions: mean {:.6}, max {:.6} over {} \
                 positions; same top token {:.3}%",
                kl.mean(),
                kl.max,
                kl.n,
                100.0 * kl.same_top_fraction()
            );
            let (ln_ratio, ln_se) = kl.ln_ppl_ratio();
            let (d, d_se) = kl.delta_ppl(ppl.value());
            println!(
                "PPL {:.4} against {:.4} with the {base_dtype} KV cache: ΔPPL {d:+.4} +/- {d_se:.4}, \
                 mean ln(PPL/PPL_base) {ln_ratio:+.6} +/- {ln_se:.6} (paired over the same tokens)",
                ppl.value(),
                kl.base_ppl()
            );
            ppl
        }
    };
    bar.finish_and_clear();
    println!("{}", running.join(","));
    println!(
        "Final estimate: PPL = {:.4} +/- {:.5}  ({} windows of {}, {} tokens scored, {:.1} s)",
        ppl.value(),
        ppl.uncertainty(),
        ppl.windows,
        a.ctx,
        ppl.scored,
        t1.elapsed().as_secs_f64()
    );
    Ok(())
}
