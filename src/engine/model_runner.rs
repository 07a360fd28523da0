//! ModelRunner: flattens one scheduled step into varlen arrays, uploads them,
//! records the whole forward as one step of the backend (one submission on
//! wgpu, one stream on cuda), and reads back only the sampled token ids (and
//! the logit rows that CPU sampling needs). `StepRunner` hides the backend from
//! the engine.

use super::{FREED, KvCache, StepBuffers};
use crate::backend::{Backend, WeightInfo};
use crate::model::decoder::{DecoderModel, Forward, LayerKv};
use crate::model::{ModelConfig, ModelError, backend_err};

/// One sequence's share of a step.
#[derive(Clone, Debug)]
pub struct SeqChunk<'a> {
    /// Every token of the sequence known so far (prompt + output).
    pub token_ids: &'a [u32],
    /// Tokens already in the KV cache: this step computes `start..start + len`.
    pub start: usize,
    pub len: usize,
    /// Each KV group's physical block of each logical block (covers `start +
    /// len` tokens; `FREED` where a windowed group released it).
    pub block_tables: &'a [Vec<u32>],
    /// Whether the last token of this chunk yields a next token.
    pub sample: bool,
    /// Every token of the chunk at or past this position yields a logits row
    /// (scoring, e.g. perplexity) instead of the last one only.
    pub logits_from: Option<usize>,
    /// Every token of the chunk's final-normed hidden state comes back
    /// (`StepResult::hidden`; embeddings).
    pub hidden: bool,
}

/// What a step returns, one entry per sampling sequence in batch order.
#[derive(Clone, Debug, Default)]
pub struct StepResult {
    /// Greedy (argmax) token of each sampling row.
    pub argmax: Vec<u32>,
    /// `rows x vocab` logits when asked for.
    pub logits: Option<Vec<f32>>,
    /// Where a chunk asked for them: the final-normed hidden state of every
    /// token of the step (`tokens x hidden`, chunks in batch order).
    pub hidden: Option<Vec<f32>>,
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
    /// Bytes of the weights on the device (with rope tables).
    fn weight_bytes(&self) -> u64;
    /// Bytes of the KV pool on the device.
    fn kv_bytes(&self) -> u64;
    fn config(&self) -> &ModelConfig;
    /// Pipelines compiled on the device so far.
    fn pipeline_stats(&self) -> crate::gpu::PipelineStats;
    /// The row-tile caps worth timing for the model's layer gemms (`Backend::row_tile_caps`).
    fn row_tile_caps(&self) -> Vec<u32>;
    /// Caps the row tile of batched gemms (`Backend::set_row_tile_cap`).
    fn set_row_tile_cap(&self, cap: u32);
    /// The row-tile cap in force (`Backend::row_tile_cap`).
    fn row_tile_cap(&self) -> u32;
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
    fn weight_bytes(&self) -> u64 {
        self.model.weight_bytes
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
    fn row_tile_cap(&self) -> u32 {
        self.kernels.row_tile_cap()
    }
}

impl<B: Backend> ModelRunner<B> {
    /// A runner over `kv` (`KvCache::new` on the same backend) for steps of up to
    /// `max_tokens` tokens in `max_seqs` sequences of up to `max_model_len`.
    pub fn new(
        kernels: B,
        model: DecoderModel<B>,
        kv: KvCache<B>,
        max_tokens: usize,
        max_seqs: usize,
        max_model_len: usize,
    ) -> Result<Self, ModelError> {
        let max_blocks = max_model_len.div_ceil(kv.block_size);
        let bufs = StepBuffers::new(&kernels, &model.cfg, max_tokens, max_seqs, max_blocks, kv.groups.len())?;
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
        let want_hidden = batch.iter().any(|c| c.hidden);
        if want_hidden {
            let t: usize = batch.iter().map(|c| c.len).sum();
            reads.push((&b.act.x, (t * self.model.cfg.hidden * 4) as u64));
        }
        if want_logits && n_rows > 0 {
            reads.push((&b.act.logits, (n_rows * vocab * 4) as u64));
        }
        let mut out = ks.finish(enc, &reads).map_err(backend_err)?;
        let logits =
            (out.len() > 1 + usize::from(want_hidden)).then(|| bytemuck::pod_collect_to_vec(&out.pop().expect("read")));
        let hidden = want_hidden.then(|| bytemuck::pod_collect_to_vec(&out.remove(1)));
        let mut argmax: Vec<u32> = bytemuck::pod_collect_to_vec(&out.remove(0));
        argmax.truncate(n_rows);
        Ok(StepResult { argmax, logits, hidden })
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
        let groups = self.kv.groups.len();
        let mut ids = Vec::with_capacity(t);
        let mut positions = Vec::with_capacity(t);
        let mut token_seq = Vec::with_capacity(t);
        let mut slots = vec![Vec::with_capacity(t); groups];
        let mut tables = vec![vec![0u32; batch.len() * b.max_blocks]; groups];
        // Per group: one past the highest block the step's tables name.
        let mut top_block = vec![0usize; groups];
        let mut rows = Vec::new();
        for (s, c) in batch.iter().enumerate() {
            let end = c.start + c.len;
            let logical = c.block_tables.first().map_or(0, Vec::len);
            if c.block_tables.len() != groups
                || c.block_tables.iter().any(|g| g.len() != logical)
                || end > c.token_ids.len()
                || end.div_ceil(bs) > logical
                || logical > b.max_blocks
            {
                return Err(ModelError::Config(format!(
                    "sequence {s}: chunk {}..{end} of {} tokens does not fit its {} blocks in {} of {groups} KV groups",
                    c.start,
                    c.token_ids.len(),
                    logical,
                    c.block_tables.len()
                )));
            }
            for p in c.start..end {
                ids.push(c.token_ids[p]);
                positions.push(p as u32);
                token_seq.push(s as u32);
            }
            for (g, table) in c.block_tables.iter().enumerate() {
                for p in c.start..end {
                    let blk = table[p / bs];
                    if blk == FREED {
                        return Err(ModelError::Config(format!(
                            "sequence {s}: token {p}'s block of KV group {g} was released"
                        )));
                    }
                    slots[g].push(blk * bs as u32 + (p % bs) as u32);
                }
                // The device reads block 0 in place of a released one (its keys are masked).
                let row = &mut tables[g][s * b.max_blocks..s * b.max_blocks + table.len()];
                for (dst, &blk) in row.iter_mut().zip(table) {
                    if blk != FREED {
                        *dst = blk;
                        top_block[g] = top_block[g].max(blk as usize + 1);
                    }
                }
            }
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
        for g in 0..groups {
            ks.write(&b.slot_mapping[g], bytemuck::cast_slice(&slots[g]))
                .map_err(backend_err)?;
            ks.write(&b.block_tables[g], bytemuck::cast_slice(&tables[g]))
                .map_err(backend_err)?;
        }
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
        // The pool prefix each group's step touches, rounded up to a power of
        // two of blocks so that its bindings change only when the prefix doubles.
        let kv_rows: Vec<u32> = top_block
            .iter()
            .map(|&top| (top.max(1).next_power_of_two().min(self.kv.num_blocks) * bs) as u32)
            .collect();
        let layer_kv: Vec<LayerKv<B>> = self
            .kv
            .groups
            .layer_slot
            .iter()
            .map(|&(g, slot)| LayerKv {
                k: &self.kv.k[slot],
                v: &self.kv.v[slot],
                dtype: self.kv.dtype,
                slot_mapping: &b.slot_mapping[g],
                block_tables: &b.block_tables[g],
                kv_rows: kv_rows[g],
            })
            .collect();
        let max_query_len = batch.iter().map(|c| c.len).max().unwrap_or(1) as u32;
        let forward = Forward {
            input_ids: &b.input_ids,
            positions: &b.positions,
            token_seq: &b.token_seq,
            max_blocks: b.max_blocks as u32,
            logits_rows: &b.logits_rows,
            kv: &layer_kv,
            block_size: bs as u32,
            max_query_len,
            act: &b.act,
            all_hidden: batch.iter().any(|c| c.hidden),
        };
        let mut enc = ks.begin();
        self.model
            .encode_forward(ks, &mut enc, &forward, t as u32, rows.len() as u32)
            .map_err(backend_err)?;
        Ok((enc, rows.len(), n_rows))
    }
}
