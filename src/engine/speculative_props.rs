//! Property tests of speculative decoding's bookkeeping without a model:
//! a stand-in greedy "model" (the next token a function of the last two,
//! from a vocabulary of 11, so lookup drafts are often right and often
//! wrong) behind the scheduler, the block manager, drafting, `settle`,
//! verification and rollback, stepped as `LlmEngine::step` steps them.
//! Whatever the arrivals, budgets, pool sizes (preemption) and per-request
//! settings: every step keeps to its token budget and its `max_num_seqs`
//! logits rows, the books balance, every request finishes, and each one's
//! output is the tokens plain greedy decoding gives.

use proptest::prelude::*;

use super::speculative::{commit_accepted, draft, settle, verify};
use super::{BlockManager, Scheduler, SchedulerConfig, Sequence};
use crate::SamplingParams;
use crate::config::SpeculativeConfig;

/// The stand-in model's greedy pick after `tokens`.
fn next(tokens: &[u32]) -> u32 {
    let n = tokens.len();
    let a = tokens[n - 1];
    let b = if n > 1 { tokens[n - 2] } else { 5 };
    (a * 7 + b * 3 + 1) % 11
}

/// What plain greedy decoding emits after `prompt`.
fn plain(prompt: &[u32], max_tokens: usize) -> Vec<u32> {
    let mut t = prompt.to_vec();
    for _ in 0..max_tokens {
        t.push(next(&t));
    }
    t[prompt.len()..].to_vec()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]

    #[test]
    fn speculation_keeps_budgets_books_and_greedy_output(
        reqs in prop::collection::vec((1usize..60, 1usize..40, prop::option::of((1usize..8, 1usize..4))), 1..16),
        budget in 4usize..64,
        max_seqs in 1usize..8,
        blocks in 12usize..40,
        caching in any::<bool>(),
        adaptive in any::<bool>(),
        row_cost in 0.0f64..0.6,
    ) {
        let bs = 4;
        let longest = blocks * bs;
        let cfg = SchedulerConfig { max_num_batched_tokens: budget, max_num_seqs: max_seqs, max_model_len: longest };
        let mut s = Scheduler::new(cfg, BlockManager::new(blocks, bs, caching));
        let mut want = std::collections::HashMap::new();
        let mut pending: Vec<Sequence> = reqs
            .iter()
            .enumerate()
            .filter(|(_, (p, o, _))| p + o <= longest)
            .map(|(i, &(p, o, spec))| {
                let prompt: Vec<u32> = (0..p).map(|t| ((t * 5 + i) % 11) as u32).collect();
                want.insert(i as u64, plain(&prompt, o));
                let params = SamplingParams { max_tokens: Some(o), ..SamplingParams::greedy() };
                let mut seq = Sequence::new(i as u64, prompt, params, p + o);
                seq.spec_cfg = spec.map(|(k, min)| SpeculativeConfig {
                    prompt_lookup_min: min,
                    prompt_lookup_max: min + 2,
                    adaptive,
                    ..SpeculativeConfig::ngram(k)
                });
                seq
            })
            .collect();
        let admitted = pending.len();
        let mut got: std::collections::HashMap<u64, Vec<u32>> = std::collections::HashMap::new();
        let mut step = 0u64;
        while !pending.is_empty() || s.has_unfinished() {
            if let Some(seq) = step.is_multiple_of(2).then(|| pending.pop()).flatten() {
                s.add(seq);
            }
            step += 1;
            prop_assert!(step < 20_000, "no progress");
            draft(&mut s, row_cost, 0.0, None).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let mut plan = s.schedule_within(budget);
            settle(&mut s, &mut plan);
            let total: usize = plan.scheduled.iter().map(|(_, n)| n).sum();
            prop_assert!(total <= budget, "{} tokens over a budget of {}", total, budget);
            prop_assert_eq!(total, plan.num_batched_tokens);
            prop_assert!(s.running.len() <= max_seqs);
            let mut rows = 0;
            let mut done = Vec::new();
            for &(id, n) in &plan.scheduled {
                let seq = s.seqs.get_mut(&id).unwrap();
                prop_assert!(seq.num_computed_tokens + n <= seq.num_tokens());
                prop_assert!(seq.block_table.len() * bs >= seq.num_computed_tokens + n);
                let pending_at = seq.num_computed_tokens;
                seq.num_computed_tokens += n;
                let spec = if seq.num_draft > 0 {
                    // A verify chunk: the pending token and every draft kept.
                    prop_assert_eq!(seq.num_computed_tokens, seq.num_tokens());
                    let k = seq.num_draft;
                    let picks: Vec<u32> = (0..=k).map(|i| next(&seq.token_ids[..pending_at + 1 + i])).collect();
                    let max_k = seq.spec_cfg.as_ref().unwrap().num_speculative_tokens;
                    rows += k + 1;
                    Some(verify(seq, &picks, max_k))
                } else {
                    None
                };
                s.blocks.note_computed(&mut seq.block_table, &seq.token_ids, seq.num_computed_tokens);
                if seq.num_computed_tokens != seq.num_tokens() {
                    continue;
                }
                let toks = match &spec {
                    Some((toks, _)) => toks.clone(),
                    None => {
                        rows += 1;
                        vec![next(&seq.token_ids)]
                    }
                };
                let out = got.entry(id).or_default();
                let mut finished = false;
                for t in toks {
                    seq.token_ids.push(t);
                    out.push(t);
                    if seq.num_tokens() >= seq.max_total_tokens {
                        finished = true;
                        break;
                    }
                }
                match (finished, spec) {
                    (true, _) => done.push(id),
                    (false, Some((_, j))) => commit_accepted(&mut s, id, j),
                    (false, None) => {}
                }
            }
            prop_assert!(rows <= max_seqs, "{} logits rows over max_num_seqs {}", rows, max_seqs);
            for id in done {
                s.finish(id);
            }
            s.blocks.check_consistency(s.seqs.values().map(|q| &q.block_table)).map_err(TestCaseError::fail)?;
        }
        prop_assert_eq!(got.len(), admitted);
        for (id, out) in &got {
            prop_assert_eq!(out, &want[id], "request {}", id);
        }
        s.blocks.reset_prefix_cache();
        prop_assert_eq!(s.blocks.num_free_blocks(), blocks);
    }
}
