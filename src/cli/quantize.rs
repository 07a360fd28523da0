//! `wllm quantize IN OUT TYPE`: a GGUF or a Hugging Face directory written as a
//! GGUF at one of llama.cpp's mixes (`Q4_K_M`, `Q8_0`, …) with
//! llama-quantize's per-tensor rules.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use wllm::convert::quantize_model;
use wllm::quant::mix::Mix;

#[derive(Args, Clone, Debug)]
pub struct QuantizeArgs {
    /// The model to quantise: a .gguf file or a Hugging Face directory (Llama, byte-level BPE tokenizer).
    pub input: PathBuf,
    /// Where to write the new .gguf (replaced when it exists; written beside it first).
    pub output: PathBuf,
    /// The mix: Q2_K, Q3_K_S, Q3_K_M, Q3_K_L, Q4_K_S, Q4_K_M, Q5_K_S, Q5_K_M, Q6_K, Q8_0, Q4_0, Q4_1,
    /// Q5_0, Q5_1, F16, BF16 or F32 (Q3_K, Q4_K and Q5_K mean their _M mix, as in llama-quantize).
    #[arg(value_name = "TYPE")]
    pub mix: String,
}

pub fn run(a: &QuantizeArgs) -> anyhow::Result<()> {
    let Some(mix) = Mix::from_name(&a.mix) else {
        let names: Vec<String> = Mix::ALL.iter().map(|m| m.name()).collect();
        bail!("unknown quantisation type {:?}; use one of {}", a.mix, names.join(", "));
    };
    if a.input.canonicalize().ok() == a.output.canonicalize().ok() {
        bail!("the output {} is the input: write to another file", a.output.display());
    }
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} tensors  {elapsed}  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let t0 = std::time::Instant::now();
    let report = quantize_model(&a.input, &a.output, mix, |done, total, name| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
        bar.set_message(name.to_string());
    })
    .with_context(|| format!("quantizing {} to {}", a.input.display(), mix.name()))?;
    bar.finish_and_clear();
    let mut counts: Vec<(String, usize)> = Vec::new();
    for (_, _, to) in &report.tensors {
        match counts.iter_mut().find(|(t, _)| t == to) {
            Some(c) => c.1 += 1,
            None => counts.push((to.clone(), 1)),
        }
    }
    let mix_line: Vec<String> = counts.iter().map(|(t, n)| format!("{n} {t}")).collect();
    println!(
        "wrote {} ({}): {:.1} MiB from {:.1} MiB in {:.1} s; tensors: {}",
        a.output.display(),
        mix.name(),
        report.bytes_out as f64 / 1048576.0,
        report.bytes_in as f64 / 1048576.0,
        t0.elapsed().as_secs_f64(),
        mix_line.join(", ")
    );
    Ok(())
}
