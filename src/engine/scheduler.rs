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

/// Sequences a step may take back from a large group for a waiting one.
const FAIR_PREEMPTS_PER_STEP: usize = 8;

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
            let mut fair_preempts = 0;
            while budget > 0 {
                let Some((pos, id, group_running)) = self.next_waiting() else {
                    break;
                };
                let seq = &self.seqs[&id];
                // Mean and cls embeddings need every position's hidden state.
                let cached = if seq.pooler.as_ref().is_some_and(|p| p.needs_every_row()) {
                    super::CachedPrefix::default()
                } else {
                    self.blocks.cached_prefix(&seq.token_ids)
                };
                let num_cached = cached.len() * self.blocks.block_size;
                let need = (seq.num_tokens() - num_cached).min(budget);
                let fits =
                    self.running.len() < self.cfg.max_num_seqs && self.blocks.can_allocate(&cached, num_cached + need);
                if !fits {
                    // A request with nothing running waits behind one that holds
                    // several slots: take one of those back (it is recomputed later).
                    if group_running == 0
                        && fair_preempts < FAIR_PREEMPTS_PER_STEP
                        && let Some(victim) = self.fair_share_victim()
                    {
                        if let Some(k) = out.scheduled.iter().position(|&(s, _)| s == victim) {
                            budget += out.scheduled.remove(k).1;
                        }
                        self.preempt(victim);
                        out.preempted.push(victim);
                        fair_preempts += 1;
                        continue;
                    }
                    break;
                }
                self.waiting.remove(pos);
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

    /// The next waiting sequence to admit: the first waiting one of the group
    /// with the fewest running sequences (ties: the earliest in the queue), so
    /// that a request of many sequences cannot hold back a small one; with one
    /// sequence per group this is the queue's order. Returns its queue
    /// position, id and its group's running count.
    fn next_waiting(&self) -> Option<(usize, SeqId, usize)> {
        let first = *self.waiting.front()?;
        let multi = self
            .waiting
            .iter()
            .any(|id| self.seqs[id].group != self.seqs[&first].group)
            || self
                .running
                .iter()
                .any(|id| self.seqs[id].group == self.seqs[&first].group);
        if !multi {
            return Some((0, first, 0));
        }
        let mut running: HashMap<SeqId, usize> = HashMap::new();
        for id in &self.running {
            *running.entry(self.seqs[id].group).or_default() += 1;
        }
        let mut seen = std::collections::HashSet::new();
        let mut best: Option<(usize, SeqId, usize)> = None;
        for (pos, &id) in self.waiting.iter().enumerate() {
            let g = self.seqs[&id].group;
            if !seen.insert(g) {
                continue;
            }
            let r = running.get(&g).copied().unwrap_or(0);
            if best.is_none_or(|b| r < b.2) {
                best = Some((pos, id, r));
                if r == 0 {
                    break;
                }
            }
        }
        best
    }

    /// The most recently admitted sequence of the group with the most running
    /// sequences, when that group has at least two.
    fn fair_share_victim(&self) -> Option<SeqId> {
        let mut running: HashMap<SeqId, usize> = HashMap::new();
        for id in &self.running {
            *running.entry(self.seqs[id].group).or_default() += 1;
        }
        let (&g, &n) = running.iter().max_by_key(|&(g, n)| (*n, std::cmp::Reverse(*g)))?;
        if n < 2 {
            return None;
        }
        self.running.iter().rev().copied().find(|id| self.seqs[id].group == g)
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
