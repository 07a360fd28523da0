//! Each sampling sequence's next token after a step, structured output
//! included: the masks computed on another thread while the step ran are
//! applied here. A greedy constrained sequence takes a masked argmax on the
//! device over the step's logits (one bit mask up, one token id back); a
//! sampling one has its logits row masked on the CPU (`constraint::apply_mask`);
//! the matcher then consumes the chosen token. Unconstrained sequences sample
//! their row on the CPU or take the step's argmax.

use std::collections::HashMap;

use llguidance::Matcher;
use toktrie::SimpleVob;

use super::EngineError;
use super::model_runner::StepRunner;
use super::sequence::{SeqId, Sequence};
use crate::sampling::constraint;
use crate::sampling::{self, SampledLogprobs};

/// A sequence's mask for this step, as its matcher computed it.
pub(super) type Mask = anyhow::Result<SimpleVob>;

/// The device's picks for the greedy constrained sequences that sample this
/// step (`scheduled`, in batch order, before the step's tokens are counted):
/// `Some(token)`, or `None` when the mask allows nothing or failed. Their masks
/// are taken out of `masks`.
pub(super) fn masked_picks(
    runner: &dyn StepRunner,
    seqs: &mut HashMap<SeqId, Sequence>,
    scheduled: &[(SeqId, usize)],
    masks: &mut HashMap<SeqId, Mask>,
) -> Result<HashMap<SeqId, Option<u32>>, EngineError> {
    let mut picks = HashMap::new();
    let mut gpu: Vec<(SeqId, usize, SimpleVob)> = Vec::new();
    let mut row = 0;
    for &(id, n) in scheduled {
        let Some(s) = seqs.get_mut(&id) else { continue };
        if s.num_computed_tokens + n != s.num_tokens() {
            continue;
        }
        if !s.params.needs_logits()
            && let Some(m) = s.matcher.as_deref_mut()
        {
            // Masks come computed for every constrained sampling sequence; one
            // missing is computed here.
            match masks.remove(&id).unwrap_or_else(|| m.compute_mask()) {
                Ok(m) => gpu.push((id, row, m)),
                // A failed mask ends the sequence (as on the CPU path).
                Err(_) => {
                    picks.insert(id, None);
                }
            }
        }
        row += 1;
    }
    if gpu.is_empty() {
        return Ok(picks);
    }
    let args: Vec<(usize, &[u32])> = gpu.iter().map(|(_, r, m)| (*r, m.as_slice())).collect();
    let got = runner.masked_argmax(&args)?;
    for ((id, _, _), t) in gpu.iter().zip(got) {
        picks.insert(*id, t);
    }
    Ok(picks)
}

/// Advances a matcher by the chosen token; returns whether the constraint is
/// done (complete, or the token broke it — the sequence ends either way).
fn advance_matcher(m: &mut Matcher, t: u32, eos_ids: &[u32]) -> bool {
    let broke = !eos_ids.contains(&t) && m.consume_token(t).is_err();
    broke || m.is_stopped()
}

/// A sequence's next token, its logprobs, and whether its constraint is done:
/// the device's pick when it had one (`Some(None)`: nothing was allowed), else
/// its logits row sampled on the CPU (masked first when constrained), else
/// the step's argmax. A constraint that allows nothing ends the sequence with
/// end-of-sequence.
pub(super) fn choose_token(
    seq: &mut Sequence,
    pick: Option<Option<u32>>,
    logits: Option<&[f32]>,
    argmax: u32,
    mask: Option<Mask>,
    eos_ids: &[u32],
) -> (u32, Option<SampledLogprobs>, bool) {
    let eos = eos_ids.first().copied().unwrap_or(0);
    if let Some(pick) = pick {
        return match (pick, seq.matcher.as_deref_mut()) {
            (Some(t), Some(m)) => (t, None, advance_matcher(m, t, eos_ids)),
            _ => (eos, None, false),
        };
    }
    let Some(row) = logits else {
        return (argmax, None, false);
    };
    let (ctx, out) = (&seq.token_ids[..], &seq.token_ids[seq.prompt_len..]);
    match seq.matcher.as_deref_mut() {
        Some(m) => {
            let mut masked = row.to_vec();
            let mask = mask.unwrap_or_else(|| m.compute_mask());
            match constraint::apply_mask(mask, &mut masked) {
                Ok(true) => {
                    let (t, lp) = sampling::sample(&masked, &seq.params, ctx, out, &mut seq.rng);
                    (t, lp, advance_matcher(m, t, eos_ids))
                }
                _ => (eos, None, false),
            }
        }
        None => {
            let (t, lp) = sampling::sample(row, &seq.params, ctx, out, &mut seq.rng);
            (t, lp, false)
        }
    }
}
