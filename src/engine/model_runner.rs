//! ModelRunner: flattens one scheduled step into varlen arrays, uploads them,
//! records the whole forward as one step of the backend (one submission on
//! wgpu, one stream on cuda), and reads back only the sampled token ids (and
//! the logit rows that CPU sampling needs). `StepRunner` hides the backend from
//! the engine.

use super::{KvCache, StepBuffers};
use crate::backend::{Backend, WeightInfo};
use crate::model::decoder::{DecoderModel, Forward};
use crate::model::{ModelConfig, ModelError, backend_err};

/// One sequence's share of a step.
#[derive(Clone, Debug)]
pub struct SeqChunk<'a> {
    /// Every token of the sequence known so far (prompt + output).
    pub token_ids: &'a [u32],
    /// Tokens already in the KV cache: this step computes `start..start + len`.
    pub start: usize,
    pub len: usize,
    /// Physical block of each logical block (covers `start + len` tokens).
    pub block_table: &'a [u32],
    /// Whether the last token of this chunk yields a next token.
    pub sample: bool,
    /// Every token of the chunk at or past this position yields a logits row
    /// (scoring, e.g. perplexity) instead of the last one only.
    pub logits_from: Option<usize>,
}

/// What a step returns, one entry per sampling sequence in batch order.
#[derive(Clone, Debug, Default)]
pub struct StepResult {
    /// Greedy (argmax) token of each sampling row.
    pub argmax: Vec<u32>,
    /// `rows x vocab` logits when asked for.
    pub logits: Option<Vec<f32>>,
}

/// What the engine needs of a model runner, whatever its backend.
pub trait StepRunner: Send {
    /// Computes the chunks of one step; `want_logits` also reads back the logits rows.
    fn execute(&self, batch: &[SeqChunk], want_logits: bool) -> Result<StepResult, ModelError>;
    /// Greedy picks under structured-output masks over the last step's logits,
    /// on the device: for each (logits row, mask of `vocab.div_ceil(32)` words),
    /// the allowed token of largest logit, `None` when none is allowed. Only
    /// the picks come back, never a logits row.
    fn masked_argmax(&self, picks: &[(usize, &[u32])]) -> Result<Vec<Option<u32>>, ModelError>;
    fn block_size(&self) -> usize;
    /// The device, in words.
    fn describe(&self) -> String;
    /// Bytes of weights and step buffers on the device.
    fn static_bytes(&self) -> u64;
    /// Bytes of the KV pool on the device.
    fn kv_bytes(&self) -> u64;
    fn config(&self) -> &ModelConfig;
    /// Pipelines compiled on the device so far.
    fn pipeline_stats(&self) -> crate::gpu::PipelineStats;
    /// The row-tile caps worth timing for the model's layer gemms (`Backend::row_tile_caps`).
    fn row_tile_caps(&self) -> Vec<u32>;
    /// Caps the row tile of batched gemms (`Backend::set_row_tile_cap`).
    fn set_row_tile_cap(&self, cap: u32);
}

/// Runs the model over the paged cache.
pub struct ModelRunner<B: Backend> {
    pub model: DecoderModel<B>,
    pub kernels: B,
    pub kv: KvCache<B>,
    pub bufs: StepBuffers<B>,
}

impl<B: Backend> StepRunner for ModelRunner<B> {
    fn execute(&self, batch: &[SeqChunk], want_logits: bool) -> Result<StepResult, ModelError> {
        ModelRunner::execute(self, batch, want_logits)
    }
    fn masked_argmax(&self, picks: &[(usize, &[u32])]) -> Result<Vec<Option<u32>>, ModelError> {
        ModelRunner::masked_argmax(self, picks)
    }
    fn block_size(&self) -> usize {
        self.kv.block_size
    }
    fn describe(&self) -> String {
        self.kernels.describe()
    }
    fn static_bytes(&self) -> u64 {
        self.model.weight_bytes + self.bufs.bytes(&self.kernels)
    }
    fn kv_bytes(&self) -> u64 {
        self.kv.bytes
    }
    fn config(&self) -> &ModelConfig {
        &self.model.cfg
    }
    fn pipeline_stats(&self) -> crate::gpu::PipelineStats {
        self.kernels.pipeline_stats()
    }
    fn row_tile_caps(&self) -> Vec<u32> {
        match self.model.layers.first() {
            Some(l) => self.kernels.row_tile_caps(l.down.format()),
            None => Vec::new(),
        }
    }
    fn set_row_tile_cap(&self, cap: u32) {
        self.kernels.set_row_tile_cap(cap);
    }
}

impl<B: Backend> ModelRunner<B> {
    pub fn new(
        kernels: B,
        model: DecoderModel<B>,
        num_blocks: usize,
        block_size: usize,
        max_tokens: usize,
        max_seqs: usize,
        max_model_len: usize,
    ) -> Result<Self, ModelError> {
        let kv = KvCache::new(&kernels, &model.cfg, num_blocks, block_size)?;
        let max_blocks = max_model_len.div_ceil(block_size);
        let bufs = StepBuffers::new(&kernels, &model.cfg, max_tokens, max_seqs, max_blocks)?;
        Ok(Self {
            model,
            kernels,
            kv,
            bufs,
        })
    }

    pub fn block_size(&self) -> usize {
        self.kv.block_size
    }

    /// Computes the chunks of one step; `want_logits` also reads back the logits rows.
    pub fn execute(&self, batch: &[SeqChunk], want_logits: bool) -> Result<StepResult, ModelError> {
        let (enc, rows, n_rows) = self.record(batch)?;
        let b = &self.bufs;
        let ks = &self.kernels;
        let vocab = self.model.cfg.vocab;
        let mut reads = vec![(&b.act.sampled, (rows * 4) as u64)];
        if want_logits && n_rows > 0 {
            reads.push((&b.act.logits, (n_rows * vocab * 4) as u64));
        }
        let mut out = ks.finish(enc, &reads).map_err(backend_err)?;
        let logits = (out.len() > 1).then(|| bytemuck::pod_collect_to_vec(&out.remove(1)));
        let mut argmax: Vec<u32> = bytemuck::pod_collect_to_vec(&out.remove(0));
        argmax.truncate(n_rows);
        Ok(StepResult { argmax, logits })
    }

    /// See `StepRunner::masked_argmax`.
    pub fn masked_argmax(&self, picks: &[(usize, &[u32])]) -> Result<Vec<Option<u32>>, ModelError> {
        if picks.is_empty() {
            return Ok(Vec::new());
        }
        let b = &self.bufs;
        let ks = &self.kernels;
        let vocab = self.model.cfg.vocab;
        let words = vocab.div_ceil(32);
        if picks.len() > b.max_seqs {
            return Err(ModelError::Config(format!(
                "{} masked picks; the runner holds {}",
                picks.len(),
                b.max_seqs
            )));
        }
        let mut mask = vec![0u32; picks.len() * words];
        let mut rows = Vec::with_capacity(picks.len());
        for (i, &(row, m)) in picks.iter().enumerate() {
            if row >= b.max_seqs {
                return Err(ModelError::Config(format!(
                    "logits row {row} is outside the step's rows"
                )));
            }
            rows.push(row as u32);
            // Bits past the vocabulary (a mask rounded up) are dropped.
            let n = m.len().min(words);
            mask[i * words..i * words + n].copy_from_slice(&m[..n]);
        }
        ks.write(&b.mask, bytemuck::cast_slice(&mask)).map_err(backend_err)?;
        ks.write(&b.mask_rows, bytemuck::cast_slice(&rows))
            .map_err(backend_err)?;
        let mut enc = ks.begin();
        let args = crate::backend::MaskedArgmax {
            x: &b.act.logits,
            n: vocab as u32,
            mask: &b.mask,
            words: words as u32,
            rows: &b.mask_rows,
            count: picks.len() as u32,
            out: &b.masked,
        };
        ks.masked_argmax(&mut enc, args).map_err(backend_err)?;
        let out = ks
            .finish(enc, &[(&b.masked, (picks.len() * 4) as u64)])
            .map_err(backend_err)?;
        let ids: Vec<u32> = bytemuck::pod_collect_to_vec(&out[0]);
        Ok(ids.into_iter().map(|t| (t != u32::MAX).then_some(t)).collect())
    }

    /// Uploads the step's arrays and records its forward pass without running
    /// it; returns the step, the rows the LM head computes and how many of
    /// them sample (`wllm profile` replays the recorded ops).
    pub fn record(&self, batch: &[SeqChunk]) -> Result<(B::Step, usize, usize), ModelError> {
        let b = &self.bufs;
        let bs = self.kv.block_size;
        let t: usize = batch.iter().map(|c| c.len).sum();
        if t == 0 || t > b.max_tokens || batch.len() > b.max_seqs {
            return Err(ModelError::Config(format!(
                "step of {t} tokens in {} sequences is outside the runner's capacity ({} tokens, {} sequences)",
                batch.len(),
                b.max_tokens,
                b.max_seqs
            )));
        }
        let mut ids = Vec::with_capacity(t);
        let mut positions = Vec::with_capacity(t);
        let mut token_seq = Vec::with_capacity(t);
        let mut slots = Vec::with_capacity(t);
        let mut tables = vec![0u32; batch.len() * b.max_blocks];
        let mut rows = Vec::new();
        for (s, c) in batch.iter().enumerate() {
            let end = c.start + c.len;
            if end > c.token_ids.len() || end.div_ceil(bs) > c.block_table.len() || c.block_table.len() > b.max_blocks {
                return Err(ModelError::Config(format!(
                    "sequence {s}: chunk {}..{end} of {} tokens does not fit its {} blocks",
                    c.start,
                    c.token_ids.len(),
                    c.block_table.len()
                )));
            }
            for p in c.start..end {
                ids.push(c.token_ids[p]);
                positions.push(p as u32);
                token_seq.push(s as u32);
                slots.push(c.block_table[p / bs] * bs as u32 + (p % bs) as u32);
            }
            tables[s * b.max_blocks..s * b.max_blocks + c.block_table.len()].copy_from_slice(c.block_table);
            if let Some(from) = c.logits_from {
                let first = ids.len() - c.len;
                rows.extend((c.start.max(from)..end).map(|p| (first + p - c.start) as u32));
            } else if c.sample {
                rows.push(ids.len() as u32 - 1);
            }
        }
        let ks = &self.kernels;
        ks.write(&b.input_ids, bytemuck::cast_slice(&ids))
            .map_err(backend_err)?;
        ks.write(&b.positions, bytemuck::cast_slice(&positions))
            .map_err(backend_err)?;
        ks.write(&b.token_seq, bytemuck::cast_slice(&token_seq))
            .map_err(backend_err)?;
        ks.write(&b.slot_mapping, bytemuck::cast_slice(&slots))
            .map_err(backend_err)?;
        ks.write(&b.block_tables, bytemuck::cast_slice(&tables))
            .map_err(backend_err)?;
        let n_rows = rows.len();
        if n_rows > b.max_seqs {
            return Err(ModelError::Config(format!(
                "step asks for {n_rows} logits rows; the runner holds {} (raise --max-num-seqs)",
                b.max_seqs
            )));
        }
        // A step with no sampling row still runs the LM head on one row (cheap) so
        // that the encoded pass is always the same shape.
        if rows.is_empty() {
            rows.push(t as u32 - 1);
        }
        ks.write(&b.logits_rows, bytemuck::cast_slice(&rows))
            .map_err(backend_err)?;
        // The pool prefix this step touches, rounded up to a power of two of
        // blocks so that its bindings change only when the prefix doubles.
        let top_block = batch
            .iter()
            .flat_map(|c| c.block_table)
            .max()
            .map_or(0, |&b| b as usize + 1);
        let kv_blocks = top_block.next_power_of_two().min(self.kv.num_blocks);
        let max_query_len = batch.iter().map(|c| c.len).max().unwrap_or(1) as u32;
        let forward = Forward {
            input_ids: &b.input_ids,
            positions: &b.positions,
            token_seq: &b.token_seq,
            slot_mapping: &b.slot_mapping,
            block_tables: &b.block_tables,
            max_blocks: b.max_blocks as u32,
            logits_rows: &b.logits_rows,
            k_cache: &self.kv.k,
            v_cache: &self.kv.v,
            block_size: bs as u32,
            kv_rows: (kv_blocks * bs) as u32,
            max_query_len,
            act: &b.act,
        };
        let mut enc = ks.begin();
        self.model
            .encode_forward(ks, &mut enc, &forward, t as u32, rows.len() as u32)
            .map_err(backend_err)?;
        Ok((enc, rows.len(), n_rows))
    }
}
