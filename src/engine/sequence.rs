//! A request as the engine tracks it: its tokens, how many are in the KV cache
//! (`num_computed_tokens`), its block table, sampling state and timings.

use std::sync::Arc;
use std::time::Instant;

use rand::rngs::StdRng;

use super::block_manager::BlockTable;
use crate::sampling::{SampledLogprobs, SamplingParams};
use crate::tokenizer::IncrementalDecoder;

pub type SeqId = u64;

/// Why a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// EOS, a stop token or a stop string.
    Stop,
    /// max_tokens or the context length.
    Length,
    /// Aborted by the caller (or its stream dropped).
    Abort,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Abort => "abort",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeqStatus {
    Waiting,
    Running,
    Finished(FinishReason),
}

/// Monotonic timestamps of a request's life.
#[derive(Clone, Copy, Debug)]
pub struct SeqTimes {
    pub arrival: Instant,
    /// First admitted into a step.
    pub scheduled: Option<Instant>,
    pub first_token: Option<Instant>,
    pub last_token: Option<Instant>,
    pub finished: Option<Instant>,
}

/// One request.
pub struct Sequence {
    pub id: SeqId,
    /// The client request the sequence belongs to (prompts × n of one HTTP
    /// request share it; the scheduler admits groups in turn). Its own id by default.
    pub group: SeqId,
    /// Prompt followed by generated tokens.
    pub token_ids: Vec<u32>,
    pub prompt_len: usize,
    /// Tokens whose KV is in the cache.
    pub num_computed_tokens: usize,
    /// Prompt tokens found in the prefix cache at the last admission.
    pub num_cached_tokens: usize,
    pub block_table: BlockTable,
    /// Shared by the request's sequences (never cloned per sequence).
    pub params: Arc<SamplingParams>,
    /// Generation stops when the sequence reaches this many tokens.
    pub max_total_tokens: usize,
    pub status: SeqStatus,
    pub rng: StdRng,
    pub detok: IncrementalDecoder,
    /// Generated text so far (stop strings cut off) and what was streamed of it.
    pub stop: super::StopChecker,
    pub times: SeqTimes,
    pub num_preemptions: usize,
    pub logprobs: Vec<SampledLogprobs>,
    /// Structured output: the matcher of the request's constraint, advanced by
    /// every sampled token (survives preemption: the recompute replays the
    /// same tokens, which the matcher has already consumed).
    pub matcher: Option<Box<llguidance::Matcher>>,
    /// Draft tokens at the end of `token_ids` this step verifies
    /// (`engine::speculative`); 0 outside a speculative step.
    pub num_draft: usize,
    /// How many tokens it drafts next, and its back-off after rejected drafts.
    pub spec: SpecState,
    /// How it speculates (the engine's settings under the request's own,
    /// `RequestSpeculation::resolve`); `None`: it does not.
    pub spec_cfg: Option<crate::config::SpeculativeConfig>,
    /// An embedding request's pooling (`params.embed`): it computes its
    /// prompt and finishes with the pooled vector, sampling nothing.
    pub pooler: Option<Box<super::embedding::Pooler>>,
}

/// A sequence's drafting state: the draft length adapts to what the model
/// accepts (the accepted count plus one, doubling after a draft accepted
/// whole, within `num_speculative_tokens`), and a sequence whose drafts keep
/// failing stops drafting for 2, 4, … up to 32 steps (free text, where
/// lookup rarely guesses, then costs next to nothing). It also keeps the
/// share of drafted positions the model confirmed (decaying counts), which
/// prices a draft against the step's cost (`SpecState::worth`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SpecState {
    /// Tokens to draft next (0: not yet set, `num_speculative_tokens`).
    pub k: usize,
    /// Steps left without drafting.
    pub skip: usize,
    /// Drafts in a row of which none was accepted.
    pub misses: u32,
    /// Drafted positions accepted and tried (a rejected one ends a draft),
    /// older drafts decaying.
    pub accepted: f64,
    pub tried: f64,
}

/// How fast `SpecState`'s counts forget.
const RATE_DECAY: f64 = 0.8;
/// How much more than its cost a draft's expected acceptance must be: the
/// step cost's linear fit leans on prefill chunks, cheaper a token than
/// decode rows on CPU adapters (chat at 16 streams on lavapipe lost 5 %
/// without it).
const COST_MARGIN: f64 = 1.25;
/// The acceptance rate assumed before a sequence's first draft is verified.
pub const PRIOR_RATE: f64 = 0.7;

impl SpecState {
    /// After a draft of `drafted` tokens of which `accepted` were accepted.
    pub fn update(&mut self, drafted: usize, accepted: usize, max_k: usize) {
        let k = if accepted == drafted {
            (drafted * 2).max(1)
        } else {
            accepted + 1
        };
        self.k = k.clamp(1, max_k.max(1));
        if accepted == 0 {
            self.misses += 1;
            self.skip = 1 << self.misses.min(5);
        } else {
            self.misses = 0;
            self.skip = 0;
        }
        let tried = accepted + usize::from(accepted < drafted);
        self.accepted = self.accepted * RATE_DECAY + accepted as f64;
        self.tried = self.tried * RATE_DECAY + tried as f64;
    }

    /// The chance that a drafted position is accepted, from this sequence's
    /// drafts so far (`PRIOR_RATE` before any).
    pub fn rate(&self) -> f64 {
        (self.accepted + 2.0 * PRIOR_RATE) / (self.tried + 2.0)
    }

    /// The most drafts (up to `k`) worth their rows in a step where one more
    /// row costs `row_cost` times what a token the plain step emits costs:
    /// the i-th draft is accepted with probability rate^i and is worth its
    /// row while that exceeds `row_cost` with a margin (`COST_MARGIN`; 0:
    /// rows are free, all `k`).
    pub fn worth(&self, k: usize, row_cost: f64) -> usize {
        let rate = self.rate();
        let (mut n, mut q) = (0, rate);
        while n < k && q > row_cost * COST_MARGIN {
            n += 1;
            q *= rate;
        }
        n
    }
}

impl Sequence {
    pub fn new(id: SeqId, prompt: Vec<u32>, params: impl Into<Arc<SamplingParams>>, max_total_tokens: usize) -> Self {
        Self::seeded(id, prompt, params.into(), 0, max_total_tokens)
    }

    /// As `new`, its random generator seeded with the request's seed plus
    /// `seed_offset` (the i-th of a request's `n` sequences, which share one
    /// `SamplingParams`).
    pub fn seeded(
        id: SeqId,
        prompt: Vec<u32>,
        params: Arc<SamplingParams>,
        seed_offset: u64,
        max_total_tokens: usize,
    ) -> Self {
        let prompt_len = prompt.len();
        let pooler = params.embed.map(|e| Box::new(super::embedding::Pooler::new(e)));
        Self {
            id,
            group: id,
            token_ids: prompt,
            prompt_len,
            num_computed_tokens: 0,
            num_cached_tokens: 0,
            block_table: BlockTable::default(),
            rng: params.rng_at(seed_offset),
            stop: super::StopChecker::new(&params.stop),
            params,
            max_total_tokens,
            status: SeqStatus::Waiting,
            detok: IncrementalDecoder::new(prompt_len),
            times: SeqTimes {
                arrival: Instant::now(),
                scheduled: None,
                first_token: None,
                last_token: None,
                finished: None,
            },
            num_preemptions: 0,
            matcher: None,
            logprobs: Vec::new(),
            num_draft: 0,
            spec: Default::default(),
            spec_cfg: None,
            pooler,
        }
    }

    pub fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }

    pub fn output_ids(&self) -> &[u32] {
        &self.token_ids[self.prompt_len..]
    }

    pub fn is_finished(&self) -> bool {
        matches!(self.status, SeqStatus::Finished(_))
    }
}
