//! Interactive chat: replies stream token by token, followed by a stats line.

use std::io::{BufRead, Write};

use clap::Args;
use wllm::{ChatMessage, Prompt};

use super::{EngineArgs, SamplingArgs};

#[derive(Args, Clone, Debug, Default)]
pub struct ChatArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Optional system message.
    #[arg(long)]
    pub system: Option<String>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

pub fn run(a: &ChatArgs) -> anyhow::Result<()> {
    let engine = a.engine.start_primed()?;
    let mut history = Vec::new();
    if let Some(s) = &a.system {
        history.push(ChatMessage::new("system", s));
    }
    let mut params = a.sampling.params();
    if params.max_tokens.is_none() {
        params.max_tokens = Some(512);
    }
    eprintln!("chat with the model; an empty line or Ctrl-D quits, /reset forgets the conversation.");
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    loop {
        eprint!("\n> ");
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 || line.trim().is_empty() {
            return a.engine.write_trace(&engine);
        }
        if line.trim() == "/reset" {
            history.truncate(a.system.is_some() as usize);
            continue;
        }
        history.push(ChatMessage::new("user", line.trim_end()));
        let mut p = params.clone();
        let n_prompt = engine.tokenize(&Prompt::Chat(history.clone()))?.len();
        let room = engine.kv_plan().max_model_len.saturating_sub(n_prompt);
        if room == 0 {
            eprintln!("the conversation no longer fits the context; /reset to start over");
            history.pop();
            continue;
        }
        p.max_tokens = p.max_tokens.map(|m| m.min(room));
        let mut reply = String::new();
        for item in engine.generate(Prompt::Chat(history.clone()), p)? {
            let o = item?;
            print!("{}", o.text);
            out.flush()?;
            reply.push_str(&o.text);
            if let Some(m) = o.metrics {
                let tps = m.num_output_tokens.saturating_sub(1) as f64 / m.decode_time.max(1e-9);
                eprintln!(
                    "\n[TTFT {:.3} s | {:.1} tokens/s | {} prompt + {} output tokens ({} from the prefix cache)]",
                    m.time_to_first_token, tps, m.num_prompt_tokens, m.num_output_tokens, m.num_cached_tokens
                );
            }
        }
        history.push(ChatMessage::new("assistant", &reply));
    }
}
