//! Speculative decoding by prompt lookup (`engine::speculative`) on the
//! default model: greedy output with speculation is the output without it,
//! token for token, alone and batched, under chunked prefill and preemption,
//! with the block pool's books balanced after every step; drafts are accepted;
//! sampled output follows the target distribution (rejection sampling).

mod common;

use std::collections::HashMap;

use common::*;
use rand::Rng;
use wllm::config::SpeculativeConfig;
use wllm::engine::LlmEngine;
use wllm::{EngineConfig, KvDtype, RequestOutput, SamplingParams};

fn config(kv_tokens: usize, budget: usize, spec: Option<usize>) -> EngineConfig {
    EngineConfig {
        model: default_model_path(),
        kv_cache_memory: Some(kv_tokens as u64 * KvDtype::default().row_bytes(11520)),
        max_num_batched_tokens: budget,
        max_num_seqs: 16,
        max_model_len: Some(kv_tokens.min(512)),
        speculative: spec.map(|k| SpeculativeConfig {
            method: "ngram".into(),
            num_speculative_tokens: k,
            prompt_lookup_max: 4,
            prompt_lookup_min: 1,
            // Drafts that depend on no timing: the same steps every run.
            adaptive: false,
        }),
        ..Default::default()
    }
}

fn run_all(core: &mut LlmEngine, reqs: &[(Vec<u32>, SamplingParams)]) -> Vec<Vec<u32>> {
    let ids: Vec<u64> = reqs
        .iter()
        .map(|(p, s)| core.add_request(p.clone(), s.clone()).unwrap())
        .collect();
    let mut out: HashMap<u64, Vec<RequestOutput>> = HashMap::new();
    while core.has_unfinished() {
        for o in core.step().unwrap() {
            out.entry(o.id).or_default().push(o);
        }
        core.check_blocks().unwrap();
    }
    ids.iter()
        .map(|id| {
            let outs = out.remove(id).unwrap_or_default();
            assert_eq!(
                outs.iter().filter(|o| o.finish_reason.is_some()).count(),
                1,
                "one finish"
            );
            let last = outs.last().expect("outputs");
            assert!(
                last.finish_reason.is_some() && last.metrics.is_some(),
                "the last output finishes the request and carries its metrics"
            );
            outs.iter().flat_map(|o| o.token_ids.clone()).collect()
        })
        .collect()
}

/// Prompts that invite copying: a random passage said twice and begun a
/// third time (the model continues it, so lookup drafts are often right),
/// and plain random ones (drafts mostly wrong).
fn requests() -> Vec<(Vec<u32>, SamplingParams)> {
    let mut r = rng(44);
    (0..10)
        .map(|i| {
            let passage: Vec<u32> = (0..20 + 7 * i).map(|_| r.random_range(100..20000)).collect();
            let p: Vec<u32> = if i % 3 == 2 {
                (0..30 + 11 * i).map(|_| r.random_range(100..20000)).collect()
            } else {
                let mut p = passage.clone();
                p.extend(&passage);
                p.extend(&passage[..5]);
                p
            };
            let mut s = SamplingParams::greedy();
            s.max_tokens = Some(12 + 5 * i);
            s.ignore_eos = i % 2 == 0;
            (p, s)
        })
        .collect()
}

#[test]
fn greedy_output_with_speculation_is_the_output_without() {
    let reqs = requests();
    let ks = &kernels().ctx;
    let mut plain = LlmEngine::with_context(ks, &config(2048, 512, None)).unwrap();
    let want: Vec<Vec<u32>> = reqs
        .iter()
        .map(|q| run_all(&mut plain, std::slice::from_ref(q)).remove(0))
        .collect();
    drop(plain);
    // Alone, each request with up to 5 drafts a step.
    let mut spec = LlmEngine::with_context(ks, &config(2048, 512, Some(5))).unwrap();
    for (i, q) in reqs.iter().enumerate() {
        assert_eq!(
            run_all(&mut spec, std::slice::from_ref(q)).remove(0),
            want[i],
            "request {i} alone"
        );
    }
    let m = &spec.metrics;
    eprintln!(
        "alone: {} drafts, {} tokens drafted, {} accepted, {} steps",
        m.spec_decode_num_drafts_total,
        m.spec_decode_num_draft_tokens_total,
        m.spec_decode_num_accepted_tokens_total,
        m.num_steps_total
    );
    assert!(
        m.spec_decode_num_accepted_tokens_total > 0,
        "no draft was ever accepted"
    );
    drop(spec);
    // All together in a pool too small for them (preemption) with 48-token
    // steps (chunked prefill; budgets that cut drafts short).
    let mut spec = LlmEngine::with_context(ks, &config(400, 48, Some(7))).unwrap();
    let got = run_all(&mut spec, &reqs);
    let m = &spec.metrics;
    eprintln!(
        "batched: {} preemptions, {} drafts, {} tokens drafted, {} accepted",
        m.num_preemptions_total,
        m.spec_decode_num_drafts_total,
        m.spec_decode_num_draft_tokens_total,
        m.spec_decode_num_accepted_tokens_total
    );
    assert!(m.num_preemptions_total > 0, "the pool was meant to force preemption");
    assert!(m.spec_decode_num_accepted_tokens_total > 0);
    for i in 0..reqs.len() {
        assert_eq!(got[i], want[i], "request {i} batched");
    }
    drop(spec);
    // Three sequences a step at most: drafts only in the rows the running
    // sequences leave (the unit test `drafts_give_way_…` covers admissions).
    let mut cfg = config(2048, 512, Some(7));
    cfg.max_num_seqs = 3;
    let mut spec = LlmEngine::with_context(ks, &cfg).unwrap();
    let got = run_all(&mut spec, &reqs);
    for i in 0..reqs.len() {
        assert_eq!(got[i], want[i], "request {i}, three rows a step");
    }
}

#[test]
fn bad_speculative_configs_are_refused_at_start() {
    let mut cfg = config(256, 64, Some(4));
    cfg.speculative.as_mut().unwrap().num_speculative_tokens = 0;
    let e = LlmEngine::with_context(&kernels().ctx, &cfg).err().expect("refused");
    assert!(e.to_string().contains("num_speculative_tokens"), "{e}");
}

/// The distribution a request with temperature `t` and top-k 3 draws the
/// token after `prompt` from, from the plain engine's logprobs (raw
/// log-softmax, so `exp((lp - lp_max) / t)` over the top three is exact).
fn top3_distribution(core: &mut LlmEngine, prompt: &[u32], t: f64) -> Vec<(u32, f64)> {
    let mut s = SamplingParams::greedy();
    s.max_tokens = Some(1);
    s.logprobs = Some(3);
    let id = core.add_request(prompt.to_vec(), s).unwrap();
    let mut top = Vec::new();
    while core.has_unfinished() {
        for o in core.step().unwrap() {
            if o.id == id && !o.logprobs.is_empty() {
                top = o.logprobs[0].top.clone();
            }
        }
    }
    assert_eq!(top.len(), 3);
    let m = f64::from(top[0].logprob);
    let w: Vec<f64> = top.iter().map(|l| ((f64::from(l.logprob) - m) / t).exp()).collect();
    let sum: f64 = w.iter().sum();
    top.iter().zip(w).map(|(l, w)| (l.token_id, w / sum)).collect()
}

/// Sampled requests verify drafts by rejection sampling: the outputs follow
/// the distribution plain decoding draws from. A prompt the model copies
/// (so the second token is drafted), temperature 3, top-k 3, three tokens
/// each (the first two counted), 600 seeds batched with speculation; the exact distribution of the
/// token pair from the plain engine's logprobs; Pearson's chi-square of the
/// pairs against it stays below its 0.1 % critical value. Accepting a draft
/// with probability sqrt(p) instead of p fails it (chi-square 37.8 against
/// the 26.3 allowed on 8 degrees of freedom).
#[test]
fn sampled_output_with_speculation_follows_the_target_distribution() {
    let t = 3.0;
    let mut r = rng(45);
    let passage: Vec<u32> = (0..24).map(|_| r.random_range(100..20000)).collect();
    let mut prompt = passage.clone();
    prompt.extend(&passage);
    prompt.extend(&passage[..6]);
    let ks = &kernels().ctx;
    // The exact distribution of (first, second) token.
    let mut plain = LlmEngine::with_context(ks, &config(4096, 512, None)).unwrap();
    let mut exact: Vec<([u32; 2], f64)> = Vec::new();
    for (a, pa) in top3_distribution(&mut plain, &prompt, t) {
        let mut p2 = prompt.clone();
        p2.push(a);
        for (b, pb) in top3_distribution(&mut plain, &p2, t) {
            exact.push(([a, b], pa * pb));
        }
    }
    drop(plain);
    let n = 600u64;
    let reqs: Vec<(Vec<u32>, SamplingParams)> = (0..n)
        .map(|seed| {
            let mut s = SamplingParams::greedy();
            s.temperature = t as f32;
            s.top_k = 3;
            // A third token, so that the second may be drafted (the last is always the model's pick).
            s.max_tokens = Some(3);
            s.ignore_eos = true;
            s.seed = Some(seed);
            (prompt.clone(), s)
        })
        .collect();
    let mut spec = LlmEngine::with_context(ks, &config(4096, 512, Some(2))).unwrap();
    let got = run_all(&mut spec, &reqs);
    let m = &spec.metrics;
    eprintln!(
        "sampled: {} drafts, {} tokens drafted, {} accepted",
        m.spec_decode_num_drafts_total, m.spec_decode_num_draft_tokens_total, m.spec_decode_num_accepted_tokens_total
    );
    assert!(
        m.spec_decode_num_drafts_total >= n / 2,
        "sampled requests were meant to draft"
    );
    assert!(m.spec_decode_num_accepted_tokens_total > 0);
    assert!(
        m.spec_decode_num_accepted_tokens_total < m.spec_decode_num_draft_tokens_total,
        "some drafts were meant to be rejected (temperature 3)"
    );
    let mut counts = vec![0.0; exact.len()];
    for g in &got {
        let i = exact.iter().position(|(pair, _)| pair[..] == g[..2]);
        let i = i.unwrap_or_else(|| panic!("{g:?} is outside the top-3 pairs {exact:?}"));
        counts[i] += 1.0;
    }
    // Cells expected below 5 pooled, as Pearson's test asks.
    let (mut cells, mut rest) = (Vec::new(), (0.0, 0.0));
    for (c, (_, p)) in counts.iter().zip(&exact) {
        let e = p * n as f64;
        if e >= 5.0 {
            cells.push((*c, e));
        } else {
            rest = (rest.0 + c, rest.1 + e);
        }
    }
    if rest.1 > 0.0 {
        cells.push(rest);
    }
    let chi2: f64 = cells.iter().map(|(c, e)| (c - e).powi(2) / e).sum();
    let df = cells.len() - 1;
    // Wilson–Hilferty: the chi-square quantile at 1 - 0.001 (z = 3.09).
    let d = df as f64;
    let crit = d * (1.0 - 2.0 / (9.0 * d) + 3.09 * (2.0 / (9.0 * d)).sqrt()).powi(3);
    eprintln!("chi-square {chi2:.1} on {df} degrees of freedom (critical {crit:.1}); cells {cells:?}");
    assert!(df >= 3, "the outputs were meant to vary");
    assert!(
        chi2 < crit,
        "chi-square {chi2:.1} ≥ {crit:.1} on {df} degrees of freedom"
    );
}
