//! `TraceRecorder`: what the engine did, step by step, kept in a ring of the
//! last N steps (memory stays bounded on a long-running server). Each step
//! records which sequences ran and how (a prefill chunk or a decode), the
//! preemptions the scheduler made, the step's time, the pool and queue
//! counters, and the blocks whose state changed (so a step costs memory in
//! proportion to what it did, not to the pool's size); request arrivals and
//! finishes are kept beside. `tef::export` turns it into a Chrome trace.

use std::collections::VecDeque;
use std::time::Instant;

/// How a sequence took part in a step.
#[derive(Clone, Debug, PartialEq)]
pub enum Work {
    /// Prompt tokens `start..start + len` (a chunk of the prefill).
    Prefill { start: usize, len: usize },
    /// One token, generated.
    Decode,
}

/// One sequence's share of a step.
#[derive(Clone, Debug, PartialEq)]
pub struct StepEntry {
    pub seq: u64,
    pub work: Work,
}

/// The pool and queues after a step.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Counters {
    /// Blocks held by live sequences.
    pub blocks_used: usize,
    /// Free blocks still in the prefix cache.
    pub blocks_cached: usize,
    /// Free blocks holding nothing.
    pub blocks_free: usize,
    pub running: usize,
    pub waiting: usize,
    /// Prompt tokens found in / looked up in the prefix cache so far.
    pub prefix_hits: u64,
    pub prefix_queries: u64,
}

/// Every pool block's state: its owner (the lowest live sequence holding it,
/// -1 when none), its reference count, and whether it is registered in the
/// prefix cache (a free block that is cached can be revived by a new prompt).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BlockMap {
    pub owners: Vec<i64>,
    pub refs: Vec<u32>,
    pub cached: Vec<u8>,
}

impl BlockMap {
    /// The blocks whose state differs in `next`: (block, owner, refs, cached).
    pub fn changes_to(&self, next: &BlockMap) -> Vec<BlockChange> {
        (0..next.owners.len())
            .filter(|&b| {
                self.owners.get(b) != next.owners.get(b)
                    || self.refs.get(b) != next.refs.get(b)
                    || self.cached.get(b) != next.cached.get(b)
            })
            .map(|b| BlockChange {
                block: b as u32,
                owner: next.owners[b],
                refs: next.refs[b],
                cached: next.cached[b],
            })
            .collect()
    }

    /// Applies changes (out-of-range blocks are ignored).
    pub fn apply(&mut self, changes: &[BlockChange]) {
        for c in changes {
            let b = c.block as usize;
            if b < self.owners.len() {
                self.owners[b] = c.owner;
                self.refs[b] = c.refs;
                self.cached[b] = c.cached;
            }
        }
    }
}

/// One block's new state.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BlockChange {
    pub block: u32,
    pub owner: i64,
    pub refs: u32,
    pub cached: u8,
}

/// One engine step.
#[derive(Clone, Debug, PartialEq)]
pub struct StepRecord {
    pub index: u64,
    /// Microseconds since the recorder started.
    pub start_us: f64,
    pub dur_us: f64,
    pub entries: Vec<StepEntry>,
    /// Sequences the scheduler preempted to make room for this step.
    pub preempted: Vec<u64>,
    pub counters: Counters,
    /// The blocks the step changed (their state after it).
    pub block_changes: Vec<BlockChange>,
}

/// What happened to a request outside the steps.
#[derive(Clone, Debug, PartialEq)]
pub enum RequestEventKind {
    Arrived {
        prompt_len: usize,
    },
    /// stop, length or abort.
    Finished {
        reason: String,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct RequestEvent {
    pub seq: u64,
    pub ts_us: f64,
    pub kind: RequestEventKind,
}

/// A model of the same server loaded or unloaded (a span for a load, an
/// instant for an unload), kept beside the steps it delayed.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelTraceEvent {
    pub model: String,
    /// "load", "load failed" or "unload".
    pub what: String,
    pub ts_us: f64,
    pub dur_us: f64,
    /// Its seconds and bytes, or the error, or the unload's reason.
    pub detail: String,
}

/// Model events a recorder keeps.
const MODEL_EVENTS: usize = 256;

/// The ring of recent steps and request events.
#[derive(Debug)]
pub struct TraceRecorder {
    pub capacity: usize,
    t0: Instant,
    pub steps: VecDeque<StepRecord>,
    pub events: VecDeque<RequestEvent>,
    /// The most recent loads and unloads of the server's models.
    pub model_events: VecDeque<ModelTraceEvent>,
    /// Steps dropped from the front of the ring so far.
    pub dropped_steps: u64,
    next_index: u64,
    last_map: BlockMap,
    /// The block map before the oldest step kept ran (the base its changes
    /// and every later step's apply to).
    pub base_map: BlockMap,
    pub num_blocks: usize,
    pub block_size: usize,
}

impl TraceRecorder {
    /// A recorder keeping the last `capacity` steps (at least 1) of a pool of
    /// `num_blocks` blocks of `block_size` tokens.
    pub fn new(capacity: usize, num_blocks: usize, block_size: usize) -> Self {
        let empty = BlockMap {
            owners: vec![-1; num_blocks],
            refs: vec![0; num_blocks],
            cached: vec![0; num_blocks],
        };
        Self {
            capacity: capacity.max(1),
            t0: Instant::now(),
            steps: VecDeque::new(),
            events: VecDeque::new(),
            model_events: VecDeque::new(),
            dropped_steps: 0,
            next_index: 0,
            last_map: empty.clone(),
            base_map: empty,
            num_blocks,
            block_size,
        }
    }

    /// Microseconds from the recorder's start to `t`.
    pub fn micros(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.t0).as_secs_f64() * 1e6
    }

    pub fn arrived(&mut self, seq: u64, prompt_len: usize, at: Instant) {
        let ts_us = self.micros(at);
        self.push_event(RequestEvent {
            seq,
            ts_us,
            kind: RequestEventKind::Arrived { prompt_len },
        });
    }

    pub fn finished(&mut self, seq: u64, reason: &str, at: Instant) {
        let ts_us = self.micros(at);
        self.push_event(RequestEvent {
            seq,
            ts_us,
            kind: RequestEventKind::Finished { reason: reason.into() },
        });
    }

    /// Records a model's load (from `start` to `end`) or unload.
    pub fn model_event(&mut self, model: &str, what: &str, (start, end): (Instant, Instant), detail: String) {
        let ts_us = self.micros(start);
        self.model_events.push_back(ModelTraceEvent {
            model: model.into(),
            what: what.into(),
            ts_us,
            dur_us: end.saturating_duration_since(start).as_secs_f64() * 1e6,
            detail,
        });
        while self.model_events.len() > MODEL_EVENTS {
            self.model_events.pop_front();
        }
    }

    fn push_event(&mut self, e: RequestEvent) {
        self.events.push_back(e);
        // Once the ring has dropped steps, events older than the oldest step
        // kept are of no use to a reader; a bound keeps a server's arrivals
        // from growing the ring without end.
        let oldest = match self.steps.front() {
            Some(s) if self.dropped_steps > 0 => s.start_us,
            _ => f64::MIN,
        };
        while self.events.len() > 4 * self.capacity + 64 || self.events.front().is_some_and(|e| e.ts_us < oldest) {
            self.events.pop_front();
        }
    }

    /// Records a step that ran from `start` to `end`; `map` is the block map
    /// after it (only the blocks that changed are kept).
    pub fn step(
        &mut self,
        (start, end): (Instant, Instant),
        entries: Vec<StepEntry>,
        preempted: Vec<u64>,
        counters: Counters,
        map: BlockMap,
    ) {
        let block_changes = self.last_map.changes_to(&map);
        self.last_map = map;
        let rec = StepRecord {
            index: self.next_index,
            start_us: self.micros(start),
            dur_us: end.saturating_duration_since(start).as_secs_f64() * 1e6,
            entries,
            preempted,
            counters,
            block_changes,
        };
        self.next_index += 1;
        self.steps.push_back(rec);
        while self.steps.len() > self.capacity {
            if let Some(old) = self.steps.pop_front() {
                self.dropped_steps += 1;
                self.base_map.apply(&old.block_changes);
            }
        }
    }

    /// The block map after the last step recorded.
    pub fn current_map(&self) -> &BlockMap {
        &self.last_map
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn map(owner: i64, n: usize) -> BlockMap {
        BlockMap {
            owners: vec![owner; n],
            refs: vec![u32::from(owner >= 0); n],
            cached: vec![0; n],
        }
    }

    #[test]
    fn the_ring_keeps_the_last_steps_and_the_map_before_them() {
        let mut r = TraceRecorder::new(5, 3, 16);
        let t0 = Instant::now();
        for i in 0..20u64 {
            let at = t0 + Duration::from_millis(10 * i);
            r.arrived(i, 4, at);
            // The map changes every fourth step.
            let m = map((i / 4) as i64, 3);
            let entries = vec![StepEntry {
                seq: i,
                work: Work::Decode,
            }];
            r.step(
                (at, at + Duration::from_millis(5)),
                entries,
                vec![],
                Counters::default(),
                m,
            );
            r.finished(i, "stop", at + Duration::from_millis(6));
        }
        assert_eq!(r.steps.len(), 5);
        assert_eq!(r.dropped_steps, 15);
        assert_eq!(r.steps.front().map(|s| s.index), Some(15));
        // Before step 15 the map is step 12's (owner 3); step 16 changes all 3 blocks to owner 4.
        assert_eq!(r.base_map, map(3, 3));
        assert!(r.steps[0].block_changes.is_empty());
        assert_eq!(r.steps[1].block_changes.len(), 3);
        let mut m = r.base_map.clone();
        for s in &r.steps {
            m.apply(&s.block_changes);
        }
        assert_eq!(&m, r.current_map());
        assert_eq!(r.current_map(), &map(4, 3));
        // Request events older than the oldest step kept are gone; the rest stay.
        assert!(r.events.iter().all(|e| e.ts_us >= r.steps[0].start_us));
        assert_eq!(r.events.len(), 10);
    }
}
