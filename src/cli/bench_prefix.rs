//! `wllm bench prefix`: the seed's prefix-cache experiment. The same system
//! prompt and document with different final questions (prefix-cache hits), then
//! the same questions after changing the front of the document (misses): prefill
//! time, TTFT and hit rate of each, side by side.

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use wllm::{ChatMessage, Prompt, RequestMetrics, SamplingParams};

use super::EngineArgs;

#[derive(Args, Clone, Debug)]
pub struct BenchPrefixArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Sentences in the shared document.
    #[arg(long, default_value_t = 24)]
    pub doc_sentences: usize,
    /// Questions asked of each version of the document.
    #[arg(long, default_value_t = 4)]
    pub questions: usize,
    #[arg(long, default_value_t = 8)]
    pub max_tokens: usize,
    /// Ask each phase's questions at once instead of one after another: the hits then share the
    /// document's cached blocks (reference counts above 1 in a --trace report's block map).
    #[arg(long)]
    pub concurrent: bool,
}

const TOPICS: [&str; 8] = [
    "the library",
    "the river",
    "the old mill",
    "the school",
    "the market",
    "the bridge",
    "the orchard",
    "the station",
];
const QUESTIONS: [&str; 8] = [
    "What is the document mainly about?",
    "Which places does it mention?",
    "What changed over the years?",
    "Who used the buildings most?",
    "Summarise it in one sentence.",
    "What is the oldest thing described?",
    "Which detail surprised you?",
    "What would you ask the author?",
];

fn document(sentences: usize, front: &str) -> String {
    let mut d = String::from(front);
    for i in 0..sentences {
        let t = TOPICS[i % TOPICS.len()];
        d.push_str(&format!(
            " In year {}, the town repaired {t}, and {} people came to see it on the first morning.",
            1900 + 3 * i,
            40 + 7 * i
        ));
    }
    d
}

fn ask(engine: &wllm::Engine, doc: &str, q: &str, max_tokens: usize) -> anyhow::Result<RequestMetrics> {
    finish(start(engine, doc, q, max_tokens)?)
}

fn finish(s: wllm::RequestStream) -> anyhow::Result<RequestMetrics> {
    s.collect_all()?
        .metrics
        .ok_or_else(|| anyhow::anyhow!("the request ended without metrics"))
}

fn start(engine: &wllm::Engine, doc: &str, q: &str, max_tokens: usize) -> anyhow::Result<wllm::RequestStream> {
    let msgs = vec![
        ChatMessage::new(
            "system",
            "You answer questions about the document the user gives, briefly.",
        ),
        ChatMessage::new("user", &format!("Document:\n{doc}\n\nQuestion: {q}")),
    ];
    let p = SamplingParams {
        max_tokens: Some(max_tokens),
        ..SamplingParams::greedy()
    };
    Ok(engine.generate(Prompt::Chat(msgs), p)?)
}

pub fn run(a: &BenchPrefixArgs) -> anyhow::Result<()> {
    let engine = a.engine.start()?;
    let nq = a.questions.clamp(1, QUESTIONS.len());
    let bar = ProgressBar::new(2 * nq as u64 + 1);
    bar.set_style(
        ProgressStyle::with_template("[{bar:30}] {pos}/{len} requests, {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let doc = document(a.doc_sentences, "This is the history of a small town.");
    // Warm the cache with the document once.
    let cold = ask(&engine, &doc, "Read the document.", a.max_tokens)?;
    bar.inc(1);
    // Each phase's questions one after another, or all at once (--concurrent).
    let phase = |docs: &[(String, &str)]| -> anyhow::Result<Vec<RequestMetrics>> {
        let mut out = Vec::new();
        if a.concurrent {
            let streams: Vec<_> = docs
                .iter()
                .map(|(d, q)| start(&engine, d, q, a.max_tokens))
                .collect::<anyhow::Result<_>>()?;
            for s in streams {
                out.push(finish(s)?);
                bar.inc(1);
            }
        } else {
            for (d, q) in docs {
                out.push(ask(&engine, d, q, a.max_tokens)?);
                bar.inc(1);
            }
        }
        Ok(out)
    };
    let same: Vec<(String, &str)> = QUESTIONS[..nq].iter().map(|q| (doc.clone(), *q)).collect();
    let hits = phase(&same)?;
    let changed: Vec<(String, &str)> = QUESTIONS[..nq]
        .iter()
        .enumerate()
        .map(|(i, q)| {
            let d = document(
                a.doc_sentences,
                &format!("Revision {i}: a different history of another town."),
            );
            (d, *q)
        })
        .collect();
    let misses = phase(&changed)?;
    bar.finish_and_clear();
    println!(
        "document + system prompt: {} prompt tokens (cold run: prefill {:.3} s, TTFT {:.3} s)",
        cold.num_prompt_tokens, cold.prefill_time, cold.time_to_first_token
    );
    println!("| | requests | prompt tokens | cached tokens | hit rate | prefill (s) | TTFT (s) |");
    println!("|---|---|---|---|---|---|---|");
    for (name, v) in [
        ("same document, new question (hits)", &hits),
        ("changed document front (misses)", &misses),
    ] {
        let n = v.len() as f64;
        let avg = |f: &dyn Fn(&RequestMetrics) -> f64| v.iter().map(f).sum::<f64>() / n;
        let prompt = avg(&|m| m.num_prompt_tokens as f64);
        let cached = avg(&|m| m.num_cached_tokens as f64);
        println!(
            "| {name} | {} | {prompt:.0} | {cached:.0} | {:.1} % | {:.3} | {:.3} |",
            v.len(),
            100.0 * cached / prompt.max(1.0),
            avg(&|m| m.prefill_time),
            avg(&|m| m.time_to_first_token)
        );
    }
    a.engine.write_trace(&engine)
}
