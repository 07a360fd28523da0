//! The request bodies `wllm bench serve` sends, by workload: `random` token
//! ids of a fixed length (the seed's experiment: the output never echoes the
//! input), `lookup` (copy or edit a given passage: the output repeats the
//! prompt, where speculative decoding by prompt lookup pays), and `chat`
//! (open questions: free text, where lookup rarely guesses). The text
//! workloads go through `/v1/chat/completions`, so any OpenAI-compatible
//! server applies its model's chat template; they stop at the model's end of
//! turn (`--output-len` is the cap).

use clap::ValueEnum;
use rand::Rng;
use rand::seq::IndexedRandom;
use serde_json::{Value, json};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// Random token ids of --input-len, --output-len tokens each (ignore_eos).
    Random,
    /// Copy or edit a passage of about --input-len tokens from --passages.
    Lookup,
    /// Open questions (free text).
    Chat,
}

/// The text `lookup` takes its passages from when no `--passages` file is given:
/// wllm's README (prose, tables, commands and code).
pub const DEFAULT_PASSAGES: &str = include_str!("../../README.md");

/// Characters a token of English prose and code takes, roughly (a passage of
/// `input_len` tokens is cut to `4 × input_len` characters).
const CHARS_PER_TOKEN: usize = 4;

const TOPICS: &[&str] = &[
    "a cat who learns to sail",
    "the first rain on a desert town",
    "why the sky is blue",
    "a lighthouse keeper's last night",
    "how bread rises",
    "a robot that collects lost socks",
    "the history of the bicycle",
    "two friends lost in a museum",
    "how a compiler works",
    "a garden on the moon",
    "the rules of chess",
    "a letter to one's future self",
];

const ASKS: &[&str] = &[
    "Write a short story about",
    "Explain to a child",
    "Write a poem about",
    "Give three surprising facts about",
    "Describe",
];

/// A passage of about `chars` characters from `text`, starting at a line
/// start chosen by `rng` and ending at a line end where one is near.
fn passage(text: &str, chars: usize, rng: &mut impl Rng) -> String {
    let starts: Vec<usize> = std::iter::once(0)
        .chain(text.match_indices('\n').map(|(i, _)| i + 1))
        .filter(|&i| i + chars <= text.len() || i == 0)
        .collect();
    let from = *starts.choose(rng).unwrap_or(&0);
    let mut to = (from + chars).min(text.len());
    while !text.is_char_boundary(to) {
        to -= 1;
    }
    let cut = &text[from..to];
    // End on a line where the last quarter has one.
    match cut.rfind('\n') {
        Some(i) if i > chars * 3 / 4 => cut[..i].to_string(),
        _ => cut.to_string(),
    }
}

/// The body of one request of `workload` (`model`, at most `output_len`
/// tokens, greedy), and the path it goes to.
pub fn request(
    workload: Workload,
    model: &str,
    input_len: usize,
    output_len: usize,
    passages: &str,
    rng: &mut impl Rng,
) -> (&'static str, Value) {
    let user = match workload {
        Workload::Random => {
            let ids: Vec<u32> = (0..input_len).map(|_| rng.random_range(1000..30000)).collect();
            let body = json!({
                "model": model, "prompt": ids, "max_tokens": output_len, "temperature": 0,
                "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true},
            });
            return ("/v1/completions", body);
        }
        Workload::Lookup => {
            let p = passage(passages, input_len * CHARS_PER_TOKEN, rng);
            if rng.random_bool(0.5) {
                format!("Repeat the following text exactly, word for word.\n\n{p}")
            } else {
                let words: Vec<&str> = p.split_whitespace().filter(|w| w.len() > 4).collect();
                let w = words.choose(rng).copied().unwrap_or("the");
                format!(
                    "Rewrite the following text, replacing every \"{w}\" with \"{}\" and changing nothing else.\n\n{p}",
                    w.to_uppercase()
                )
            }
        }
        Workload::Chat => {
            let (a, t) = (
                ASKS.choose(rng).unwrap_or(&ASKS[0]),
                TOPICS.choose(rng).unwrap_or(&TOPICS[0]),
            );
            format!("{a} {t}.")
        }
    };
    let body = json!({
        "model": model, "messages": [{"role": "user", "content": user}], "max_tokens": output_len,
        "temperature": 0, "stream": true, "stream_options": {"include_usage": true},
    });
    ("/v1/chat/completions", body)
}

/// The text of one streamed chunk of either endpoint.
pub fn chunk_text(v: &Value) -> &str {
    let c = v["choices"].get(0);
    c.and_then(|c| c["text"].as_str())
        .or_else(|| c.and_then(|c| c["delta"]["content"].as_str()))
        .unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn passages_are_about_the_asked_length_and_from_the_text() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for chars in [40, 400, 4000] {
            let p = passage(DEFAULT_PASSAGES, chars, &mut rng);
            assert!(
                p.len() <= chars && p.len() > chars * 3 / 4 - 1,
                "{} for {chars}",
                p.len()
            );
            assert!(DEFAULT_PASSAGES.contains(&p));
        }
        // A text shorter than asked is taken whole.
        assert_eq!(passage("one\ntwo", 100, &mut rng), "one\ntwo");
    }

    #[test]
    fn each_workload_builds_its_request() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let (path, b) = request(Workload::Random, "m", 5, 3, "", &mut rng);
        assert_eq!(
            (path, b["prompt"].as_array().map(Vec::len)),
            ("/v1/completions", Some(5))
        );
        assert_eq!(b["ignore_eos"], true);
        let (path, b) = request(Workload::Lookup, "m", 50, 3, DEFAULT_PASSAGES, &mut rng);
        assert_eq!(path, "/v1/chat/completions");
        let text = b["messages"][0]["content"].as_str().unwrap();
        assert!(text.len() > 150 && text.contains("\n\n"), "{text}");
        let (_, b) = request(Workload::Chat, "m", 50, 3, "", &mut rng);
        assert!(b["messages"][0]["content"].as_str().unwrap().ends_with('.'));
        assert_eq!(chunk_text(&json!({"choices": [{"delta": {"content": "x"}}]})), "x");
        assert_eq!(chunk_text(&json!({"choices": [{"text": "y"}]})), "y");
        assert_eq!(chunk_text(&json!({"choices": []})), "");
    }
}
