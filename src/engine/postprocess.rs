//! Postprocessing of one sampled token: append it, apply the stop conditions
//! (EOS, stop token ids, stop strings through the sequence's `StopChecker`,
//! max_tokens, the context), cut the text delta, and the per-request metrics.

use std::time::Instant;

use super::output::{RequestMetrics, RequestOutput};
use super::sequence::{FinishReason, SeqStatus, Sequence};
use crate::sampling::SampledLogprobs;
use crate::tokenizer::Tokenizer;

pub(super) fn request_metrics(seq: &Sequence, now: Instant) -> RequestMetrics {
    let t = &seq.times;
    let secs = |a: Option<Instant>, b: Option<Instant>| match (a, b) {
        (Some(a), Some(b)) => (b - a).as_secs_f64(),
        _ => 0.0,
    };
    RequestMetrics {
        queue_time: secs(Some(t.arrival), t.scheduled),
        time_to_first_token: secs(Some(t.arrival), t.first_token),
        prefill_time: secs(t.scheduled, t.first_token),
        decode_time: secs(t.first_token, t.last_token),
        e2e_latency: (t.finished.unwrap_or(now) - t.arrival).as_secs_f64(),
        num_prompt_tokens: seq.prompt_len,
        num_output_tokens: seq.num_tokens() - seq.prompt_len,
        num_cached_tokens: seq.num_cached_tokens,
        num_preemptions: seq.num_preemptions,
    }
}

/// Appends a sampled token, applies the stop conditions, and cuts the next text delta.
pub(super) fn postprocess_token(
    seq: &mut Sequence,
    tok: u32,
    lp: Option<SampledLogprobs>,
    tokenizer: &Tokenizer,
    constraint_done: bool,
) -> RequestOutput {
    seq.token_ids.push(tok);
    if let Some(l) = lp.clone() {
        seq.logprobs.push(l);
    }
    let p = &seq.params;
    let mut finish = None;
    let stop_token = (!p.ignore_eos && tokenizer.eos_ids.contains(&tok)) || p.stop_token_ids.contains(&tok);
    // A stop token's text is never shown (so never decoded); any other token's
    // text may complete a stop string.
    if stop_token || seq.stop.push(&p.stop, &seq.detok.step(tokenizer, &seq.token_ids)) || constraint_done {
        finish = Some(FinishReason::Stop);
    }
    let n_out = seq.num_tokens() - seq.prompt_len;
    if finish.is_none() && (p.max_tokens.is_some_and(|m| n_out >= m) || seq.num_tokens() >= seq.max_total_tokens) {
        finish = Some(FinishReason::Length);
    }
    let text = seq.stop.take_delta(finish.is_some());
    if let Some(f) = finish {
        seq.status = SeqStatus::Finished(f);
    }
    RequestOutput {
        id: seq.id,
        text,
        token_ids: vec![tok],
        logprobs: lp.into_iter().collect(),
        finish_reason: finish,
        num_prompt_tokens: seq.prompt_len,
        metrics: None,
        embedding: None,
    }
}
