//! `wllm embed`: embeds texts (each `--text`, else each line of standard
//! input) as one batch (or `--batch N` at a time) and prints, per text, its
//! token count, norm and first values, then (up to ten texts) the cosine
//! similarity of every pair, and the embeddings per second; `--json` prints
//! one JSON object per text with the whole vector.

use std::io::BufRead;

use anyhow::{Context, bail};
use clap::Args;
use wllm::Prompt;
use wllm::config::{EmbedSpec, Pooling};

use super::EngineArgs;

#[derive(Args, Clone, Debug)]
pub struct EmbedArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// A text to embed (repeatable); none: one text per line of standard input.
    #[arg(long = "text")]
    pub texts: Vec<String>,
    /// How the prompt's final hidden states are pooled (default: the model file's
    /// pooling_type, else mean).
    #[arg(long, value_enum)]
    pub pooling: Option<Pooling>,
    /// Leave the vectors at their length (default: scaled to unit length).
    #[arg(long)]
    pub no_normalize: bool,
    /// One JSON object per text: {"text", "tokens", "embedding"}.
    #[arg(long)]
    pub json: bool,
    /// Texts embedded at a time (each group waits for the one before; default: all at once).
    #[arg(long)]
    pub batch: Option<usize>,
}

pub fn run(a: &EmbedArgs) -> anyhow::Result<()> {
    let mut texts = a.texts.clone();
    if texts.is_empty() {
        for line in std::io::stdin().lock().lines() {
            let line = line.context("reading standard input")?;
            if !line.trim().is_empty() {
                texts.push(line);
            }
        }
    }
    if texts.is_empty() {
        bail!("nothing to embed: give --text TEXT (repeatable) or lines on standard input");
    }
    let engine = a.engine.start()?;
    let spec = EmbedSpec {
        pooling: a.pooling.unwrap_or_else(|| engine.default_pooling()),
        normalize: !a.no_normalize,
    };
    let batch = a.batch.unwrap_or(texts.len()).max(1);
    let t = std::time::Instant::now();
    let mut out = Vec::with_capacity(texts.len());
    for group in texts.chunks(batch) {
        out.extend(engine.embed_blocking(group.iter().cloned().map(Prompt::Text).collect(), spec)?);
    }
    let secs = t.elapsed().as_secs_f64();
    for (text, (e, tokens)) in texts.iter().zip(&out) {
        if a.json {
            println!(
                "{}",
                serde_json::json!({"text": text, "tokens": tokens, "embedding": e})
            );
        } else {
            let norm = e.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
            let head: Vec<String> = e.iter().take(6).map(|x| format!("{x:+.5}")).collect();
            println!(
                "{tokens:>5} tokens  norm {norm:.4}  [{} …]  {text:.60}",
                head.join(", ")
            );
        }
    }
    // Every pair's similarity, for a handful of texts.
    if !a.json && out.len() <= 10 {
        for i in 0..out.len() {
            for j in i + 1..out.len() {
                let (x, y) = (&out[i].0, &out[j].0);
                let dot: f64 = x.iter().zip(y).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum();
                let n = |v: &[f32]| v.iter().map(|a| f64::from(*a).powi(2)).sum::<f64>().sqrt();
                println!("cosine({}, {}) = {:.4}", i + 1, j + 1, dot / (n(x) * n(y)));
            }
        }
    }
    let tokens: usize = out.iter().map(|(_, n)| n).sum();
    eprintln!(
        "[{} texts, {tokens} tokens, {batch} at a time, {} pooling, {} dimensions, {secs:.3} s: {:.1} embeddings/s]",
        out.len(),
        spec.pooling,
        out[0].0.len(),
        out.len() as f64 / secs
    );
    Ok(())
}
