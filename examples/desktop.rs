//! What a desktop app does with wllm: a chat model and an embedding model
//! side by side on one device, loaded on first use, embedding notes for
//! search, answering a question, unloading when done, and idle models
//! going after their keep-alive.
//! `cargo run --release --example desktop [CHAT_MODEL [EMBED_MODEL]]`
//! (both default to the default model).

use std::time::Duration;

use wllm::config::{EmbedSpec, Pooling};
use wllm::engine::ModelRegistry;
use wllm::gpu::{GpuContext, GpuOptions};
use wllm::{ChatMessage, EngineConfig, Prompt, SamplingParams};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let chat_model = args.next().map(Into::into).unwrap_or_else(wllm::default_model_path);
    let embed_model = args.next().map(Into::into).unwrap_or_else(|| chat_model.clone());
    let ctx = GpuContext::shared(&GpuOptions::default())?;
    // Every model's engine settings but the file; at most 1 GiB for all models
    // loaded together (least recently used idle ones make room); idle models
    // unload after 5 minutes (Ollama's keep_alive default).
    let base = EngineConfig {
        kv_cache_memory: Some(128 << 20),
        ..Default::default()
    };
    let models = ModelRegistry::new(&ctx, base, Some(1 << 30), Some(Duration::from_secs(300)));
    models.add("chat", chat_model)?;
    models.add("embed", embed_model)?;

    // Local search: embed the notes and a query, rank by cosine similarity.
    let notes = [
        "Buy oat milk and coffee beans on Saturday.",
        "The quarterly report is due to finance on the 14th.",
        "Ideas for the garden: tomatoes, basil, a small pond.",
    ];
    let spec = EmbedSpec {
        pooling: Pooling::Mean,
        normalize: true,
    };
    let embedder = models.get("embed")?;
    let mut inputs: Vec<Prompt> = notes.iter().map(|n| Prompt::Text(n.to_string())).collect();
    inputs.push(Prompt::Text("When is the finance deadline?".into()));
    let mut vecs = embedder.embed_blocking(inputs, spec)?;
    let (query, _) = vecs.pop().expect("the query's vector");
    let best = (0..notes.len())
        .max_by(|&a, &b| {
            let dot = |i: usize| vecs[i].0.iter().zip(&query).map(|(x, y)| x * y).sum::<f32>();
            dot(a).total_cmp(&dot(b))
        })
        .expect("notes");
    println!("closest note: {}", notes[best]);
    drop(embedder);

    // Answer with the chat model, the note as context.
    let chat = models.get("chat")?;
    let prompt = Prompt::Chat(vec![
        ChatMessage::new("system", &format!("The user's note: {}", notes[best])),
        ChatMessage::new("user", "When is the finance deadline?"),
    ]);
    let reply = chat.generate(
        prompt,
        SamplingParams {
            max_tokens: Some(40),
            ..SamplingParams::greedy()
        },
    )?;
    println!("answer: {}", reply.collect_all()?.text.trim());
    drop(chat);

    for m in models.list() {
        println!(
            "{}: loaded {}, {:.1} MiB, loaded in {:.2} s",
            m.name,
            m.loaded,
            m.bytes as f64 / (1 << 20) as f64,
            m.load_seconds.unwrap_or(0.0)
        );
    }
    // Settings screen: unload the embedder now; the chat model stays until idle.
    models.unload("embed")?;
    println!("device bytes after unloading the embedder: {}", models.device_bytes());
    Ok(())
}
