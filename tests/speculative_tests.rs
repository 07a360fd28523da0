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
            prompt_lookup_max: 4,
            prompt_lookup_min: 1,
            // Drafts that depend on no timing: the same steps every run.
            adaptive: false,
            ..SpeculativeConfig::ngram(k)
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

/// Outputs of requests run alone, the same run together, and the batched run's (drafted, accepted).
type AloneAndBatched = (Vec<Vec<u32>>, Vec<Vec<u32>>, (u64, u64));

/// Runs `reqs` alone and all together (in a pool too small for them, with
/// 48-token steps) on `cfg`'s engine, checking the books after every step;
/// returns (alone, batched) outputs and the batched engine's (drafted, accepted).
fn alone_and_batched(cfg: &EngineConfig, reqs: &[(Vec<u32>, SamplingParams)]) -> AloneAndBatched {
    let ks = &kernels().ctx;
    let mut core = LlmEngine::with_context(ks, cfg).unwrap();
    let alone: Vec<Vec<u32>> = reqs
        .iter()
        .map(|q| run_all(&mut core, std::slice::from_ref(q)).remove(0))
        .collect();
    let m = &core.metrics;
    eprintln!(
        "alone: {} drafted, {} accepted",
        m.spec_decode_num_draft_tokens_total, m.spec_decode_num_accepted_tokens_total
    );
    let d = core.draft.as_ref().expect("a draft model");
    assert_eq!(
        d.num_seqs(),
        1,
        "the draft keeps the last sequence's KV only until the next draft"
    );
    drop(core);
    let mut small = cfg.clone();
    small.kv_cache_memory = Some(192 * KvDtype::default().row_bytes(11520) * 2);
    small.max_num_batched_tokens = 48;
    small.max_model_len = Some(192);
    let mut core = LlmEngine::with_context(ks, &small).unwrap();
    let batched = run_all(&mut core, reqs);
    let m = &core.metrics;
    eprintln!(
        "batched: {} preemptions, {} drafted, {} accepted, {} draft passes",
        m.num_preemptions_total,
        m.spec_decode_num_draft_tokens_total,
        m.spec_decode_num_accepted_tokens_total,
        core.draft.as_ref().unwrap().passes
    );
    assert!(m.num_preemptions_total > 0, "the pool was meant to force preemption");
    let counts = (
        m.spec_decode_num_draft_tokens_total,
        m.spec_decode_num_accepted_tokens_total,
    );
    (alone, batched, counts)
}

/// Draft-model drafting (`--draft-model`): greedy output equals the plain
/// output, alone and batched under preemption and chunked prefill, with the
/// target's and the draft's pools balanced after every step. The default
/// model as its own draft has every draft accepted (its one-token passes give
/// the verify chunk's logits: batch invariance); a Q2_K copy of it has
/// drafts rejected too.
#[test]
fn draft_model_speculation_keeps_greedy_output() {
    let reqs: Vec<_> = requests().into_iter().take(6).collect();
    let ks = &kernels().ctx;
    let mut plain = LlmEngine::with_context(ks, &config(2048, 512, None)).unwrap();
    let want: Vec<Vec<u32>> = reqs
        .iter()
        .map(|q| run_all(&mut plain, std::slice::from_ref(q)).remove(0))
        .collect();
    drop(plain);
    let q2 = test_dir("draft_model").join("draft-q2_k.gguf");
    wllm::convert::quantize_model(&default_model_path(), &q2, wllm::quant::mix::Mix::Q2_K, |_, _, _| ()).unwrap();
    for (draft, all_accepted) in [(default_model_path(), true), (q2, false)] {
        let mut cfg = config(2048, 512, None);
        // The pool's bytes are shared with the draft's in proportion.
        cfg.kv_cache_memory = cfg.kv_cache_memory.map(|b| b * 2);
        cfg.speculative = Some(SpeculativeConfig {
            adaptive: false,
            ..SpeculativeConfig::draft_model(&draft, 4)
        });
        let (alone, batched, (drafted, accepted)) = alone_and_batched(&cfg, &reqs);
        for i in 0..reqs.len() {
            assert_eq!(alone[i], want[i], "request {i} alone, draft {}", draft.display());
            assert_eq!(batched[i], want[i], "request {i} batched, draft {}", draft.display());
        }
        assert!(drafted > 0);
        if all_accepted {
            assert_eq!(accepted, drafted, "the model as its own draft: every draft accepted");
        } else {
            assert!(accepted > 0 && accepted < drafted, "{accepted} of {drafted}");
        }
    }
}

/// A draft model of another vocabulary is refused at start, naming the difference.
#[test]
fn a_draft_model_of_another_vocabulary_is_refused() {
    let gemma = gemma3_path();
    let mut cfg = config(256, 64, None);
    cfg.speculative = Some(SpeculativeConfig::draft_model(&gemma, 4));
    let e = LlmEngine::with_context(&kernels().ctx, &cfg).err().expect("refused");
    assert!(e.to_string().contains("share the target's vocabulary"), "{e}");
}

/// A request's own `speculative_config`: it turns prompt lookup on for
/// itself on an engine started without speculation (same tokens as without),
/// `num_speculative_tokens: 0` turns the engine's off for it, and asking for
/// a draft model the engine has not loaded is refused.
#[test]
fn requests_set_their_own_speculation() {
    use wllm::config::RequestSpeculation;
    let (prompt, params) = requests().remove(0);
    let ks = &kernels().ctx;
    let mut plain = LlmEngine::with_context(ks, &config(2048, 512, None)).unwrap();
    let want = run_all(&mut plain, &[(prompt.clone(), params.clone())]).remove(0);
    assert_eq!(plain.metrics.spec_decode_num_draft_tokens_total, 0);
    let own = RequestSpeculation {
        num_speculative_tokens: Some(5),
        prompt_lookup_min: Some(1),
        adaptive: Some(false),
        ..Default::default()
    };
    let with = SamplingParams {
        speculative_config: Some(own),
        ..params.clone()
    };
    assert_eq!(run_all(&mut plain, &[(prompt.clone(), with)]).remove(0), want);
    let m = &plain.metrics;
    assert!(
        m.spec_decode_num_draft_tokens_total > 0 && m.spec_decode_num_accepted_tokens_total > 0,
        "the request drafted: {} drafted, {} accepted",
        m.spec_decode_num_draft_tokens_total,
        m.spec_decode_num_accepted_tokens_total
    );
    let e = plain
        .add_request(
            prompt.clone(),
            SamplingParams {
                speculative_config: Some(RequestSpeculation {
                    method: Some("draft_model".into()),
                    ..Default::default()
                }),
                ..params.clone()
            },
        )
        .unwrap_err();
    assert!(e.to_string().contains("no draft model"), "{e}");
    let e = plain
        .add_request(
            prompt.clone(),
            SamplingParams {
                speculative_config: Some(RequestSpeculation {
                    num_speculative_tokens: Some(65),
                    ..Default::default()
                }),
                ..params.clone()
            },
        )
        .unwrap_err();
    assert!(e.to_string().contains("num_speculative_tokens"), "{e}");
    drop(plain);
    let mut spec = LlmEngine::with_context(ks, &config(2048, 512, Some(5))).unwrap();
    let off = SamplingParams {
        speculative_config: Some(RequestSpeculation {
            num_speculative_tokens: Some(0),
            ..Default::default()
        }),
        ..params.clone()
    };
    assert_eq!(run_all(&mut spec, &[(prompt.clone(), off)]).remove(0), want);
    assert_eq!(
        spec.metrics.spec_decode_num_draft_tokens_total, 0,
        "turned off for the request"
    );
    assert_eq!(run_all(&mut spec, &[(prompt, params)]).remove(0), want);
    assert!(
        spec.metrics.spec_decode_num_draft_tokens_total > 0,
        "the engine's own setting"
    );
}
