//! The engine's warm-up, before a server's first request: one throwaway step
//! per row count the gemm row tiles cover (so that serving compiles nothing),
//! the row tile of batched gemms chosen by timing steps on this machine, and
//! timed steps that seed the step cost `StepBudget` fits.

use std::time::Instant;

use super::EngineError;
use super::LlmEngine;
use super::model_runner::{SeqChunk, StepRunner};

/// Tokens of the prefill-sized step (one sequence) that times each row-tile
/// cap and, last, seeds the step cost.
const CHUNK_TOKENS: usize = RowTileChoice::TOKENS;

/// The row tile the warm-up chose for batched gemms.
#[derive(Clone, Debug, PartialEq)]
pub struct RowTileChoice {
    /// The largest row tile batched gemms take.
    pub cap: u32,
    /// Each cap tried and its best time for a step of `tokens` tokens (ms).
    pub times: Vec<(u32, f64)>,
    pub tokens: usize,
}

impl RowTileChoice {
    /// Tokens of the one-sequence step the caps are timed on.
    pub const TOKENS: usize = 64;

    /// Times a step of `tokens` tokens under each of `caps` (largest first)
    /// with `time` (which sets the cap, runs the step and returns its ms, or
    /// `None` where the step does not fit), twice in turn, and keeps the
    /// fastest (the largest cap on ties: every tile gives the same bits, so
    /// only speed differs). Returns the steps run and the choice: none with
    /// fewer than two caps or a step that does not fit. The engine's warm-up
    /// and `wllm profile` choose alike.
    pub fn time_caps<E>(
        caps: &[u32],
        tokens: usize,
        mut time: impl FnMut(u32) -> Result<Option<f64>, E>,
    ) -> Result<(usize, Option<Self>), E> {
        if caps.len() < 2 {
            return Ok((0, None));
        }
        let mut best = vec![f64::INFINITY; caps.len()];
        let mut steps = 0;
        for _ in 0..2 {
            for (i, &cap) in caps.iter().enumerate() {
                let Some(ms) = time(cap)? else {
                    return Ok((steps, None));
                };
                best[i] = best[i].min(ms);
                steps += 1;
            }
        }
        let mut pick = 0;
        for i in 1..caps.len() {
            if best[i] < best[pick] {
                pick = i;
            }
        }
        let choice = Self {
            cap: caps[pick],
            times: caps.iter().copied().zip(best).collect(),
            tokens,
        };
        Ok((steps, Some(choice)))
    }

    /// Chooses the row tile of `runner`'s batched gemms: `time_caps` over
    /// the caps the runner offers (`time` runs the step under the cap set),
    /// then the runner keeps the chosen cap, or the tiles' own where a step
    /// did not fit. The engine's warm-up and `wllm profile` choose this way.
    pub fn choose<E>(
        runner: &dyn StepRunner,
        tokens: usize,
        mut time: impl FnMut() -> Result<Option<f64>, E>,
    ) -> Result<(usize, Option<Self>), E> {
        let caps = runner.row_tile_caps();
        let (steps, choice) = Self::time_caps(&caps, tokens, |cap| {
            runner.set_row_tile_cap(cap);
            time()
        })?;
        match &choice {
            Some(c) => runner.set_row_tile_cap(c.cap),
            None if caps.len() >= 2 => runner.set_row_tile_cap(u32::MAX),
            None => {}
        }
        Ok((steps, choice))
    }

    /// The chosen cap's best time (ms).
    pub fn chosen_ms(&self) -> f64 {
        self.times
            .iter()
            .find(|(cap, _)| *cap == self.cap)
            .map_or(f64::INFINITY, |t| t.1)
    }

    /// One line for the start-up log.
    pub fn describe(&self) -> String {
        let times: Vec<String> = self
            .times
            .iter()
            .map(|(cap, ms)| format!("{cap} rows {ms:.0} ms"))
            .collect();
        format!(
            "batched gemms in tiles of up to {} rows (a {}-token step: {})",
            self.cap,
            self.tokens,
            times.join(", ")
        )
    }
}

impl LlmEngine {
    /// Builds every pipeline a server will need before its first request:
    /// pipelines compile when first used, so where the backend offers
    /// row-tile caps (`Backend::row_tile_caps`: CPU adapters) it first times a
    /// 64-token prompt under each, twice in turn, and keeps the fastest
    /// (`row_tile`); then it runs one throwaway step per row count the gemm
    /// row tiles cover (1, 4, 8, 16 and 32 rows, within the step budget): as
    /// that many one-token sequences where the sequence cap and the pool allow
    /// (the LM head then runs on as many rows), else as one sequence of that
    /// many tokens. The KV rows written are in free blocks, which no request
    /// reads before rewriting them. Then it runs those steps again, timed
    /// (each size's faster run of the two counts),
    /// and (where no cap was timed) 64 tokens of one sequence, to seed the step cost
    /// `StepBudget` fits with them and the 64-token time (so the first burst
    /// of requests already gets stall-free steps), and last one step in the
    /// pool's last block (`touch_kv_pool`). Does nothing once requests
    /// have been added. Returns the steps run.
    pub fn warm_up(&mut self) -> Result<usize, EngineError> {
        if !self.untouched() {
            return Ok(0);
        }
        // The row tile first, so that the decode-shaped steps build only the
        // chosen cap's tiles: on llvmpipe with an empty shader cache, the
        // LM head's 16-row tile took 15 s to build and about as long again to
        // JIT on its first dispatch, for a cap of 8 rows that never uses it.
        let (tuning_steps, tuned_ms) = self.choose_row_tile()?;
        let mut steps = tuning_steps;
        let sizes = [1usize, 4, 8, 16, 32];
        let mut first = Vec::with_capacity(sizes.len());
        for &n in &sizes {
            let Some(ms) = self.warm_step(n, false)? else { break };
            first.push(ms);
            steps += 1;
        }
        // Each size's faster run seeds the cost: a step of a few ms that a
        // busy machine delayed once (a test suite beside it) tilted the fit's
        // slope below zero, which leaves the cost unseeded.
        for (&n, &ms0) in sizes.iter().zip(&first) {
            let Some(ms) = self.warm_step(n, false)? else { break };
            self.budget.cost.observe(n, ms.min(ms0));
            steps += 1;
        }
        // The chunk-sized step: timed already under the chosen row tile where
        // the tiles were tuned (that time seeds the cost), else timed now.
        let chunk_ms = match tuned_ms {
            Some(ms) => Some(ms),
            None => {
                let ms = self.warm_step(CHUNK_TOKENS, true)?;
                steps += usize::from(ms.is_some());
                ms
            }
        };
        if let Some(ms) = chunk_ms {
            self.budget.cost.observe(CHUNK_TOKENS, ms);
        }
        steps += self.touch_kv_pool()?;
        if let Some(d) = &mut self.draft {
            steps += d.warm_up(CHUNK_TOKENS)?;
        }
        self.update_gauges();
        Ok(steps)
    }

    /// A light warm-up for an engine that is about to wait on a person (`wllm
    /// chat`): builds the pipelines of short prompts and their decodes under
    /// the row-tile cap in force (no tuning) with throwaway steps of one
    /// sequence of 8 tokens, a one-token step and one sequence of 4 tokens, so
    /// that a first prompt of up to a few hundred tokens compiles nothing.
    /// `go_on` is asked before each step (false: stop there, a request came).
    /// Does nothing once requests have been added. Returns the steps run.
    pub fn prime(&mut self, mut go_on: impl FnMut() -> bool) -> Result<usize, EngineError> {
        if !self.untouched() {
            return Ok(0);
        }
        let mut steps = 0;
        for (n, prefill) in [(8, true), (1, false), (4, true)] {
            if !go_on() {
                break;
            }
            steps += usize::from(self.warm_step(n, prefill)?.is_some());
        }
        self.update_gauges();
        Ok(steps)
    }

    /// Whether no request is in the engine and every block of the pool is
    /// free: only then may throwaway steps write KV rows (`warm_up`, `prime`).
    fn untouched(&self) -> bool {
        !self.scheduler.has_unfinished() && self.scheduler.blocks.num_free_blocks() >= self.plan.num_blocks
    }

    /// Runs a one-token step in the pool's last block, so that the step binds
    /// the whole KV pool (steps bind the prefix they touch, rounded up to a
    /// power of two of blocks) and wgpu zero-fills it now. Otherwise the
    /// first step whose blocks reach past 64, 128, 256... blocks cleared the
    /// next part while requests decoded: on lavapipe such a step of the
    /// default model took 570-600 ms instead of ~320, an ITL spike in every
    /// running request. Returns the steps run (0 where the pool is one block).
    fn touch_kv_pool(&mut self) -> Result<usize, EngineError> {
        let last = self.plan.num_blocks.saturating_sub(1) as u32;
        if last == 0 {
            return Ok(0);
        }
        let tables = vec![vec![last]; self.scheduler.blocks.num_groups()];
        let chunk = SeqChunk {
            token_ids: &[0],
            start: 0,
            len: 1,
            block_tables: &tables,
            sample: true,
            logits_from: None,
            hidden: false,
        };
        self.runner.execute(&[chunk], false)?;
        Ok(1)
    }

    /// Chooses the row tile by timing a `CHUNK_TOKENS` step under each cap
    /// (`RowTileChoice::choose`) and records it in `row_tile`. Returns the
    /// steps run and, where a cap was chosen, its best time (ms).
    fn choose_row_tile(&mut self) -> Result<(usize, Option<f64>), EngineError> {
        let (steps, choice) = RowTileChoice::choose(self.runner.as_ref(), CHUNK_TOKENS, || {
            self.warm_step(CHUNK_TOKENS, true)
        })?;
        let chosen_ms = choice.as_ref().map(RowTileChoice::chosen_ms);
        self.row_tile = choice;
        Ok((steps, chosen_ms))
    }

    /// Runs one throwaway step of `n` rows (see `warm_up`) and returns its
    /// time in ms, or `None` where `n` rows exceed the step budget or the pool:
    /// as one sequence of `n` tokens where `prefill` (the chunk-sized step: a
    /// prompt's attention tiles its tokens, a kernel no decode runs, so a
    /// warm-up of one-token sequences left it to compile in the first
    /// request: 8 s of TTFT on llvmpipe with an empty shader cache), else as
    /// `n` one-token sequences where they fit.
    fn warm_step(&self, n: usize, prefill: bool) -> Result<Option<f64>, EngineError> {
        let bs = self.plan.block_size;
        let cfg = &self.scheduler.cfg;
        if n > cfg.max_num_batched_tokens || n.div_ceil(bs) > self.plan.num_blocks {
            return Ok(None);
        }
        let seqs = cfg.max_num_seqs.min(self.plan.num_blocks);
        let ids = vec![0u32; n];
        // `n` one-token sequences of a block each, or one of `n` tokens (every
        // KV group on the same blocks: a throwaway step's keys are never read).
        let groups = self.scheduler.blocks.num_groups();
        let (tables, len): (Vec<Vec<Vec<u32>>>, usize) = if n <= seqs && !prefill {
            ((0..n as u32).map(|b| vec![vec![b]; groups]).collect(), 1)
        } else {
            (vec![vec![(0..n.div_ceil(bs) as u32).collect(); groups]], n)
        };
        let chunks: Vec<SeqChunk> = tables
            .iter()
            .map(|t| SeqChunk {
                token_ids: &ids[..len],
                start: 0,
                len,
                block_tables: t,
                sample: true,
                logits_from: None,
                hidden: false,
            })
            .collect();
        let started = Instant::now();
        self.runner.execute(&chunks, false)?;
        Ok(Some(started.elapsed().as_secs_f64() * 1e3))
    }
}

#[cfg(test)]
mod tests {
    use super::RowTileChoice;

    /// `time_caps` with step times by cap, in the order asked (None: the step does not fit).
    fn choose(caps: &[u32], times: &[Option<f64>]) -> (usize, Option<RowTileChoice>, Vec<u32>) {
        let mut asked = Vec::new();
        let mut next = times.iter();
        let (steps, choice) = RowTileChoice::time_caps(caps, 64, |cap| {
            asked.push(cap);
            Ok::<_, ()>(*next.next().expect("asked for no more steps than given"))
        })
        .unwrap();
        (steps, choice, asked)
    }

    #[test]
    fn the_fastest_cap_of_two_rounds_wins_and_the_largest_on_ties() {
        // Caps 16 then 8, twice: 8's best (300) beats 16's (400).
        let (steps, c, asked) = choose(&[16, 8], &[Some(900.0), Some(500.0), Some(400.0), Some(300.0)]);
        let c = c.unwrap();
        assert_eq!((steps, c.cap, asked), (4, 8, vec![16, 8, 16, 8]));
        assert_eq!(c.times, vec![(16, 400.0), (8, 300.0)]);
        assert_eq!(c.chosen_ms(), 300.0);
        // A tie keeps the larger tile.
        let (_, c, _) = choose(&[16, 8], &[Some(5.0), Some(5.0), Some(6.0), Some(6.0)]);
        assert_eq!(c.unwrap().cap, 16);
    }

    #[test]
    fn no_choice_with_one_cap_or_a_step_that_does_not_fit() {
        assert!(matches!(choose(&[16], &[]), (0, None, _)));
        assert!(matches!(choose(&[], &[]), (0, None, _)));
        let (steps, c, asked) = choose(&[16, 8], &[Some(1.0), None]);
        assert_eq!((steps, c.is_none(), asked), (1, true, vec![16, 8]));
    }
}
