//! Sampling: greedy, temperature, top-k, top-p, min-p, repetition / presence /
//! frequency penalties, per-request seeds, and top-n logprobs, on one logits row.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub mod constraint;
mod params;
pub mod rejection;

pub use params::{DEFAULT_MAX_TOKENS, SamplingOverrides, SamplingParams};

/// A parameter out of range: the field (as a request body names it) and what was wrong.
#[derive(Debug, thiserror::Error)]
#[error("invalid sampling parameter: {1}")]
pub struct InvalidParams(pub &'static str, pub String);

/// Most stop strings a request may give (`stop`): each generated token is
/// searched for every one of them, on the engine thread.
pub const MAX_STOP_STRINGS: usize = 64;
/// Longest stop string, in bytes.
pub const MAX_STOP_STRING_BYTES: usize = 1024;
/// Most stop token ids a request may give (`stop_token_ids`).
pub const MAX_STOP_TOKEN_IDS: usize = 1024;

impl SamplingParams {
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    pub fn validate(&self) -> Result<(), InvalidParams> {
        let bad = |field: &'static str, m: String| Err(InvalidParams(field, m));
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return bad(
                "temperature",
                format!("temperature must be >= 0, got {}", self.temperature),
            );
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return bad(
                "repetition_penalty",
                format!("repetition_penalty must be > 0, got {}", self.repetition_penalty),
            );
        }
        for (n, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                return bad(n, format!("{n} must be in [-2, 2], got {v}"));
            }
        }
        if self.max_tokens == Some(0) {
            return bad("max_tokens", "max_tokens must be at least 1".into());
        }
        if self.logprobs.is_some_and(|n| n > 20) {
            return bad("logprobs", "logprobs must be at most 20".into());
        }
        if self.stop.iter().any(|s| s.is_empty()) {
            return bad("stop", "stop strings must not be empty".into());
        }
        if self.stop.len() > MAX_STOP_STRINGS {
            return bad(
                "stop",
                format!("stop takes at most {MAX_STOP_STRINGS} strings, got {}", self.stop.len()),
            );
        }
        if let Some(s) = self.stop.iter().find(|s| s.len() > MAX_STOP_STRING_BYTES) {
            return bad(
                "stop",
                format!(
                    "a stop string may be at most {MAX_STOP_STRING_BYTES} bytes, got one of {}",
                    s.len()
                ),
            );
        }
        if self.stop_token_ids.len() > MAX_STOP_TOKEN_IDS {
            return bad(
                "stop_token_ids",
                format!(
                    "stop_token_ids takes at most {MAX_STOP_TOKEN_IDS} ids, got {}",
                    self.stop_token_ids.len()
                ),
            );
        }
        Ok(())
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Whether speculative decoding may draft for this request: greedy or
    /// plain sampling (temperature, top-k/p, min-p); not with logprobs or
    /// penalties, whose every row depends on the tokens accepted before it.
    pub fn speculates(&self) -> bool {
        self.logprobs.is_none()
            && self.repetition_penalty == 1.0
            && self.presence_penalty == 0.0
            && self.frequency_penalty == 0.0
    }

    /// Whether the logits row must come to the CPU (anything but argmax; a
    /// greedy structured-output request takes a masked argmax on the device).
    pub fn needs_logits(&self) -> bool {
        !self.is_greedy()
            || self.logprobs.is_some()
            || self.repetition_penalty != 1.0
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
    }

    /// The request's random generator.
    pub fn rng(&self) -> StdRng {
        self.rng_at(0)
    }

    /// The random generator of the `i`-th sequence of a request of `n`: its
    /// seed plus `i` (vLLM's and wllm's way of giving `n` choices their own draws).
    pub fn rng_at(&self, i: u64) -> StdRng {
        match self.seed {
            Some(s) => StdRng::seed_from_u64(s.wrapping_add(i)),
            None => StdRng::from_rng(&mut rand::rng()),
        }
    }
}

/// A token with its log-probability.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TokenLogprob {
    pub token_id: u32,
    pub logprob: f32,
}

/// The chosen token, its logprob and the top-n alternatives.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SampledLogprobs {
    pub chosen: TokenLogprob,
    pub top: Vec<TokenLogprob>,
}

/// Applies the penalties in place. `context` is prompt + output, `output` the generated part.
pub fn apply_penalties(logits: &mut [f32], p: &SamplingParams, context: &[u32], output: &[u32]) {
    if p.repetition_penalty != 1.0 {
        let mut seen = vec![false; logits.len()];
        for &t in context {
            if let Some(s) = seen.get_mut(t as usize)
                && !*s
            {
                *s = true;
                let l = &mut logits[t as usize];
                *l = if *l > 0.0 {
                    *l / p.repetition_penalty
                } else {
                    *l * p.repetition_penalty
                };
            }
        }
    }
    if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
        let mut counts = std::collections::HashMap::<u32, u32>::new();
        for &t in output {
            *counts.entry(t).or_default() += 1;
        }
        for (t, c) in counts {
            if let Some(l) = logits.get_mut(t as usize) {
                *l -= p.presence_penalty + p.frequency_penalty * c as f32;
            }
        }
    }
}

fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] || v[best].is_nan() {
            best = i;
        }
    }
    best
}

/// Log-softmax of a row, in f64 for accuracy.
fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = m + logits.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln();
    logits.iter().map(|&x| (x as f64 - lse) as f32).collect()
}

/// Chooses the next token from a raw logits row.
pub fn sample(
    raw: &[f32],
    p: &SamplingParams,
    context: &[u32],
    output: &[u32],
    rng: &mut StdRng,
) -> (u32, Option<SampledLogprobs>) {
    let mut logits = raw.to_vec();
    apply_penalties(&mut logits, p, context, output);
    let token = if p.is_greedy() {
        argmax(&logits)
    } else {
        sample_filtered(&logits, p, rng)
    };
    let lp = p.logprobs.map(|n| {
        let ls = log_softmax(raw);
        let mut order: Vec<usize> = (0..ls.len()).collect();
        let n = n.min(ls.len());
        if n > 0 {
            order.select_nth_unstable_by(n - 1, |&a, &b| ls[b].total_cmp(&ls[a]).then(a.cmp(&b)));
        }
        let mut top: Vec<usize> = order[..n].to_vec();
        top.sort_by(|&a, &b| ls[b].total_cmp(&ls[a]).then(a.cmp(&b)));
        SampledLogprobs {
            chosen: TokenLogprob {
                token_id: token as u32,
                logprob: ls[token],
            },
            top: top
                .into_iter()
                .map(|i| TokenLogprob {
                    token_id: i as u32,
                    logprob: ls[i],
                })
                .collect(),
        }
    });
    (token as u32, lp)
}

/// The distribution a sampled request draws from: temperature, then top-k,
/// top-p and min-p filtering of `logits` (penalties already applied), as
/// token ids in order of falling probability and their probabilities
/// (summing to 1).
pub fn filtered_probs(logits: &[f32], p: &SamplingParams) -> (Vec<usize>, Vec<f64>) {
    let t = p.temperature as f64;
    let mut idx: Vec<usize> = (0..logits.len()).filter(|&i| !logits[i].is_nan()).collect();
    idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    if p.top_k > 0 {
        idx.truncate(p.top_k);
    }
    let Some(&top) = idx.first() else {
        // Every logit NaN: token 0, as argmax gives.
        return (vec![0], vec![1.0]);
    };
    let m = logits[top] as f64;
    let mut probs: Vec<f64> = idx.iter().map(|&i| ((logits[i] as f64 - m) / t).exp()).collect();
    let total: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|q| *q /= total);
    // top-p: keep the smallest prefix whose mass reaches top_p (at least one token).
    if p.top_p < 1.0 {
        let mut acc = 0.0;
        let mut keep = probs.len();
        for (i, q) in probs.iter().enumerate() {
            acc += q;
            if acc >= p.top_p as f64 {
                keep = i + 1;
                break;
            }
        }
        probs.truncate(keep);
    }
    // min-p: drop tokens below min_p × the top probability.
    if p.min_p > 0.0 {
        let floor = probs[0] * p.min_p as f64;
        let keep = probs.iter().take_while(|&&q| q >= floor).count().max(1);
        probs.truncate(keep);
    }
    idx.truncate(probs.len());
    let total: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|q| *q /= total);
    (idx, probs)
}

/// A draw from `probs` (summing to 1 up to rounding): the index into it.
pub fn draw(probs: &[f64], rng: &mut StdRng) -> usize {
    let mut r = rng.random::<f64>() * probs.iter().sum::<f64>();
    for (i, q) in probs.iter().enumerate() {
        r -= q;
        if r < 0.0 {
            return i;
        }
    }
    probs.len().saturating_sub(1)
}

/// Temperature, then top-k, top-p and min-p filtering, then a draw.
fn sample_filtered(logits: &[f32], p: &SamplingParams, rng: &mut StdRng) -> usize {
    let (idx, probs) = filtered_probs(logits, p);
    idx[draw(&probs, rng)]
}
