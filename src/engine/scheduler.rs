//! Scheduler (iteration-level, vLLM V1 style): one queue of requests, each with
//! `num_computed_tokens`. Each step spends a token budget
//! (`max_num_batched_tokens`) on running requests first (a decode is one token,
//! an unfinished prompt its next chunk), then admits waiting ones first come,
//! first served, while `max_num_seqs` and free blocks allow. When a running
//! request needs a block and none is free, the most recently admitted request
//! is preempted: its blocks are released and it returns to the front of the
//! queue, to be recomputed (cheaply, through the prefix cache). The engine may
//! give a step a smaller budget (`schedule_within`, from `StepBudget`) so that
//! decodes are not stalled behind long prefill chunks.

use std::collections::{HashMap, VecDeque};

use super::block_manager::BlockManager;
use super::sequence::{SeqId, SeqStatus, Sequence};

/// Limits of one step.
#[derive(Clone, Copy, Debug)]
pub struct SchedulerConfig {
    pub max_num_batched_tokens: usize,
    pub max_num_seqs: usize,
    pub max_model_len: usize,
}

/// What one step computes: for each sequence, how many new tokens.
#[derive(Clone, Debug, Default)]
pub struct SchedulerOutput {
    pub scheduled: Vec<(SeqId, usize)>,
    pub preempted: Vec<SeqId>,
    pub num_batched_tokens: usize,
}

impl SchedulerOutput {
    pub fn is_empty(&self) -> bool {
        self.scheduled.is_empty()
    }
}

/// Owns the requests and the block manager.
pub struct Scheduler {
    pub cfg: SchedulerConfig,
    pub blocks: BlockManager,
    pub seqs: HashMap<SeqId, Sequence>,
    pub waiting: VecDeque<SeqId>,
    /// In admission order: the last is preempted first.
    pub running: Vec<SeqId>,
    pub num_preemptions: u64,
    pub prefix_queries: u64,
    pub prefix_hits: u64,
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig, blocks: BlockManager) -> Self {
        Self {
            cfg,
            blocks,
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            num_preemptions: 0,
            prefix_queries: 0,
            prefix_hits: 0,
        }
    }

    pub fn add(&mut self, seq: Sequence) {
        self.waiting.push_back(seq.id);
        self.seqs.insert(seq.id, seq);
    }

    pub fn has_unfinished(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    fn preempt(&mut self, id: SeqId) {
        self.running.retain(|&r| r != id);
        let seq = self.seqs.get_mut(&id).expect("running sequence exists");
        self.blocks.deallocate(&mut seq.block_table);
        seq.num_computed_tokens = 0;
        seq.status = SeqStatus::Waiting;
        seq.num_preemptions += 1;
        self.num_preemptions += 1;
        self.waiting.push_front(id);
    }

    /// Running requests whose next step is a decode (one token).
    pub fn decode_rows(&self) -> usize {
        self.running
            .iter()
            .filter(|id| {
                let s = &self.seqs[id];
                s.num_tokens() == s.num_computed_tokens + 1
            })
            .count()
    }

    /// Requests running or waiting, up to `max_num_seqs`: the batch the engine serves.
    pub fn live(&self) -> usize {
        (self.running.len() + self.waiting.len()).min(self.cfg.max_num_seqs)
    }

    /// Chooses this step's work within `max_num_batched_tokens`.
    pub fn schedule(&mut self) -> SchedulerOutput {
        self.schedule_within(self.cfg.max_num_batched_tokens)
    }

    /// Chooses this step's work within `tokens` (capped by `max_num_batched_tokens`).
    pub fn schedule_within(&mut self, tokens: usize) -> SchedulerOutput {
        let mut out = SchedulerOutput::default();
        let cap = tokens.min(self.cfg.max_num_batched_tokens);
        let mut budget = cap;
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let (need, total) = {
                let s = &self.seqs[&id];
                let need = (s.num_tokens() - s.num_computed_tokens).min(budget);
                (need, s.num_computed_tokens + need)
            };
            if need == 0 {
                i += 1;
                continue;
            }
            let mut self_preempted = false;
            while !self.blocks.can_append(&self.seqs[&id].block_table, total) {
                let victim = *self.running.last().expect("running is not empty");
                self.preempt(victim);
                out.preempted.push(victim);
                if victim == id {
                    self_preempted = true;
                    break;
                }
            }
            if self_preempted {
                continue;
            }
            let seq = self.seqs.get_mut(&id).expect("running sequence exists");
            self.blocks.may_append(&mut seq.block_table, total);
            out.scheduled.push((id, need));
            budget -= need;
            i += 1;
        }
        if out.preempted.is_empty() {
            while budget > 0 && self.running.len() < self.cfg.max_num_seqs {
                let Some(&id) = self.waiting.front() else { break };
                let seq = &self.seqs[&id];
                let cached = self.blocks.cached_prefix(&seq.token_ids);
                let num_cached = cached.0.len() * self.blocks.block_size;
                let need = (seq.num_tokens() - num_cached).min(budget);
                if !self.blocks.can_allocate(&cached.0, num_cached + need) {
                    break;
                }
                self.waiting.pop_front();
                self.prefix_queries += seq.num_tokens() as u64;
                self.prefix_hits += num_cached as u64;
                let seq = self.seqs.get_mut(&id).expect("waiting sequence exists");
                self.blocks.allocate(&mut seq.block_table, cached, num_cached + need);
                seq.num_computed_tokens = num_cached;
                seq.num_cached_tokens = num_cached;
                seq.status = SeqStatus::Running;
                seq.times.scheduled.get_or_insert_with(std::time::Instant::now);
                self.running.push(id);
                out.scheduled.push((id, need));
                budget -= need;
            }
        }
        out.num_batched_tokens = cap - budget;
        out
    }

    /// Removes a finished or aborted sequence, freeing its blocks.
    pub fn finish(&mut self, id: SeqId) -> Option<Sequence> {
        self.running.retain(|&r| r != id);
        self.waiting.retain(|&r| r != id);
        let mut seq = self.seqs.remove(&id)?;
        self.blocks.deallocate(&mut seq.block_table);
        Some(seq)
    }
}
