//! `wllm generate`: complete prompts as one batch; with --json, one JSON object per
//! prompt, in order.

use anyhow::bail;
use clap::Args;
use wllm::{ChatMessage, Prompt};

use super::{EngineArgs, SamplingArgs};

#[derive(Args, Clone, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Prompt text (repeatable: all prompts run together as one batch).
    #[arg(long, required = true)]
    pub prompt: Vec<String>,
    /// Wrap each prompt as a user message in the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// Print one JSON object per prompt: prompt_token_ids, token_ids, text, finish_reason.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

pub fn run(a: &GenerateArgs) -> anyhow::Result<()> {
    if a.prompt.is_empty() {
        bail!("give at least one --prompt");
    }
    let engine = a.engine.start()?;
    let params = a.sampling.params();
    let mut streams = Vec::new();
    for p in &a.prompt {
        let prompt = if a.chat {
            Prompt::Chat(vec![ChatMessage::new("user", p)])
        } else {
            Prompt::Text(p.clone())
        };
        streams.push(engine.generate(prompt, params.clone())?);
    }
    for s in streams {
        let r = s.collect_all()?;
        if a.json {
            let j = serde_json::json!({
                "prompt_token_ids": r.prompt_token_ids,
                "token_ids": r.token_ids,
                "text": r.text,
                "finish_reason": r.finish_reason.map(|f| f.as_str()),
            });
            println!("{j}");
        } else {
            println!("{}", r.text);
            if let Some(m) = r.metrics {
                eprintln!(
                    "[{} prompt + {} output tokens, TTFT {:.3} s, {:.1} tokens/s]",
                    m.num_prompt_tokens,
                    m.num_output_tokens,
                    m.time_to_first_token,
                    m.num_output_tokens.saturating_sub(1) as f64 / m.decode_time.max(1e-9)
                );
            }
        }
    }
    Ok(())
}
