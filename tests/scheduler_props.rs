//! Property tests of the block manager and the scheduler over random workloads
//! (CPU only: the model is replaced by appending pseudo-random tokens).

use proptest::prelude::*;
use std::collections::HashMap;
use wllm::SamplingParams;
use wllm::engine::block_manager::first_needed_block;
use wllm::engine::step_budget::{StepBudget, StepTarget};
use wllm::engine::{BlockManager, BlockTable, FREED, KvGroups, Scheduler, SchedulerConfig, Sequence};

#[derive(Debug, Clone)]
enum Op {
    Alloc { len: usize, prefix: usize },
    Append(usize, usize),
    Free(usize),
}

/// KV group layouts: flat; Gemma-like (a global group and windowed ones);
/// every layer windowed (Mistral); windows shorter than a block.
fn layouts() -> impl Strategy<Value = Vec<Option<usize>>> {
    prop::sample::select(vec![
        vec![None],
        vec![None, Some(5), Some(5)],
        vec![Some(9)],
        vec![None, Some(2), Some(2), Some(2)],
        vec![None, Some(17)],
    ])
}

/// Checks a table's windowed groups: entries below the window's first block
/// released, the rest held, at most ⌈(w - 1 + chunk) / bs⌉ + 1 held.
fn check_windows(
    t: &BlockTable,
    windows: &[Option<usize>],
    computed: usize,
    bs: usize,
    chunk: usize,
) -> Result<(), TestCaseError> {
    for (g, w) in windows.iter().enumerate() {
        let row = &t.blocks[g];
        match w {
            None => prop_assert!(!row.contains(&FREED), "a full group released a block"),
            Some(w) => {
                let first = first_needed_block(computed, *w, bs).min(row.len());
                prop_assert!(
                    row[first..].iter().all(|&b| b != FREED),
                    "group {} released a block in its window",
                    g
                );
                let held = row.iter().filter(|&&b| b != FREED).count();
                prop_assert!(
                    held <= (w - 1 + chunk).div_ceil(bs) + 1,
                    "group {} holds {} blocks",
                    g,
                    held
                );
            }
        }
    }
    Ok(())
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            (1usize..80, 0usize..3).prop_map(|(len, prefix)| Op::Alloc { len, prefix }),
            (0usize..8, 1usize..20).prop_map(|(i, n)| Op::Append(i, n)),
            (0usize..8).prop_map(Op::Free),
        ],
        1..120,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// No block owned twice, ref counts equal the tables holding each block,
    /// free lists exact, and after freeing everything all blocks are free; in
    /// every KV group layout, windowed groups release what falls out of their
    /// window, and a prefix hit hands each group a block holding that group's
    /// KV of the same tokens.
    #[test]
    fn block_manager_keeps_its_books(ops in ops(), caching in any::<bool>(), bs in prop::sample::select(vec![1usize, 4, 16]), windows in layouts()) {
        let pool = 40 * windows.len();
        let mut bm = BlockManager::with_groups(pool, bs, caching, windows.clone());
        let prefixes: Vec<Vec<u32>> = (0..3).map(|p| (0..64).map(|t| (t * 7 + p * 1000) as u32).collect()).collect();
        let mut live: Vec<(BlockTable, Vec<u32>, usize)> = Vec::new();
        // What each block was computed with: its group and the tokens up to its end.
        let mut content: HashMap<u32, (usize, Vec<u32>)> = HashMap::new();
        let record = |content: &mut HashMap<u32, (usize, Vec<u32>)>, t: &BlockTable, toks: &[u32], from: usize, to: usize| {
            for (g, row) in t.blocks.iter().enumerate() {
                for (j, &b) in row.iter().enumerate() {
                    // Blocks this compute filled (a block is written by the tokens it holds).
                    if b != FREED && (j + 1) * bs <= to && (j + 1) * bs > from {
                        content.insert(b, (g, toks[..(j + 1) * bs].to_vec()));
                    }
                }
            }
        };
        let mut peak = 0usize;
        for op in ops {
            match op {
                Op::Alloc { len, prefix } => {
                    let mut toks = prefixes[prefix].clone();
                    toks.truncate(len.min(64));
                    toks.extend((0..len.saturating_sub(64)).map(|i| i as u32 + 5000));
                    let cached = bm.cached_prefix(&toks);
                    let hit = cached.len() * bs;
                    prop_assert!(hit < toks.len(), "a hit must leave a token to compute");
                    for (g, row) in cached.blocks.iter().enumerate() {
                        for (j, &b) in row.iter().enumerate() {
                            if b != FREED {
                                prop_assert_eq!(content.get(&b), Some(&(g, toks[..(j + 1) * bs].to_vec())), "group {} block {} of a hit", g, j);
                            }
                        }
                    }
                    if bm.can_allocate(&cached, toks.len()) {
                        let mut t = BlockTable::default();
                        bm.allocate(&mut t, cached, toks.len());
                        check_windows(&t, &windows, hit, bs, toks.len() - hit)?;
                        record(&mut content, &t, &toks, hit, toks.len());
                        bm.cache_full_blocks(&mut t, &toks, toks.len());
                        bm.release_out_of_window(&mut t, toks.len());
                        check_windows(&t, &windows, toks.len(), bs, 1)?;
                        let n = toks.len();
                        live.push((t, toks, n));
                    }
                }
                Op::Append(i, n) => {
                    if let Some((t, toks, computed)) = live.get_mut(i) {
                        let total = *computed + n;
                        if bm.can_append(t, total) {
                            bm.may_append(t, total);
                            check_windows(t, &windows, *computed, bs, n)?;
                            toks.extend((0..n).map(|k| (k * 31 + total) as u32));
                            record(&mut content, t, toks, *computed, total);
                            *computed = total;
                            bm.cache_full_blocks(t, toks, total);
                            bm.release_out_of_window(t, total);
                            check_windows(t, &windows, total, bs, 1)?;
                        }
                    }
                }
                Op::Free(i) => {
                    if i < live.len() {
                        let (mut t, _, _) = live.remove(i);
                        bm.deallocate(&mut t);
                    }
                }
            }
            bm.check_consistency(live.iter().map(|(t, _, _)| t)).map_err(TestCaseError::fail)?;
            // Without the prefix cache (whose free blocks may sit anywhere) and
            // windows (which free blocks mid-table), the lowest free block is
            // handed out first: the blocks in use never reach past the most that
            // were ever in use at once (the backend binds only that prefix of the pool).
            let used: std::collections::BTreeSet<u32> = live.iter().flat_map(|(t, _, _)| t.held()).collect();
            peak = peak.max(used.len());
            if !caching && windows == [None] && let Some(&top) = used.last() {
                prop_assert!((top as usize) < peak, "block {top} in use with at most {peak} ever used at once");
            }
        }
        for (t, _, _) in &mut live {
            bm.deallocate(t);
        }
        bm.check_consistency(std::iter::empty()).map_err(TestCaseError::fail)?;
        bm.reset_prefix_cache();
        prop_assert_eq!(bm.num_free_blocks(), pool);
    }

    /// Over random arrivals, with each step's budget from a `StepBudget` fed a
    /// synthetic step cost, the requests in up to four groups: the step's
    /// budget (never above max_num_batched_tokens) and max_num_seqs hold every
    /// step, the block books balance, and every admitted request finishes.
    #[test]
    fn scheduler_respects_budget_and_finishes_everything(
        reqs in prop::collection::vec((1usize..120, 1usize..40, 0usize..4), 1..30),
        budget in 1usize..96,
        max_seqs in 1usize..8,
        blocks in 16usize..48,
        caching in any::<bool>(),
        target in prop::sample::select(vec![StepTarget::Off, StepTarget::Auto, StepTarget::Factor(3.0), StepTarget::Ms(5.0), StepTarget::Ms(60.0)]),
        groups in 1usize..5,
        windows in layouts(),
    ) {
        let mut step_budget = StepBudget::new(target);
        let bs = 8;
        let blocks = blocks * windows.len();
        let kv = KvGroups { windows: windows.clone(), layer_slot: Vec::new(), slots: 1 };
        let longest = kv.longest_fit(blocks, bs, budget).min(blocks * bs);
        let cfg = SchedulerConfig { max_num_batched_tokens: budget, max_num_seqs: max_seqs, max_model_len: longest };
        let mut s = Scheduler::new(cfg, BlockManager::with_groups(blocks, bs, caching, windows.clone()));
        let mut pending: Vec<Sequence> = reqs
            .iter()
            .enumerate()
            .filter(|(_, (p, o, _))| p + o <= longest)
            .map(|(i, &(p, o, pre))| {
                let prompt: Vec<u32> = (0..p).map(|t| if t < 40 { (t + pre * 100) as u32 } else { (t * 13 + i) as u32 }).collect();
                let params = SamplingParams { max_tokens: Some(o), ..SamplingParams::greedy() };
                // Requests of a few sequences each (the prompts × n of one HTTP
                // request): the scheduler admits the groups in turn.
                let mut seq = Sequence::new(i as u64, prompt, params, p + o);
                seq.group = 1000 + (i % groups) as u64;
                seq
            })
            .collect();
        let admitted = pending.len();
        let mut finished = 0;
        let mut step = 0u64;
        while !pending.is_empty() || s.has_unfinished() {
            // Requests arrive over time.
            if let Some(seq) = step.is_multiple_of(3).then(|| pending.pop()).flatten() {
                s.add(seq);
            }
            step += 1;
            prop_assert!(step < 20_000, "no progress");
            let tokens = step_budget.max_tokens(s.decode_rows(), s.live(), bs, budget);
            prop_assert!(tokens <= budget);
            let out = s.schedule_within(tokens);
            let total: usize = out.scheduled.iter().map(|(_, n)| n).sum();
            prop_assert!(total <= tokens, "{} tokens over a budget of {}", total, tokens);
            prop_assert_eq!(total, out.num_batched_tokens);
            step_budget.cost.observe(total, 10.0 + 2.0 * total as f64);
            prop_assert!(s.running.len() <= max_seqs);
            // Work waiting and nothing running: the step must admit something.
            if s.has_unfinished() && out.preempted.is_empty() {
                prop_assert!(!out.is_empty(), "an idle step with work waiting");
            }
            let mut done = Vec::new();
            for &(id, n) in &out.scheduled {
                let seq = s.seqs.get_mut(&id).unwrap();
                prop_assert!(seq.num_computed_tokens + n <= seq.num_tokens());
                prop_assert!(seq.block_table.len() * bs >= seq.num_computed_tokens + n);
                check_windows(&seq.block_table, &windows, seq.num_computed_tokens, bs, n)?;
                seq.num_computed_tokens += n;
                s.blocks.cache_full_blocks(&mut seq.block_table, &seq.token_ids, seq.num_computed_tokens);
                s.blocks.release_out_of_window(&mut seq.block_table, seq.num_computed_tokens);
                if seq.num_computed_tokens == seq.num_tokens() {
                    let next = (seq.num_tokens() * 2654435761usize % 50000) as u32;
                    seq.token_ids.push(next);
                    if seq.num_tokens() >= seq.max_total_tokens {
                        done.push(id);
                    }
                }
            }
            for id in done {
                s.finish(id);
                finished += 1;
            }
            s.blocks.check_consistency(s.seqs.values().map(|q| &q.block_table)).map_err(TestCaseError::fail)?;
            // With nothing running and something waiting, the head must be admissible next step.
            if s.running.is_empty() && !s.waiting.is_empty() {
                let head = &s.seqs[&s.waiting[0]];
                prop_assert!(head.num_tokens() <= longest);
            }
        }
        prop_assert_eq!(finished, admitted);
        s.blocks.reset_prefix_cache();
        prop_assert_eq!(s.blocks.num_free_blocks(), blocks);
    }
}
