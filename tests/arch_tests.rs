//! Every architecture against an independent reference: a tiny random-weight
//! GGUF of each family (its extra tensors and keys, a sliding window shorter
//! than the sequence) generates greedily on the engine, and the same tokens
//! come out of tests/py/arch_ref.py (float64 numpy over gguf-py's dequantised
//! weights, written from each family's definition), up to the first step
//! whose best two logits are too close to call. Gemma 3 270M itself is
//! checked the same way on a prompt longer than its 512-token window.

mod common;

use common::tiny::{TinySpec, write_tiny_gguf};
use common::*;
use wllm::{EngineConfig, KvDtype, LlmEngine, SamplingParams};

/// The reference's tokens and margins for each prompt then `n` greedy tokens.
fn reference(model: &std::path::Path, prompts: &[Vec<u32>], n: usize) -> Vec<(Vec<u32>, Vec<f64>)> {
    arch_ref(model, &n.to_string(), prompts)
        .into_iter()
        .map(|j| {
            (
                serde_json::from_value(j["tokens"].clone()).expect("tokens"),
                serde_json::from_value(j["margins"].clone()).expect("margins"),
            )
        })
        .collect()
}

/// The engine's greedy tokens for each prompt, all in one batch.
fn generate(engine: &mut LlmEngine, prompts: &[Vec<u32>], n: usize) -> Vec<Vec<u32>> {
    let mut params = SamplingParams::greedy();
    params.max_tokens = Some(n);
    params.ignore_eos = true;
    let ids: Vec<u64> = prompts
        .iter()
        .map(|p| engine.add_request(p.clone(), params.clone()).expect("add"))
        .collect();
    let mut out: std::collections::HashMap<u64, Vec<u32>> = Default::default();
    while engine.has_unfinished() {
        for o in engine.step().expect("step") {
            out.entry(o.id).or_default().extend(o.token_ids);
        }
    }
    engine.check_blocks().expect("blocks");
    ids.iter().map(|id| out.remove(id).unwrap_or_default()).collect()
}

/// Asserts `got` equals the reference up to its first step of margin below `min_margin`.
fn agree(got: &[u32], want: &[u32], margins: &[f64], min_margin: f64, what: &str) -> usize {
    let upto = margins.iter().position(|&m| m < min_margin).unwrap_or(want.len());
    assert!(
        upto >= 4,
        "{what}: a near tie at step {upto} leaves too little to compare ({margins:?})"
    );
    assert_eq!(
        &got[..upto],
        &want[..upto],
        "{what}: greedy tokens against the reference (margins {margins:?})"
    );
    upto
}

fn check_arch(arch: &'static str) {
    let dir = test_dir(&format!("arch_{arch}"));
    let spec = TinySpec {
        arch,
        sliding_window: 5,
        layers: 3,
        ..Default::default()
    };
    let model = write_tiny_gguf(&dir, "tiny.gguf", &spec, &mut rng(11));
    let cfg = EngineConfig {
        model: model.clone(),
        kv_cache_memory: Some(1 << 20),
        max_num_batched_tokens: 16,
        max_model_len: Some(256),
        ..Default::default()
    };
    let mut engine = LlmEngine::with_context(&kernels().ctx, &cfg).expect("engine");
    // Prompts longer than the window and than a prefill chunk, and a short one.
    let prompts: Vec<Vec<u32>> = [3usize, 9, 21]
        .iter()
        .map(|&n| (0..n).map(|i| ((i * 37 + n * 11) % 250) as u32).collect())
        .collect();
    let n = 12;
    let got = generate(&mut engine, &prompts, n);
    let refs = reference(&model, &prompts, n);
    assert_eq!(refs.len(), prompts.len());
    for ((p, g), (want, margins)) in prompts.iter().zip(&got).zip(&refs) {
        agree(g, want, margins, 1e-3, &format!("{arch}, prompt of {}", p.len()));
    }
}

#[test]
fn llama_matches_the_reference() {
    check_arch("llama");
}

#[test]
fn qwen2_matches_the_reference() {
    check_arch("qwen2");
}

#[test]
fn qwen3_matches_the_reference() {
    check_arch("qwen3");
}

#[test]
fn gemma2_matches_the_reference() {
    check_arch("gemma2");
}

#[test]
fn gemma3_matches_the_reference() {
    check_arch("gemma3");
}

#[test]
fn phi3_matches_the_reference() {
    check_arch("phi3");
}

/// Gemma 3 270M on a prompt longer than its 512-token window (prefilled in
/// chunks), and a short one, against the reference.
#[test]
fn gemma3_270m_matches_the_reference_past_its_window() {
    let model = gemma3_path();
    let cfg = EngineConfig {
        model: model.clone(),
        kv_cache_memory: Some(64 << 20),
        max_num_batched_tokens: 256,
        max_model_len: Some(1024),
        ..Default::default()
    };
    let mut engine = LlmEngine::with_context(&kernels().ctx, &cfg).expect("engine");
    let tok = engine.tokenizer.clone();
    let story = "The lighthouse keeper counted the ships that passed each night, writing their names in a \
                 ledger that had belonged to his grandfather. ";
    let long = tok
        .encode(&format!(
            "{}Question: what did the keeper write in the ledger? Answer:",
            story.repeat(24)
        ))
        .expect("encode");
    assert!(long.len() > 560, "{} tokens", long.len());
    let short = tok.encode("The capital of France is").expect("encode");
    let n = 6;
    let prompts = [long, short];
    let got = generate(&mut engine, &prompts, n);
    let refs = reference(&model, &prompts, n);
    for ((p, g), (want, margins)) in prompts.iter().zip(&got).zip(&refs) {
        agree(g, want, margins, 0.02, &format!("gemma 3 270M, prompt of {}", p.len()));
    }
}

/// The hybrid KV cache (vLLM's hybrid allocator: a full group and windowed
/// groups whose blocks out of the window go back to the pool) against the
/// flat pool, on tiny Gemma 2 (alternate windowed layers: two groups of three)
/// and Gemma 3 (five windowed layers in six: a group per layer) models: a
/// pool small enough to preempt, prompts sharing prefixes longer than the
/// window, then the same prompts again through the prefix cache. Every output
/// is the flat pool's, bit for bit; the books balance; the hybrid pool holds
/// more tokens in the same memory.
#[test]
fn hybrid_kv_cache_equals_the_flat_pool() {
    for (arch, layers) in [("gemma2", 6), ("gemma3", 7)] {
        let dir = test_dir(&format!("hybrid_{arch}"));
        let spec = TinySpec {
            arch,
            sliding_window: 8,
            layers,
            ..Default::default()
        };
        let model = write_tiny_gguf(&dir, "tiny.gguf", &spec, &mut rng(5));
        let run = |hybrid: bool| {
            let cfg = EngineConfig {
                model: model.clone(),
                kv_cache_memory: Some(KvDtype::default().row_bytes(40 << 10)),
                block_size: 4,
                max_num_batched_tokens: 16,
                max_model_len: Some(80),
                hybrid_kv_cache: hybrid,
                ..Default::default()
            };
            let mut engine = LlmEngine::with_context(&kernels().ctx, &cfg).expect("engine");
            let prefixes: Vec<Vec<u32>> = (0..3)
                .map(|p| (0..30).map(|i| ((i * 13 + p * 71) % 250) as u32).collect())
                .collect();
            let prompts: Vec<Vec<u32>> = (0..12)
                .map(|k| {
                    let mut p = prefixes[k % 3][..5 + (k * 7) % 26].to_vec();
                    p.extend((0..k % 5 * 6).map(|i| ((i * 31 + k * 17) % 250) as u32));
                    p
                })
                .collect();
            let first = generate(&mut engine, &prompts, 16);
            let second = generate(&mut engine, &prompts, 16);
            (
                first,
                second,
                engine.plan.clone(),
                engine.scheduler.num_preemptions,
                engine.scheduler.prefix_hits,
            )
        };
        let (flat1, flat2, flat_plan, _, _) = run(false);
        let (hyb1, hyb2, plan, preemptions, hits) = run(true);
        assert_eq!(flat_plan.kv_groups, 1);
        assert!(plan.kv_groups > 1, "{arch}: {plan:?}");
        assert!(
            plan.capacity_tokens > flat_plan.capacity_tokens,
            "{arch}: {plan:?} against {flat_plan:?}"
        );
        assert_eq!(flat1, flat2, "{arch}: the flat pool's second pass");
        assert_eq!(hyb1, flat1, "{arch}: hybrid against flat");
        assert_eq!(hyb2, flat1, "{arch}: hybrid through the prefix cache");
        assert!(preemptions > 0, "{arch}: the pool was meant to preempt");
        assert!(hits > 0, "{arch}: the second pass was meant to hit the prefix cache");
    }
}
