//! What the engine gives back for a request: incremental outputs and, with
//! the last one, the request's timings.

use super::sequence::{FinishReason, SeqId};
use crate::sampling::SampledLogprobs;

/// Per-request timings, in seconds, given with the last output.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct RequestMetrics {
    pub queue_time: f64,
    pub time_to_first_token: f64,
    pub prefill_time: f64,
    pub decode_time: f64,
    pub e2e_latency: f64,
    pub num_prompt_tokens: usize,
    pub num_output_tokens: usize,
    pub num_cached_tokens: usize,
    pub num_preemptions: usize,
}

/// One incremental output of a request.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct RequestOutput {
    pub id: SeqId,
    /// New text since the previous output (never half a character or half a stop string).
    pub text: String,
    /// New token ids since the previous output.
    pub token_ids: Vec<u32>,
    /// One entry per new token when logprobs were asked for.
    pub logprobs: Vec<SampledLogprobs>,
    pub finish_reason: Option<FinishReason>,
    pub num_prompt_tokens: usize,
    /// Set on the last output.
    pub metrics: Option<RequestMetrics>,
    /// An embedding request's vector (its only output).
    pub embedding: Option<Vec<f32>>,
}
