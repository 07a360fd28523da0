//! Draft-model drafting (vLLM's `draft_model` method, llama.cpp's
//! `--model-draft`): a smaller model of the same vocabulary, on the same
//! device with a KV pool of its own, proposes each speculating sequence's
//! next k tokens by greedy decoding before the target's step verifies them
//! (`speculative::draft`; a greedy draft is a deterministic one, so
//! rejection sampling keeps sampled output on the target's distribution).
//!
//! The draft's KV follows the sequence's tokens: before each draft, what it
//! computed past the longest prefix it shares with the sequence's tokens
//! (drafts the target rejected) is dropped, so rollback, preemption and
//! stops need no hook. A sequence the pool cannot hold (after the states of
//! sequences not drafting this step are dropped) drafts nothing that step;
//! finished sequences' blocks go back at the next draft.

use std::collections::HashMap;
use std::time::Instant;

use super::{
    BlockManager, BlockTable, EngineError, KvCache, KvGroups, KvPlan, ModelRunner, SeqChunk, SeqId, StepRunner,
};
use crate::backend::Backend;
use crate::config::KvDtype;
use crate::model::decoder::DecoderModel;
use crate::model::{ModelConfig, ModelFiles};
use crate::tokenizer::Tokenizer;

/// A sequence's KV in the draft's pool: its blocks and the tokens computed there.
struct DraftSeq {
    table: BlockTable,
    tokens: Vec<u32>,
}

/// What `propose` drafts for: a sequence's tokens (the last one pending,
/// not yet in the target's cache either) and the most tokens to draft.
pub struct DraftRequest<'a> {
    pub id: SeqId,
    pub tokens: &'a [u32],
    pub k: usize,
}

/// The draft model, its KV pool and the sequences' places in it.
pub struct DraftModel {
    runner: Box<dyn StepRunner>,
    blocks: BlockManager,
    seqs: HashMap<SeqId, DraftSeq>,
    max_tokens: usize,
    max_seqs: usize,
    /// The target's vocabulary: a draft token past it ends the draft.
    target_vocab: usize,
    /// The file's name.
    pub name: String,
    /// The draft's pool.
    pub plan: KvPlan,
    /// Bytes of its weights and step buffers on the device.
    pub static_bytes: u64,
    /// Draft forward passes run, and their seconds.
    pub passes: u64,
    pub seconds: f64,
    /// Milliseconds of one drafting round (one token for every drafting
    /// sequence), smoothed: what a drafted token costs.
    pub round_ms: Option<f64>,
}

/// Everything the engine needs to load a draft model beside its target.
pub struct DraftLoad<'a> {
    pub files: &'a ModelFiles,
    pub config: &'a ModelConfig,
    pub kv_bytes: u64,
    pub dtype: KvDtype,
    pub block_size: usize,
    pub max_tokens: usize,
    pub max_seqs: usize,
    pub max_model_len: usize,
    pub max_binding: u64,
}

impl DraftModel {
    /// Opens the draft model's files and its configuration, and checks that
    /// its tokenizer is the target's, token for token.
    pub fn open(path: &std::path::Path, target: &Tokenizer) -> Result<(ModelFiles, ModelConfig), EngineError> {
        let files = ModelFiles::open_with(path, None)?;
        let cfg = files.config()?;
        let tok = match &files {
            ModelFiles::Gguf { file, .. } => Tokenizer::from_gguf(file)?,
            ModelFiles::Hf { dir, .. } => Tokenizer::from_hf_dir(dir)?,
        };
        let refuse = |why: String| {
            Err(EngineError::Config(format!(
                "draft model {}: {why}; a draft model must share the target's vocabulary (e.g. a smaller model of \
                 the same family)",
                path.display()
            )))
        };
        if tok.vocab_size() != target.vocab_size() {
            return refuse(format!(
                "its tokenizer has {} tokens, the target's {}",
                tok.vocab_size(),
                target.vocab_size()
            ));
        }
        if let Some(i) = (0..tok.vocab_size() as u32).find(|&i| tok.id_to_token(i) != target.id_to_token(i)) {
            return refuse(format!(
                "token {i} is {:?} there and {:?} in the target",
                tok.id_to_token(i).unwrap_or_default(),
                target.id_to_token(i).unwrap_or_default()
            ));
        }
        Ok((files, cfg))
    }

    /// Loads the draft on `kernels` (a sibling of the target's backend) with
    /// a pool of `kv_bytes`.
    pub fn load<B: Backend>(kernels: B, l: &DraftLoad, target_vocab: usize, name: String) -> Result<Self, EngineError> {
        let groups = KvGroups::of(l.config, false);
        let plan = KvPlan::new(
            &groups,
            l.dtype,
            l.config.kv_bytes_per_token(l.dtype),
            l.block_size,
            l.max_tokens,
            Some(l.kv_bytes),
            l.max_binding,
            l.config.max_context,
            Some(l.max_model_len),
        )
        .map_err(|e| EngineError::Config(format!("draft model {name}: {e}")))?;
        let mut load_config = l.config.clone();
        load_config.max_context = load_config.max_context.min(plan.max_model_len.max(1));
        let model = DecoderModel::load(&kernels, l.files, &load_config)?;
        let kv = KvCache::new(
            &kernels,
            &model.cfg,
            groups.clone(),
            l.dtype,
            plan.num_blocks,
            plan.block_size,
        )?;
        let runner = ModelRunner::new(kernels, model, kv, l.max_tokens, l.max_seqs, plan.max_model_len)?;
        let static_bytes = runner.static_bytes();
        Ok(Self {
            runner: Box::new(runner),
            blocks: BlockManager::with_groups(plan.num_blocks, plan.block_size, false, groups.windows),
            seqs: HashMap::new(),
            max_tokens: l.max_tokens,
            max_seqs: l.max_seqs,
            target_vocab,
            name,
            plan,
            static_bytes,
            passes: 0,
            seconds: 0.0,
            round_ms: None,
        })
    }

    /// One line: the draft, its bytes and its pool.
    pub fn describe(&self) -> String {
        format!(
            "draft model {}: weights and step buffers {:.1} MiB, KV pool {:.1} MiB ({} tokens)",
            self.name,
            self.static_bytes as f64 / (1 << 20) as f64,
            self.kv_bytes() as f64 / (1 << 20) as f64,
            self.plan.num_blocks * self.plan.block_size
        )
    }

    /// Bytes of its weights and step buffers and of the pool's blocks in use.
    pub fn allocated_bytes(&self) -> u64 {
        let block = self.kv_bytes() / self.blocks.num_blocks().max(1) as u64;
        self.static_bytes + (self.blocks.num_blocks() - self.blocks.num_free_blocks()) as u64 * block
    }

    /// Bytes of the draft's KV pool.
    pub fn kv_bytes(&self) -> u64 {
        self.runner.kv_bytes()
    }

    /// Sequences with KV in the draft's pool.
    pub fn num_seqs(&self) -> usize {
        self.seqs.len()
    }

    /// Drops the state of every sequence `live` no longer knows, freeing its blocks.
    pub fn forget(&mut self, live: impl Fn(SeqId) -> bool) {
        let gone: Vec<SeqId> = self.seqs.keys().copied().filter(|&id| !live(id)).collect();
        for id in gone {
            self.drop_seq(id);
        }
    }

    fn drop_seq(&mut self, id: SeqId) {
        if let Some(mut s) = self.seqs.remove(&id) {
            self.blocks.deallocate(&mut s.table);
        }
    }

    /// Drafts up to `k` tokens for each request by greedy decoding: the
    /// draft catches up on the tokens it has not computed (the pending one
    /// last), then decodes one token a pass for every drafting sequence.
    /// Returns each request's drafts, in order (none where the pool or the
    /// draft's context could not hold it).
    pub fn propose(&mut self, reqs: &[DraftRequest]) -> Result<Vec<Vec<u32>>, EngineError> {
        let mut drafts: Vec<Vec<u32>> = vec![Vec::new(); reqs.len()];
        // Each request's place: its tokens kept (the longest shared prefix,
        // never the pending token) and blocks for the drafted positions.
        let mut go = vec![false; reqs.len()];
        for (i, r) in reqs.iter().enumerate() {
            let total = r.tokens.len() + r.k.saturating_sub(1);
            if r.k == 0 || r.tokens.is_empty() || total > self.plan.max_model_len {
                continue;
            }
            let s = self.seqs.entry(r.id).or_insert_with(|| DraftSeq {
                table: BlockTable::default(),
                tokens: Vec::new(),
            });
            let keep = s
                .tokens
                .iter()
                .zip(r.tokens)
                .take_while(|(a, b)| a == b)
                .count()
                .min(r.tokens.len() - 1);
            s.tokens.truncate(keep);
            self.blocks.truncate(&mut s.table, keep);
            if !self.blocks.can_append(&self.seqs[&r.id].table, total) {
                // Room from the sequences that do not draft this step.
                let idle: Vec<SeqId> = self
                    .seqs
                    .keys()
                    .copied()
                    .filter(|id| reqs.iter().all(|q| q.id != *id))
                    .collect();
                for id in idle {
                    self.drop_seq(id);
                }
            }
            let s = self.seqs.get_mut(&r.id).expect("inserted above");
            if self.blocks.can_append(&s.table, total) {
                self.blocks.may_append(&mut s.table, total);
                go[i] = true;
            }
        }
        // Catch up, in passes within the step buffers' tokens and rows.
        loop {
            let mut chunks: Vec<(usize, usize, usize)> = Vec::new(); // (request, start, len)
            let mut budget = self.max_tokens;
            for (i, r) in reqs.iter().enumerate() {
                if !go[i] || budget == 0 || chunks.len() == self.max_seqs {
                    continue;
                }
                let done = self.seqs[&r.id].tokens.len();
                if done == r.tokens.len() {
                    continue;
                }
                let len = (r.tokens.len() - done).min(budget);
                budget -= len;
                chunks.push((i, done, len));
            }
            if chunks.is_empty() {
                break;
            }
            let picks = self.pass(reqs, &chunks)?;
            for (&(i, start, len), pick) in chunks.iter().zip(picks) {
                let r = &reqs[i];
                let s = self.seqs.get_mut(&r.id).expect("placed above");
                s.tokens.extend_from_slice(&r.tokens[start..start + len]);
                if let Some(p) = pick {
                    drafts[i].push(p);
                }
            }
        }
        // One token a pass for every sequence with drafts still to make; the
        // last draft's own KV is never needed (the target computes it).
        let t0 = Instant::now();
        let mut rounds = 0;
        loop {
            let mut chunks = Vec::new();
            for (i, r) in reqs.iter().enumerate() {
                let d = &drafts[i];
                if go[i] && !d.is_empty() && d.len() < r.k && chunks.len() < self.max_seqs.min(self.max_tokens) {
                    let last = *d.last().expect("not empty");
                    if last as usize >= self.target_vocab {
                        continue;
                    }
                    let s = self.seqs.get_mut(&r.id).expect("placed above");
                    s.tokens.push(last);
                    chunks.push((i, s.tokens.len() - 1, 1));
                }
            }
            if chunks.is_empty() {
                break;
            }
            rounds += 1;
            let picks = self.pass(reqs, &chunks)?;
            for (&(i, _, _), pick) in chunks.iter().zip(picks) {
                drafts[i].extend(pick);
            }
        }
        if rounds > 0 {
            let ms = t0.elapsed().as_secs_f64() * 1e3 / rounds as f64;
            self.round_ms = Some(self.round_ms.map_or(ms, |m| 0.8 * m + 0.2 * ms));
        }
        for d in &mut drafts {
            if let Some(j) = d.iter().position(|&t| t as usize >= self.target_vocab) {
                d.truncate(j);
            }
        }
        Ok(drafts)
    }

    /// One forward pass of the draft over `chunks` (request, start, len) of
    /// the requests' draft tokens; each chunk that reaches the end of what
    /// the draft holds yields its greedy pick.
    fn pass(
        &mut self,
        reqs: &[DraftRequest],
        chunks: &[(usize, usize, usize)],
    ) -> Result<Vec<Option<u32>>, EngineError> {
        let t = Instant::now();
        let batch: Vec<SeqChunk> = chunks
            .iter()
            .map(|&(i, start, len)| {
                let r = &reqs[i];
                let s = &self.seqs[&r.id];
                // Catching up reads the sequence's tokens; a drafting round
                // reads the draft's own (the sequence's and the drafts so far).
                let tokens = if start + len <= s.tokens.len() {
                    &s.tokens
                } else {
                    r.tokens
                };
                SeqChunk {
                    token_ids: &tokens[..start + len],
                    start,
                    len,
                    block_tables: &s.table.blocks,
                    sample: start + len == r.tokens.len().max(s.tokens.len()),
                    logits_from: None,
                    hidden: false,
                }
            })
            .collect();
        let sampled: Vec<bool> = batch.iter().map(|c| c.sample).collect();
        let result = self.runner.execute(&batch, false)?;
        self.passes += 1;
        self.seconds += t.elapsed().as_secs_f64();
        let mut picks = result.argmax.into_iter();
        Ok(sampled
            .into_iter()
            .map(|s| if s { picks.next() } else { None })
            .collect())
    }

    /// Throwaway drafts so that drafting compiles nothing while serving: a
    /// `chunk`-token catch-up, then one-token rounds of 1, 4, 8, 16 and 32
    /// sequences (up to `max_num_seqs`); `round_ms` is then seeded from a
    /// one-sequence round. Returns the passes run.
    pub fn warm_up(&mut self, chunk: usize) -> Result<usize, EngineError> {
        let before = self.passes;
        let tokens: Vec<u32> = (0..chunk.max(2) as u32).map(|i| 1 + i % 97).collect();
        let id = |i: usize| SeqId::MAX - i as SeqId;
        self.propose(&[DraftRequest {
            id: id(0),
            tokens: &tokens,
            k: 2,
        }])?;
        for n in [1usize, 4, 8, 16, 32] {
            if n > self.max_seqs {
                break;
            }
            let reqs: Vec<DraftRequest> = (0..n)
                .map(|i| DraftRequest {
                    id: id(1 + i),
                    tokens: &tokens[..2],
                    k: 2,
                })
                .collect();
            self.propose(&reqs)?;
            self.forget(|_| false);
        }
        self.round_ms = None;
        self.propose(&[DraftRequest {
            id: id(0),
            tokens: &tokens[..2],
            k: 3,
        }])?;
        self.forget(|_| false);
        Ok((self.passes - before) as usize)
    }

    /// Checks the draft pool's books against its sequences (tests call this).
    pub fn check_blocks(&self) -> Result<(), String> {
        self.blocks.check_consistency(self.seqs.values().map(|s| &s.table))
    }
}
