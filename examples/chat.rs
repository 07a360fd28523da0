//! A terminal chat that embeds wllm: `cargo run --release --example chat [MODEL]`.

use std::io::{BufRead, Write};

use wllm::{ChatMessage, Engine, EngineConfig, Prompt, SamplingParams};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let model = std::env::args()
        .nth(1)
        .map(Into::into)
        .unwrap_or_else(wllm::default_model_path);
    let engine = Engine::new(&EngineConfig {
        model,
        ..Default::default()
    })?;
    let params = SamplingParams {
        temperature: 0.7,
        top_p: 0.9,
        max_tokens: Some(256),
        ..Default::default()
    };
    let mut history: Vec<ChatMessage> = Vec::new();
    let stdin = std::io::stdin();
    loop {
        print!("\nyou> ");
        std::io::stdout().flush()?;
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 || line.trim().is_empty() {
            return Ok(());
        }
        history.push(ChatMessage::new("user", line.trim()));
        print!("bot> ");
        let mut reply = String::new();
        for out in engine.generate(Prompt::Chat(history.clone()), params.clone())? {
            let out = out?;
            print!("{}", out.text);
            std::io::stdout().flush()?;
            reply.push_str(&out.text);
            if let Some(m) = out.metrics {
                let tps = m.num_output_tokens.saturating_sub(1) as f64 / m.decode_time.max(1e-9);
                print!("\n[TTFT {:.2} s, {:.1} tokens/s]", m.time_to_first_token, tps);
            }
        }
        history.push(ChatMessage::new("assistant", &reply));
    }
}
