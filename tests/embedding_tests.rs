//! Embeddings (`engine::embedding`, `/v1/embeddings`): each pooling against
//! an independent float64 reference (tests/py/arch_ref.py over gguf-py's
//! dequantised weights) on the default model and on Gemma 3 270M (whose
//! post-norms take the other final-norm path), to cosine ≥ 0.9999; an
//! embedding computed alone equals, bit for bit, the same one computed in
//! small chunks beside generation (whose tokens stay those it gives alone),
//! after a preemption, and (last pooling) from the prefix cache; the blocks
//! all come back.

mod common;

use std::collections::HashMap;

use common::*;
use wllm::config::{EmbedSpec, Pooling};
use wllm::engine::LlmEngine;
use wllm::{EngineConfig, KvDtype, SamplingParams};

/// The reference's unit-length embeddings of each prompt, by pooling.
fn reference(model: &std::path::Path, prompts: &[Vec<u32>]) -> Vec<HashMap<String, Vec<f64>>> {
    arch_ref(model, "embed", prompts)
        .into_iter()
        .map(|j| serde_json::from_value(j).expect("embeddings by pooling"))
        .collect()
}

fn config(model: std::path::PathBuf, kv_tokens: usize, budget: usize) -> EngineConfig {
    EngineConfig {
        model,
        kv_cache_memory: Some(kv_tokens as u64 * KvDtype::default().row_bytes(11520)),
        max_num_batched_tokens: budget,
        max_num_seqs: 8,
        max_model_len: Some(kv_tokens.min(512)),
        ..Default::default()
    }
}

fn embed_params(pooling: Pooling) -> SamplingParams {
    SamplingParams {
        embed: Some(EmbedSpec {
            pooling,
            normalize: true,
        }),
        max_tokens: None,
        ..SamplingParams::greedy()
    }
}

/// Runs every request to its end, checking the books after each step; each
/// request's generated tokens and (for an embedding) vector.
fn run(core: &mut LlmEngine, reqs: &[(Vec<u32>, SamplingParams)]) -> Vec<(Vec<u32>, Option<Vec<f32>>)> {
    let ids: Vec<u64> = reqs
        .iter()
        .map(|(p, s)| core.add_request(p.clone(), s.clone()).unwrap())
        .collect();
    let mut out: HashMap<u64, (Vec<u32>, Option<Vec<f32>>)> = HashMap::new();
    while core.has_unfinished() {
        for o in core.step().unwrap() {
            let e = out.entry(o.id).or_default();
            e.0.extend(o.token_ids);
            if o.embedding.is_some() {
                assert!(e.1.is_none(), "one vector a request");
                e.1 = o.embedding;
            }
        }
        core.check_blocks().unwrap();
    }
    ids.iter().map(|id| out.remove(id).unwrap_or_default()).collect()
}

fn cosine(a: &[f32], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| f64::from(*x) * y).sum();
    let n = |v: &mut dyn Iterator<Item = f64>| v.map(|x| x * x).sum::<f64>().sqrt();
    dot / (n(&mut a.iter().map(|x| f64::from(*x))) * n(&mut b.iter().copied()))
}

/// Prompts of the default model's tokenizer: varied text, a short one and a long one.
fn prompts(core: &LlmEngine) -> Vec<Vec<u32>> {
    [
        "The cat sat on the mat, and the dog slept by the door.",
        "Hi",
        "Paged attention keeps the KV cache in fixed-size blocks; a block table maps each sequence's logical \
         blocks to physical ones, so memory is allocated on demand and shared between sequences with a common \
         prefix. Continuous batching then admits new requests at every step.",
        "fn main() { println!(\"{}\", (1..=10).map(|x| x * x).sum::<u32>()); }",
    ]
    .iter()
    .map(|t| core.tokenize(&wllm::Prompt::Text(t.to_string())).unwrap())
    .collect()
}

#[test]
fn each_pooling_matches_the_float64_reference() {
    for (model, name) in [(default_model_path(), "default"), (gemma3_path(), "gemma3")] {
        let mut core = LlmEngine::with_context(&kernels().ctx, &config(model.clone(), 2048, 512)).unwrap();
        let ps = prompts(&core);
        let want = reference(&model, &ps);
        for pooling in [Pooling::Mean, Pooling::Cls, Pooling::Last] {
            let reqs: Vec<_> = ps.iter().map(|p| (p.clone(), embed_params(pooling))).collect();
            for (i, (toks, e)) in run(&mut core, &reqs).into_iter().enumerate() {
                assert!(toks.is_empty(), "an embedding generates nothing");
                let e = e.expect("a vector");
                let norm = e.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
                assert!((norm - 1.0).abs() < 1e-5, "unit length: {norm}");
                let c = cosine(&e, &want[i][pooling.as_str()]);
                eprintln!("{name} {pooling} prompt {i} ({} tokens): cosine {c:.7}", ps[i].len());
                assert!(c >= 0.9999, "{name} {pooling} prompt {i}: cosine {c}");
            }
        }
        assert_eq!(core.metrics.embedding_requests_total, 12);
    }
}

#[test]
fn an_embedding_is_the_same_alone_chunked_beside_generation_and_cached() {
    let model = default_model_path();
    let ks = &kernels().ctx;
    let mut core = LlmEngine::with_context(ks, &config(model.clone(), 2048, 512)).unwrap();
    let ps = prompts(&core);
    let long = ps[2].clone();
    let mut gen_params = SamplingParams::greedy();
    gen_params.max_tokens = Some(24);
    gen_params.ignore_eos = true;
    let alone: Vec<Vec<f32>> = [Pooling::Mean, Pooling::Cls, Pooling::Last]
        .iter()
        .map(|&p| run(&mut core, &[(long.clone(), embed_params(p))]).remove(0).1.unwrap())
        .collect();
    let gen_alone: Vec<Vec<u32>> = [&ps[0], &ps[3]]
        .iter()
        .map(|p| run(&mut core, &[((*p).clone(), gen_params.clone())]).remove(0).0)
        .collect();
    // Last pooling again: its prompt's blocks are cached now, and it takes them.
    let hits = core.metrics.prefix_cache_hits_total;
    let again = run(&mut core, &[(long.clone(), embed_params(Pooling::Last))])
        .remove(0)
        .1
        .unwrap();
    assert!(
        core.metrics.prefix_cache_hits_total > hits,
        "last pooling uses the prefix cache"
    );
    assert_eq!(again, alone[2], "last pooling from the prefix cache");
    drop(core);
    // 16-token steps, generation alongside, a pool small enough to preempt.
    let mut small = config(model, 96, 16);
    small.max_model_len = Some(96);
    let mut core = LlmEngine::with_context(ks, &small).unwrap();
    let mut reqs = vec![(ps[0].clone(), gen_params.clone()), (ps[3].clone(), gen_params.clone())];
    for p in [Pooling::Mean, Pooling::Cls, Pooling::Last] {
        reqs.push((long.clone(), embed_params(p)));
    }
    let got = run(&mut core, &reqs);
    assert_eq!(got[0].0, gen_alone[0], "generation beside embeddings");
    assert_eq!(got[1].0, gen_alone[1], "generation beside embeddings");
    for (i, want) in alone.iter().enumerate() {
        assert_eq!(got[2 + i].1.as_ref(), Some(want), "pooling {i}: bit for bit");
    }
    eprintln!("{} preemptions", core.metrics.num_preemptions_total);
    assert!(core.metrics.num_preemptions_total > 0, "the pool was meant to preempt");
    core.check_blocks().unwrap();
    assert_eq!(
        core.scheduler.blocks.num_free_blocks(),
        core.plan.num_blocks,
        "every block back"
    );
}
