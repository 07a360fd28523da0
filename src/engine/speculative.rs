//! Speculative decoding by prompt lookup (vLLM's `ngram` method, llama.cpp's
//! `ngram` drafts) or by a draft model (`draft_model`, `super::draft_model`):
//! before a step, a decoding sequence drafts up to k tokens (by finding its
//! last n tokens earlier in its prompt and output and copying what followed
//! them, or by the draft model's greedy decoding); the step computes the pending token and the
//! drafts as one short chunk with a logits row each; the longest prefix of
//! drafts that equals the model's own greedy picks is accepted, plus the pick
//! after it, and the KV of the rejected positions is dropped (the sequence's
//! computed length is cut back; its trailing blocks are freed).
//!
//! Each row's logits are those a plain decode step computes for that
//! position (the gemm is row-independent and attention's reduction order
//! depends only on the key count, never on the chunk), so greedy output is
//! the same tokens as without speculation, bit for bit. Sampled requests
//! verify by rejection sampling (`sampling::rejection`): each draft is kept
//! with the probability the request's distribution gives it, and the first
//! one rejected is replaced by a draw from the rest, so the output follows
//! the same distribution as without speculation.

pub use crate::config::SpeculativeConfig;

use super::scheduler::{Scheduler, SchedulerOutput};
pub use super::sequence::SpecState;
use super::sequence::{SeqStatus, Sequence};
use crate::sampling::{self, rejection::Verdict, rejection::accept_or_resample};

/// Drafts for the running sequences that decode next step, appended to
/// their tokens (`Sequence::num_draft`), each as its `spec_cfg` says (prompt
/// lookup, or `model`, the draft model, for `draft_model`); at most as many
/// drafted tokens in all as the step has logits rows to spare (`max_num_seqs`
/// less the running sequences), none past a sequence's length limit or its
/// `max_tokens`, and no more than their expected acceptance pays for at
/// `row_cost` (one more row's cost over the cost of a token a plain step
/// emits: near 1 on a CPU adapter with a large batch, where speculation
/// backs off, near 0 on a GPU) plus, for the draft model, `draft_cost` (one
/// draft token's cost over the same). Returns the tokens drafted.
pub(super) fn draft(
    sched: &mut Scheduler,
    row_cost: f64,
    draft_cost: f64,
    model: Option<&mut super::draft_model::DraftModel>,
) -> Result<usize, super::EngineError> {
    let mut rows = sched.cfg.max_num_seqs.saturating_sub(sched.running.len());
    let mut drafted = 0;
    let mut by_model: Vec<(super::SeqId, usize)> = Vec::new();
    for id in sched.running.clone() {
        let Some(seq) = sched.seqs.get_mut(&id) else { continue };
        let Some(cfg) = &seq.spec_cfg else { continue };
        let decodes = seq.status == SeqStatus::Running && seq.num_computed_tokens + 1 == seq.num_tokens();
        if rows == 0 || !decodes || seq.matcher.is_some() || seq.num_draft > 0 {
            continue;
        }
        if seq.spec.skip > 0 {
            seq.spec.skip -= 1;
            continue;
        }
        let want = if seq.spec.k == 0 {
            cfg.num_speculative_tokens
        } else {
            seq.spec.k
        };
        let out = seq.num_tokens() - seq.prompt_len;
        // Drafts the step may use: tokens left to max_tokens (the last pick
        // is the model's own), and positions left to the length limit.
        let left = seq.params.max_tokens.map_or(usize::MAX, |m| m.saturating_sub(out + 1));
        let room = seq.max_total_tokens.saturating_sub(seq.num_tokens() + 1);
        let k = want.min(cfg.num_speculative_tokens).min(left).min(room).min(rows);
        let by_draft_model = cfg.uses_draft_model();
        let cost = row_cost + if by_draft_model { draft_cost } else { 0.0 };
        let k = if cfg.adaptive { seq.spec.worth(k, cost) } else { k };
        if k == 0 {
            continue;
        }
        if by_draft_model {
            by_model.push((id, k));
            rows -= k;
            continue;
        }
        let d = ngram_draft(&seq.token_ids, cfg.prompt_lookup_min, cfg.prompt_lookup_max, k);
        seq.num_draft = d.len();
        seq.token_ids.extend_from_slice(&d);
        rows -= d.len();
        drafted += d.len();
    }
    if let Some(model) = model {
        model.forget(|id| sched.seqs.contains_key(&id));
        if !by_model.is_empty() {
            let reqs: Vec<super::draft_model::DraftRequest> = by_model
                .iter()
                .map(|&(id, k)| super::draft_model::DraftRequest {
                    id,
                    tokens: &sched.seqs[&id].token_ids,
                    k,
                })
                .collect();
            let drafts = model.propose(&reqs)?;
            for ((id, _), d) in by_model.iter().zip(drafts) {
                let seq = sched.seqs.get_mut(id).expect("running");
                seq.num_draft = d.len();
                seq.token_ids.extend_from_slice(&d);
                drafted += d.len();
            }
        }
    }
    Ok(drafted)
}

/// One more row's cost over the cost of a token a plain step of `decodes`
/// rows emits, from the fitted step cost `ms = fixed + per_token · tokens`:
/// per_token · decodes / (fixed + per_token · decodes); 0 before the fit.
pub(super) fn row_cost(fit: Option<(f64, f64)>, decodes: usize) -> f64 {
    match fit {
        Some((fixed, per_token)) if decodes > 0 => {
            let d = decodes as f64;
            per_token * d / (fixed + per_token * d)
        }
        _ => 0.0,
    }
}

/// One draft token's cost over the cost of a token a plain step of
/// `decodes` rows emits: a drafting round's milliseconds (`round_ms`) over
/// the fitted plain step's; 0 before both are measured.
pub(super) fn draft_cost(fit: Option<(f64, f64)>, decodes: usize, round_ms: Option<f64>) -> f64 {
    match (fit, round_ms) {
        (Some((fixed, per_token)), Some(ms)) if decodes > 0 => ms / (fixed + per_token * decodes as f64),
        _ => 0.0,
    }
}

/// After scheduling: a drafting sequence keeps the drafts its chunk covers
/// (a step's budget may cut it short) and drops the rest, or all of them
/// where it was not scheduled (preempted, or no budget left); then, where
/// the sequences admitted this step left fewer logits rows than the drafts
/// need (`max_num_seqs` rows a step), drafts are dropped until they fit.
pub(super) fn settle(sched: &mut Scheduler, plan: &mut SchedulerOutput) {
    for (id, seq) in sched.seqs.iter_mut() {
        if seq.num_draft == 0 {
            continue;
        }
        let n = plan.scheduled.iter().find(|(s, _)| s == id).map_or(0, |&(_, n)| n);
        let keep = if n == 0 { 0 } else { seq.num_draft.min(n - 1) };
        let len = seq.token_ids.len() - (seq.num_draft - keep);
        seq.token_ids.truncate(len);
        seq.num_draft = keep;
    }
    let rows: usize = plan
        .scheduled
        .iter()
        .map(|&(id, n)| {
            let s = &sched.seqs[&id];
            if s.num_computed_tokens + n == s.num_tokens() {
                1 + s.num_draft
            } else {
                0
            }
        })
        .sum();
    let mut excess = rows.saturating_sub(sched.cfg.max_num_seqs);
    for (id, n) in plan.scheduled.iter_mut() {
        if excess == 0 {
            break;
        }
        let Some(seq) = sched.seqs.get_mut(id) else { continue };
        let cut = seq.num_draft.min(excess);
        if cut > 0 {
            let len = seq.token_ids.len() - cut;
            seq.token_ids.truncate(len);
            seq.num_draft -= cut;
            *n -= cut;
            plan.num_batched_tokens -= cut;
            excess -= cut;
        }
    }
}

/// After the step computed a drafting sequence's pending token and its
/// drafts (`picks`: the model's greedy token after each of them): drops the
/// drafts from its tokens, its computed length back to the pending token,
/// and returns the tokens to emit (the accepted drafts, then the model's own
/// next token) with how many of them had their KV computed (the accepted).
pub(super) fn verify(seq: &mut Sequence, picks: &[u32], max_k: usize) -> (Vec<u32>, usize) {
    let pending = seq.token_ids.len() - seq.num_draft;
    let j = accepted(&seq.token_ids[pending..], picks);
    roll_back(seq, j, max_k);
    (picks[..=j].to_vec(), j)
}

/// `verify` for a sampled request, from its rows of logits (`vocab` wide,
/// one for the pending token and one a draft): each draft accepted or
/// replaced by rejection sampling in turn, and after drafts all accepted, a
/// draw from the last row.
pub(super) fn verify_sampled(seq: &mut Sequence, logits: &[f32], vocab: usize, max_k: usize) -> (Vec<u32>, usize) {
    let k = seq.num_draft;
    let pending = seq.token_ids.len() - k;
    let mut out = Vec::with_capacity(k + 1);
    for (i, row) in logits.chunks_exact(vocab).take(k + 1).enumerate() {
        let (ids, probs) = sampling::filtered_probs(row, &seq.params);
        if i == k {
            out.push(ids[sampling::draw(&probs, &mut seq.rng)] as u32);
            break;
        }
        let d = seq.token_ids[pending + i];
        match accept_or_resample(&ids, &probs, d, &mut seq.rng) {
            Verdict::Accepted => out.push(d),
            Verdict::Resampled(t) => {
                out.push(t);
                break;
            }
        }
    }
    let j = out.len().saturating_sub(1);
    roll_back(seq, j, max_k);
    (out, j)
}

/// After a verified sequence's tokens were emitted (and it did not finish):
/// the `j` accepted drafts' KV is the cache's now, so the sequence stands as
/// after that many plain decodes; blocks past its tokens go back.
pub(super) fn commit_accepted(sched: &mut Scheduler, id: super::SeqId, j: usize) {
    let Some(seq) = sched.seqs.get_mut(&id) else { return };
    seq.num_computed_tokens += j;
    sched
        .blocks
        .note_computed(&mut seq.block_table, &seq.token_ids, seq.num_computed_tokens);
    let total = seq.num_tokens();
    sched.blocks.truncate(&mut seq.block_table, total);
}

/// Drops a verified sequence's drafts from its tokens and its computed
/// length back to the pending token, and adapts its draft length to the
/// `j` accepted.
fn roll_back(seq: &mut Sequence, j: usize, max_k: usize) {
    let k = seq.num_draft;
    let pending = seq.token_ids.len() - k;
    seq.spec.update(k, j, max_k);
    seq.token_ids.truncate(pending);
    seq.num_computed_tokens = pending;
    seq.num_draft = 0;
}

/// Up to `k` tokens that followed the most recent earlier occurrence of the
/// last n tokens of `tokens`, for the longest n in `min_n..=max_n` that occurs
/// (none: empty).
pub fn ngram_draft(tokens: &[u32], min_n: usize, max_n: usize, k: usize) -> Vec<u32> {
    let len = tokens.len();
    // (n < len: a tail n-gram needs an earlier start; the bound keeps the
    // loop to real lengths whatever max_n a caller passes.)
    for n in (min_n.max(1)..=max_n.min(len.saturating_sub(1))).rev() {
        let tail = &tokens[len - n..];
        // The latest start i < len - n whose n tokens equal the tail.
        if let Some(i) = (0..len - n).rev().find(|&i| &tokens[i..i + n] == tail) {
            let from = i + n;
            return tokens[from..(from + k).min(len)].to_vec();
        }
    }
    Vec::new()
}

/// Drafts the model's picks confirm: the length of the longest prefix of
/// `drafts` where each equals the pick before it (`picks[i]` is the model's
/// token after the pending token and `drafts[..i]`).
pub fn accepted(drafts: &[u32], picks: &[u32]) -> usize {
    drafts.iter().zip(picks).take_while(|(d, p)| d == p).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drafts_copy_what_followed_the_latest_match_of_the_longest_ngram() {
        // "1 2 3 9" then "1 2 3 7 8", ending in "1 2 3": the latest match wins.
        let t = [1, 2, 3, 9, 5, 1, 2, 3, 7, 8, 6, 1, 2, 3];
        assert_eq!(ngram_draft(&t, 2, 4, 3), vec![7, 8, 6]);
        assert_eq!(ngram_draft(&t, 2, 4, 10), vec![7, 8, 6, 1, 2, 3]);
        // No earlier occurrence of any tail n-gram: no draft.
        assert!(ngram_draft(&[1, 2, 3, 4], 1, 3, 4).is_empty());
        // A shorter n matches where the longer does not.
        assert_eq!(ngram_draft(&[5, 1, 9, 4, 1], 1, 3, 2), vec![9, 4]);
        assert!(ngram_draft(&[], 1, 3, 2).is_empty());
    }

    #[test]
    fn the_longest_agreeing_prefix_is_accepted() {
        assert_eq!(accepted(&[4, 5, 6], &[4, 5, 7, 8]), 2);
        assert_eq!(accepted(&[4, 5, 6], &[3, 5, 6, 8]), 0);
        assert_eq!(accepted(&[4, 5, 6], &[4, 5, 6, 8]), 3);
        assert_eq!(accepted(&[], &[1]), 0);
    }

    #[test]
    fn the_draft_length_follows_what_is_accepted_and_misses_back_off() {
        let mut s = SpecState::default();
        s.update(4, 4, 6);
        assert_eq!((s.k, s.skip), (6, 0));
        s.update(6, 2, 6);
        assert_eq!((s.k, s.skip), (3, 0));
        s.update(3, 0, 6);
        assert_eq!((s.k, s.skip, s.misses), (1, 2, 1));
        s.update(1, 0, 6);
        assert_eq!((s.k, s.skip), (1, 4));
        for _ in 0..10 {
            s.update(1, 0, 6);
        }
        assert_eq!(s.skip, 32);
        s.update(1, 1, 6);
        assert_eq!((s.k, s.skip, s.misses), (2, 0, 0));
    }

    #[test]
    fn drafts_are_priced_against_the_step() {
        let mut s = SpecState::default();
        // Before any draft: the prior rate 0.7; with the margin, 0.7^3 = 0.34 > 1.25 · 0.25 > 0.7^4.
        assert_eq!(s.worth(8, 0.25), 3);
        assert_eq!(s.worth(2, 0.25), 2);
        assert_eq!(s.worth(8, 0.0), 8);
        assert_eq!(s.worth(8, 0.6), 0);
        // Drafts accepted whole raise the rate; one rejected at once lowers it.
        for _ in 0..10 {
            s.update(4, 4, 8);
        }
        assert!(s.rate() > 0.9 && s.worth(8, 0.3) == 8, "{}", s.rate());
        for _ in 0..20 {
            s.update(4, 0, 8);
        }
        assert!(s.rate() < 0.25 && s.worth(8, 0.3) == 0, "{}", s.rate());
        // A one-row step on a CPU adapter (fixed 20 ms, 10 ms a row): a row
        // costs a third of a token; sixteen rows: most of one.
        assert!((row_cost(Some((20.0, 10.0)), 1) - 1.0 / 3.0).abs() < 1e-12);
        assert!(row_cost(Some((20.0, 10.0)), 16) > 0.85);
        assert_eq!(row_cost(None, 4), 0.0);
        // A GPU: rows next to free.
        assert!(row_cost(Some((8.0, 0.01)), 16) < 0.02);
    }

    #[test]
    fn drafts_give_way_to_the_rows_of_sequences_admitted_beside_them() {
        use crate::engine::{BlockManager, Scheduler, SchedulerConfig, Sequence};
        let cfg = SchedulerConfig {
            max_num_batched_tokens: 64,
            max_num_seqs: 2,
            max_model_len: 64,
        };
        let mut sched = Scheduler::new(cfg, BlockManager::new(32, 4, false));
        // `a` has run its prompt and holds one pending token.
        sched.add(Sequence::new(
            1,
            vec![1, 2, 3, 1, 2],
            crate::SamplingParams::greedy(),
            64,
        ));
        let plan = sched.schedule();
        assert_eq!(plan.scheduled, vec![(1, 5)]);
        let a = sched.seqs.get_mut(&1).unwrap();
        a.num_computed_tokens = 5;
        a.token_ids.push(3);
        // `b` waits; one row is spare, so `a` drafts one token ("1 2 3" was followed by "1").
        sched.add(Sequence::new(2, vec![7, 8, 9], crate::SamplingParams::greedy(), 64));
        let spec = SpeculativeConfig {
            prompt_lookup_max: 3,
            prompt_lookup_min: 1,
            ..SpeculativeConfig::ngram(3)
        };
        sched.seqs.get_mut(&1).unwrap().spec_cfg = Some(spec);
        assert_eq!(draft(&mut sched, 0.0, 0.0, None).unwrap(), 1);
        let mut plan = sched.schedule();
        assert_eq!(plan.scheduled, vec![(1, 2), (2, 3)]);
        // `b`'s prompt ends this step and samples: two rows for two sequences, no room for the draft.
        settle(&mut sched, &mut plan);
        assert_eq!(plan.scheduled, vec![(1, 1), (2, 3)]);
        assert_eq!(plan.num_batched_tokens, 4);
        let a = &sched.seqs[&1];
        assert_eq!((a.num_draft, a.token_ids.len()), (0, 6));
    }

    #[test]
    fn configs_are_checked() {
        let c = SpeculativeConfig::parse(r#"{"method": "ngram", "num_speculative_tokens": 3}"#).unwrap();
        assert_eq!((c.prompt_lookup_min, c.prompt_lookup_max), (2, 4));
        for bad in [
            r#"{"method": "eagle", "num_speculative_tokens": 3}"#,
            r#"{"num_speculative_tokens": 0}"#,
            r#"{"num_speculative_tokens": 3, "prompt_lookup_min": 5}"#,
            r#"{"num_speculative_tokens": 3, "draft": 1}"#,
            r#"{"num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 18446744073709551615}"#,
            r#"{"num_speculative_tokens": 3, "prompt_lookup_max": 17}"#,
            r#"{"num_speculative_tokens": 65}"#,
            "not json",
        ] {
            assert!(SpeculativeConfig::parse(bad).is_err(), "{bad}");
        }
        // A request's own settings are held to the same bounds.
        let r = crate::config::RequestSpeculation {
            prompt_lookup_min: Some(1),
            prompt_lookup_max: Some(usize::MAX),
            ..Default::default()
        };
        let e = crate::config::RequestSpeculation::resolve(Some(&r), None).unwrap_err();
        assert!(e.contains("prompt_lookup_max must be at most 16"), "{e}");
    }

    /// A lookup bound far past the sequence's length costs no more than one
    /// within it (it once looped to `usize::MAX` on the engine thread).
    #[test]
    fn a_huge_lookup_bound_stops_at_the_sequence_length() {
        let t: Vec<u32> = (0..50).map(|i| i % 7).collect();
        assert_eq!(ngram_draft(&t, 1, usize::MAX, 3), ngram_draft(&t, 1, 49, 3));
        assert!(ngram_draft(&[1], 1, usize::MAX, 3).is_empty());
    }
}
