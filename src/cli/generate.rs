//! `wllm generate`: complete prompts as one batch; with --json, one JSON object per
//! prompt, in order.

use anyhow::{Context, bail};
use clap::Args;
use wllm::sampling::constraint::Constraint;
use wllm::{ChatMessage, Prompt};

use super::{EngineArgs, SamplingArgs};

#[derive(Args, Clone, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Prompt text (repeatable: all prompts run together as one batch).
    #[arg(long, required_unless_present = "prompt_ids")]
    pub prompt: Vec<String>,
    /// A prompt as token ids, comma-separated, used as they are (no BOS added):
    /// checks a model apart from its tokenizer (repeatable; runs after the --prompt ones).
    #[arg(long, value_name = "ID,ID,...")]
    pub prompt_ids: Vec<String>,
    /// Wrap each prompt as a user message in the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// Print one JSON object per prompt: prompt_token_ids, token_ids, text, finish_reason.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Structured output: the text is a JSON value valid against the JSON schema in this file.
    #[arg(long, value_name = "FILE", group = "constraint")]
    pub json_schema: Option<std::path::PathBuf>,
    /// Structured output: the text matches this regular expression.
    #[arg(long, group = "constraint")]
    pub regex: Option<String>,
    /// Structured output: the text is one of these strings (comma-separated).
    #[arg(long, value_delimiter = ',', group = "constraint")]
    pub choice: Option<Vec<String>>,
    /// Structured output: the text follows the Lark grammar in this file.
    #[arg(long, value_name = "FILE", group = "constraint")]
    pub grammar: Option<std::path::PathBuf>,
}

/// The constraint the flags ask for.
fn constraint(a: &GenerateArgs) -> anyhow::Result<Option<Constraint>> {
    let read = |p: &std::path::Path| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()));
    Ok(if let Some(p) = &a.json_schema {
        let v = serde_json::from_str(&read(p)?).with_context(|| format!("{} is not JSON", p.display()))?;
        Some(Constraint::JsonSchema(v))
    } else if let Some(r) = &a.regex {
        Some(Constraint::Regex(r.clone()))
    } else if let Some(c) = &a.choice {
        Some(Constraint::Choice(c.clone()))
    } else if let Some(p) = &a.grammar {
        Some(Constraint::Grammar(read(p)?))
    } else {
        None
    })
}

/// The token ids of one --prompt-ids value.
fn parse_ids(s: &str) -> anyhow::Result<Vec<u32>> {
    let ids = s
        .split(',')
        .map(|t| t.trim())
        .filter(|t| !t.is_empty())
        .map(|t| {
            t.parse::<u32>()
                .with_context(|| format!("--prompt-ids: {t:?} is not a token id"))
        })
        .collect::<anyhow::Result<Vec<u32>>>()?;
    if ids.is_empty() {
        bail!("--prompt-ids {s:?} holds no token id");
    }
    Ok(ids)
}

pub fn run(a: &GenerateArgs) -> anyhow::Result<()> {
    if a.prompt.is_empty() && a.prompt_ids.is_empty() {
        bail!("give at least one --prompt or --prompt-ids");
    }
    let id_prompts = a
        .prompt_ids
        .iter()
        .map(|s| parse_ids(s).map(Prompt::Tokens))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut params = a.sampling.params();
    params.constraint = constraint(a)?;
    let engine = a.engine.start()?;
    let mut streams = Vec::new();
    let text_prompts = a.prompt.iter().map(|p| {
        if a.chat {
            Prompt::Chat(vec![ChatMessage::new("user", p)])
        } else {
            Prompt::Text(p.clone())
        }
    });
    for prompt in text_prompts.chain(id_prompts) {
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
    if !a.json
        && let Ok(m) = engine.metrics()
        && m.pipelines_compiled_total > 0
    {
        // (What a warmed-up server, `wllm serve`, pays before its first request.)
        eprintln!(
            "[this run compiled {} pipelines in {:.1} s]",
            m.pipelines_compiled_total, m.pipeline_compile_seconds_total
        );
    }
    a.engine.write_trace(&engine)
}
