//! `StepBuffers`: the device buffers one step fills from the scheduler's plan
//! (token ids, positions, the sequence of each token, rows to sample, and each
//! KV group's slots and block tables) and the model's activation buffers, sized once for the
//! step's token and sequence budget. The model runner owns them.

use crate::backend::Backend;
use crate::model::decoder::Activations;
use crate::model::{ModelConfig, ModelError, backend_err};

/// The per-step arrays and activations of the forward pass.
pub struct StepBuffers<B: Backend> {
    pub max_tokens: usize,
    pub max_seqs: usize,
    pub max_blocks: usize,
    // input_ids, positions, token_seq: (max_tokens) u32
    pub input_ids: B::Buffer,
    pub positions: B::Buffer,
    pub token_seq: B::Buffer,
    // per KV group: slot_mapping (max_tokens) u32, block_tables (max_seqs, max_blocks) u32
    pub slot_mapping: Vec<B::Buffer>,
    pub block_tables: Vec<B::Buffer>,
    // logits_rows: (max_seqs) u32
    pub logits_rows: B::Buffer,
    // Greedy structured output: mask: (max_seqs, vocab / 32) u32; mask_rows,
    // masked: (max_seqs) u32 (the logits row of each mask and its pick).
    pub mask: B::Buffer,
    pub mask_rows: B::Buffer,
    pub masked: B::Buffer,
    pub act: Activations<B>,
}

impl<B: Backend> StepBuffers<B> {
    pub fn new(
        ks: &B,
        cfg: &ModelConfig,
        max_tokens: usize,
        max_seqs: usize,
        max_blocks: usize,
        kv_groups: usize,
    ) -> Result<Self, ModelError> {
        let f = |n: usize| ks.zeros((n * 4) as u64).map_err(backend_err);
        let per_group = |n: usize| (0..kv_groups).map(|_| f(n)).collect::<Result<Vec<_>, _>>();
        Ok(Self {
            max_tokens,
            max_seqs,
            max_blocks,
            input_ids: f(max_tokens)?,
            positions: f(max_tokens)?,
            token_seq: f(max_tokens)?,
            slot_mapping: per_group(max_tokens)?,
            block_tables: per_group(max_seqs * max_blocks)?,
            logits_rows: f(max_seqs)?,
            mask: f(max_seqs * cfg.vocab.div_ceil(32))?,
            mask_rows: f(max_seqs)?,
            masked: f(max_seqs)?,
            act: Activations::new(ks, cfg, max_tokens, max_seqs).map_err(backend_err)?,
        })
    }

    /// Bytes of all step buffers.
    pub fn bytes(&self, ks: &B) -> u64 {
        let arrays: u64 = [
            &self.input_ids,
            &self.positions,
            &self.token_seq,
            &self.logits_rows,
            &self.mask,
            &self.mask_rows,
            &self.masked,
        ]
        .into_iter()
        .chain(&self.slot_mapping)
        .chain(&self.block_tables)
        .map(|b| ks.buffer_bytes(b))
        .sum();
        arrays + self.act.bytes(ks)
    }
}
