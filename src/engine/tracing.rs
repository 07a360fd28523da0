//! The engine's side of step traces: what each step ran (taken from the
//! scheduler's plan before the step advances the sequences), the pool's
//! counters and block map after it, handed to the `TraceRecorder`; and the
//! live view the server's /engine page polls.

use std::time::Instant;

use serde_json::{Value, json};

use super::llm_engine::LlmEngine;
use super::model_event::{ModelEvent, ModelEventKind};
use super::sequence::{SeqId, SeqStatus};
use crate::trace::{BlockMap, Counters, StepEntry, TraceMeta, Work, report, tef};

/// Waiting requests the live view lists (the queue's head).
const LIVE_WAITING: usize = 100;

impl LlmEngine {
    /// Each scheduled sequence's work, before the step counts its tokens.
    pub(super) fn trace_entries(&self, scheduled: &[(SeqId, usize)]) -> Vec<StepEntry> {
        scheduled
            .iter()
            .filter_map(|&(id, n)| {
                let s = self.scheduler.seqs.get(&id)?;
                let decode = n == 1 && s.num_computed_tokens >= s.prompt_len;
                let work = if decode {
                    Work::Decode
                } else {
                    Work::Prefill {
                        start: s.num_computed_tokens,
                        len: n,
                    }
                };
                Some(StepEntry { seq: id, work })
            })
            .collect()
    }

    pub(super) fn trace_step(&mut self, span: (Instant, Instant), entries: Vec<StepEntry>, preempted: Vec<SeqId>) {
        let counters = self.trace_counters();
        let map = self.block_map();
        if let Some(t) = &mut self.trace {
            t.step(span, entries, preempted, counters, map);
        }
    }

    fn trace_counters(&self) -> Counters {
        let b = &self.scheduler.blocks;
        Counters {
            blocks_used: b.num_blocks() - b.num_free_blocks(),
            blocks_cached: b.num_cached_free_blocks(),
            blocks_free: b.num_free_blocks() - b.num_cached_free_blocks(),
            running: self.scheduler.running.len(),
            waiting: self.scheduler.waiting.len(),
            prefix_hits: self.scheduler.prefix_hits,
            prefix_queries: self.scheduler.prefix_queries,
        }
    }

    /// Every pool block's owner (the lowest live sequence holding it),
    /// reference count and prefix-cache registration, now.
    pub fn block_map(&self) -> BlockMap {
        let b = &self.scheduler.blocks;
        let n = b.num_blocks();
        let mut owners = vec![-1i64; n];
        for (&id, s) in &self.scheduler.seqs {
            for blk in s.block_table.held() {
                let o = &mut owners[blk as usize];
                if *o < 0 || (id as i64) < *o {
                    *o = id as i64;
                }
            }
        }
        BlockMap {
            owners,
            refs: (0..n as u32).map(|i| b.ref_count(i)).collect(),
            cached: (0..n as u32).map(|i| u8::from(b.is_cached(i))).collect(),
        }
    }

    fn trace_meta(&self) -> TraceMeta {
        TraceMeta {
            model: self.model_name.clone(),
            adapter: self.runner.describe(),
        }
    }

    /// Puts another model's load or unload (`ModelRegistry`'s observer) in
    /// the trace, beside the steps it delayed. A load's start is not: the
    /// load's span is recorded when it ends.
    pub fn trace_model_event(&mut self, e: &ModelEvent) {
        let Some(t) = &mut self.trace else { return };
        let (what, detail) = match &e.kind {
            ModelEventKind::Loading => return,
            ModelEventKind::Loaded {
                seconds,
                warm_up_seconds,
                bytes,
            } => (
                "load",
                format!("{seconds:.3} s (warm-up {warm_up_seconds:.3} s), {bytes} bytes"),
            ),
            ModelEventKind::LoadFailed { error } => ("load failed", error.clone()),
            ModelEventKind::Unloaded { reason } => ("unload", reason.to_string()),
        };
        t.model_event(&e.model, what, (e.start, e.end), detail);
    }

    /// The recorded steps as Chrome Trace Event Format JSON (None without `trace_steps`).
    pub fn trace_json(&self) -> Option<Value> {
        self.trace.as_ref().map(|t| tef::export(t, &self.trace_meta()))
    }

    /// What the live engine page shows: running and waiting requests, the
    /// pool, the block map now, and the last `steps` steps laid out as in a
    /// trace report (empty without a trace recorder).
    pub fn live_state(&self, steps: usize) -> Value {
        let seq_json = |&id: &SeqId| {
            let s = self.scheduler.seqs.get(&id)?;
            let state = match s.status {
                SeqStatus::Running if s.num_computed_tokens < s.prompt_len => "prefill",
                SeqStatus::Running => "decode",
                _ if s.num_preemptions > 0 => "preempted",
                _ => "waiting",
            };
            Some(json!({"id": id, "state": state, "prompt_tokens": s.prompt_len,
                "output_tokens": s.num_tokens() - s.prompt_len, "computed_tokens": s.num_computed_tokens,
                "blocks": s.block_table.held().count(), "preemptions": s.num_preemptions,
                "age_s": s.times.arrival.elapsed().as_secs_f64()}))
        };
        // A long queue is listed by its head; the counts are whole.
        let running: Vec<Value> = self.scheduler.running.iter().filter_map(seq_json).collect();
        let waiting: Vec<Value> = self
            .scheduler
            .waiting
            .iter()
            .take(LIVE_WAITING)
            .filter_map(seq_json)
            .collect();
        let c = self.trace_counters();
        let timeline = self
            .trace
            .as_ref()
            .map(|t| report::layout(&tef::export_tail(t, &self.trace_meta(), steps)));
        let m = &self.metrics;
        json!({
            "model": self.model_name,
            "adapter": self.runner.describe(),
            "num_running": self.scheduler.running.len(),
            "num_waiting": self.scheduler.waiting.len(),
            "running": running,
            "waiting": waiting,
            "kv": {"num_blocks": self.plan.num_blocks, "block_size": self.plan.block_size,
                "dtype": self.plan.dtype, "bytes_per_token": self.plan.bytes_per_token,
                "pool_bytes": self.runner.kv_bytes(), "kv_groups": self.plan.kv_groups,
                "used": c.blocks_used, "cached": c.blocks_cached, "free": c.blocks_free,
                "usage": self.scheduler.blocks.usage()},
            "memory": {"plan": self.memory, "weights": self.runner.weight_bytes(),
                "step_buffers": self.static_bytes() - self.runner.weight_bytes(),
                "kv": self.runner.kv_bytes(), "describe": self.memory.describe()},
            "block_map": self.block_map(),
            "counters": {"steps": m.num_steps_total, "generation_tokens": m.generation_tokens_total,
                "prompt_tokens": m.prompt_tokens_total, "preemptions": m.num_preemptions_total,
                "prefix_hits": c.prefix_hits, "prefix_queries": c.prefix_queries,
                "requests_finished": m.request_success_total},
            "timeline": timeline,
        })
    }
}
