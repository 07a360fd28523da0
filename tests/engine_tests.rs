//! The continuous-batching engine on a small random-weight Llama (a real GGUF
//! file written by the test): batch invariance under chunked prefill and
//! preemption, block accounting, aborts, seeds, and the streaming API.

mod common;

use std::collections::HashMap;

use common::tiny::{TinySpec, write_tiny_gguf};
use common::*;
use rand::Rng;
use wllm::engine::LlmEngine;
use wllm::{Engine, EngineConfig, FinishReason, KvDtype, Prompt, SamplingParams};

fn tiny_model(name: &str) -> std::path::PathBuf {
    let dir = test_dir(name);
    write_tiny_gguf(&dir, "tiny.gguf", &TinySpec::default(), &mut rng(42))
}

fn tiny_config(model: std::path::PathBuf, kv_tokens: usize, budget: usize) -> EngineConfig {
    // 2 layers x 2 KV heads x 16 dims x 2 (K and V) = 128 elements per token,
    // in the default KV dtype.
    EngineConfig {
        model,
        kv_cache_memory: Some(kv_tokens as u64 * KvDtype::default().row_bytes(128)),
        max_num_batched_tokens: budget,
        max_num_seqs: 64,
        max_model_len: Some(1024),
        ..Default::default()
    }
}

/// Runs every request to the end on a core engine; returns token ids by request order.
fn run_all(core: &mut LlmEngine, reqs: &[(Vec<u32>, SamplingParams)]) -> Vec<Vec<u32>> {
    let ids: Vec<u64> = reqs
        .iter()
        .map(|(p, s)| core.add_request(p.clone(), s.clone()).unwrap())
        .collect();
    let mut out: HashMap<u64, Vec<u32>> = HashMap::new();
    let mut steps = 0;
    while core.has_unfinished() {
        for o in core.step().unwrap() {
            out.entry(o.id).or_default().extend(o.token_ids);
        }
        core.check_blocks().unwrap();
        steps += 1;
        assert!(steps < 100_000, "the engine does not finish");
    }
    ids.iter().map(|id| out.remove(id).unwrap_or_default()).collect()
}

fn workload(n: usize, max_prompt: usize, seed: u64) -> Vec<(Vec<u32>, SamplingParams)> {
    let mut r = rng(seed);
    let shared: Vec<u32> = (0..200).map(|_| r.random_range(0..256)).collect();
    (0..n)
        .map(|i| {
            let len = 1 + (i * 97 + 13) % max_prompt;
            let mut p: Vec<u32> = (0..len).map(|_| r.random_range(0..256)).collect();
            if i % 3 == 0 {
                // Shared prefixes exercise the prefix cache.
                let k = shared.len().min(len);
                p[..k].copy_from_slice(&shared[..k]);
            }
            let mut s = SamplingParams::greedy();
            s.max_tokens = Some(4 + (i * 7) % 29);
            s.ignore_eos = i % 2 == 0;
            (p, s)
        })
        .collect()
}

#[test]
fn batch_invariance_under_chunking_and_preemption() {
    let model = tiny_model("engine_invariance");
    let reqs = workload(48, 600, 1);
    // Solo: each request alone, generous pool and budget.
    let mut solo_engine = LlmEngine::with_context(&kernels().ctx, &tiny_config(model.clone(), 4096, 1024)).unwrap();
    let solo: Vec<Vec<u32>> = reqs
        .iter()
        .map(|r| run_all(&mut solo_engine, std::slice::from_ref(r)).remove(0))
        .collect();
    // Together: a pool of 1280 tokens (less than the workload needs) and a 64-token budget.
    let mut core = LlmEngine::with_context(&kernels().ctx, &tiny_config(model, 1280, 64)).unwrap();
    let together = run_all(&mut core, &reqs);
    let m = &core.metrics;
    eprintln!(
        "tiny: {} preemptions, {} prefix-cache hit tokens of {} queried, {} steps",
        m.num_preemptions_total, m.prefix_cache_hits_total, m.prefix_cache_queries_total, m.num_steps_total
    );
    assert!(m.num_preemptions_total > 0, "the pool was meant to force preemption");
    for (i, (a, b)) in solo.iter().zip(&together).enumerate() {
        assert_eq!(
            a,
            b,
            "request {i} (prompt {} tokens) differs from its solo run",
            reqs[i].0.len()
        );
    }
    // Everything finished: after clearing the prefix cache every block is free.
    core.reset_prefix_cache();
    core.check_blocks().unwrap();
    assert_eq!(
        core.scheduler.blocks.num_free_blocks(),
        core.scheduler.blocks.num_blocks()
    );
    for b in 0..core.scheduler.blocks.num_blocks() as u32 {
        assert_eq!(core.scheduler.blocks.ref_count(b), 0);
    }
}

#[test]
fn request_that_can_never_fit_is_refused() {
    let model = tiny_model("engine_refuse");
    let mut core = LlmEngine::with_context(&kernels().ctx, &tiny_config(model, 4096, 256)).unwrap();
    let mut s = SamplingParams::greedy();
    s.max_tokens = Some(100);
    let err = core.add_request(vec![1; 1000], s.clone()).unwrap_err().to_string();
    assert!(err.contains("1000") && err.contains("1024"), "{err}");
    assert!(core.add_request(vec![], s.clone()).is_err());
    assert!(core.add_request(vec![9999], s).is_err(), "token outside the vocabulary");
    assert!(!core.has_unfinished());
}

#[test]
fn max_model_len_beyond_the_model_context_is_refused() {
    let model = tiny_model("engine_context");
    let mut cfg = tiny_config(model, 4096, 256);
    cfg.max_model_len = Some(2048);
    let err = LlmEngine::with_context(&kernels().ctx, &cfg)
        .err()
        .expect("2048 > the tiny model's 1024")
        .to_string();
    assert!(err.contains("2048") && err.contains("1024"), "{err}");
}

#[test]
fn seeded_sampling_is_independent_of_the_batch() {
    let model = tiny_model("engine_seed");
    let mut core = LlmEngine::with_context(&kernels().ctx, &tiny_config(model, 4096, 256)).unwrap();
    let mut s = SamplingParams {
        temperature: 0.9,
        top_p: 0.95,
        top_k: 50,
        seed: Some(7),
        ..Default::default()
    };
    s.max_tokens = Some(20);
    s.ignore_eos = true;
    let prompt: Vec<u32> = (10..40).collect();
    let alone = run_all(&mut core, &[(prompt.clone(), s.clone())]).remove(0);
    let mut reqs = workload(6, 100, 3);
    reqs.insert(3, (prompt, s.clone()));
    let together = run_all(&mut core, &reqs).remove(3);
    assert_eq!(alone, together);
    assert_eq!(alone.len(), 20);
    // Another seed gives another sequence (20 draws from a random model).
    let mut s2 = s;
    s2.seed = Some(8);
    let other = run_all(&mut core, &[((10..40).collect(), s2)]).remove(0);
    assert_ne!(alone, other);
}

#[test]
fn dropping_a_stream_aborts_and_frees_blocks() {
    let model = tiny_model("engine_abort");
    let engine = Engine::new(&tiny_config(model, 4096, 256)).unwrap();
    let mut s = SamplingParams::greedy();
    s.max_tokens = Some(500);
    s.ignore_eos = true;
    let mut stream = engine.generate(Prompt::Tokens((0..100).collect()), s).unwrap();
    let first = stream.next().unwrap().unwrap();
    assert_eq!(first.token_ids.len(), 1);
    let busy = engine.block_stats().unwrap();
    assert!(busy.num_free < busy.num_blocks, "the request holds blocks");
    drop(stream);
    engine.reset_prefix_cache().unwrap();
    let stats = engine.block_stats().unwrap();
    assert_eq!(stats.num_live_sequences, 0);
    assert_eq!(stats.num_free, stats.num_blocks);
    stats.consistent.unwrap();
    assert_eq!(engine.metrics().unwrap().num_requests_running, 0);
}

#[test]
fn stream_works_as_iterator_and_as_async_stream() {
    let model = tiny_model("engine_stream");
    let engine = Engine::new(&tiny_config(model, 4096, 256)).unwrap();
    let mut s = SamplingParams::greedy();
    s.max_tokens = Some(12);
    s.ignore_eos = true;
    let blocking = engine
        .generate(Prompt::Tokens((5..50).collect()), s.clone())
        .unwrap()
        .collect_all()
        .unwrap();
    assert_eq!(blocking.token_ids.len(), 12);
    assert_eq!(blocking.finish_reason, Some(FinishReason::Length));
    let m = blocking.metrics.unwrap();
    assert_eq!((m.num_prompt_tokens, m.num_output_tokens), (45, 12));
    assert!(m.time_to_first_token > 0.0 && m.e2e_latency >= m.time_to_first_token);

    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let mut stream = engine.generate(Prompt::Tokens((5..50).collect()), s).unwrap();
    let tokens = rt.block_on(async {
        let mut got = Vec::new();
        loop {
            let next =
                std::future::poll_fn(|cx| futures_core::Stream::poll_next(std::pin::Pin::new(&mut stream), cx)).await;
            match next {
                Some(o) => got.extend(o.unwrap().token_ids),
                None => break,
            }
        }
        got
    });
    assert_eq!(tokens, blocking.token_ids);
}

/// A request's metrics count from when it arrived (the engine handle stamps
/// it when called; the engine thread may take it a step or a `prime` later),
/// not from when the engine took it.
#[test]
fn metrics_count_from_the_arrival() {
    let model = tiny_model("engine_arrival");
    let mut core = LlmEngine::new(&tiny_config(model, 4096, 256)).unwrap();
    let mut s = SamplingParams::greedy();
    s.max_tokens = Some(2);
    s.ignore_eos = true;
    let waited = std::time::Duration::from_millis(1500);
    let arrival = std::time::Instant::now() - waited;
    core.add_request_arrived(7, (5..20).collect(), s, 7, arrival).unwrap();
    let mut metrics = None;
    while core.has_unfinished() {
        for o in core.step().unwrap() {
            metrics = metrics.or(o.metrics);
        }
    }
    let m = metrics.expect("the finished request's metrics");
    assert!(
        m.time_to_first_token >= waited.as_secs_f64() && m.queue_time >= waited.as_secs_f64(),
        "TTFT {} s, queue {} s: not counted from the arrival {waited:?} before",
        m.time_to_first_token,
        m.queue_time
    );
}

#[test]
fn chat_prompt_goes_through_the_template() {
    let model = tiny_model("engine_chat");
    let engine = Engine::new(&tiny_config(model, 4096, 256)).unwrap();
    let ids = engine
        .tokenize(&Prompt::Chat(vec![wllm::ChatMessage::new("user", "hi")]))
        .unwrap();
    let text = engine.tokenizer().decode(&ids);
    assert_eq!(text, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    assert_eq!(ids[0], 256, "<|im_start|> is parsed as its special token");
}

/// A group of 40 long sequences holds every running slot; a single request
/// added later gets its first token within two steps (a slot is taken back
/// from the group and recomputed later), and every sequence still produces
/// exactly its solo tokens.
#[test]
fn a_large_group_yields_a_slot_to_a_new_request() {
    let model = tiny_model("fair_group");
    let mut cfg = tiny_config(model, 4096, 256);
    cfg.max_num_seqs = 8;
    let mut core = LlmEngine::with_context(&kernels().ctx, &cfg).unwrap();
    let params = |n| SamplingParams {
        max_tokens: Some(n),
        ignore_eos: true,
        ..SamplingParams::greedy()
    };
    let prompts: Vec<Vec<u32>> = (0..40u32).map(|i| vec![10 + i, 20, 30 + i % 7]).collect();
    for (i, p) in prompts.iter().enumerate() {
        core.add_request_in_group(i as u64, p.clone(), params(24), 0).unwrap();
    }
    let mut out: HashMap<u64, Vec<u32>> = HashMap::new();
    for _ in 0..3 {
        for o in core.step().unwrap() {
            out.entry(o.id).or_default().extend(o.token_ids);
        }
    }
    let small = 1000u64;
    core.add_request_in_group(small, vec![7, 8, 9], params(4), small)
        .unwrap();
    let preempted_before = core.scheduler.num_preemptions;
    let mut steps = 0;
    while out.get(&small).is_none_or(|t| t.is_empty()) {
        for o in core.step().unwrap() {
            out.entry(o.id).or_default().extend(o.token_ids);
        }
        steps += 1;
        assert!(steps <= 2, "the new request waited {steps} steps");
    }
    assert!(
        core.scheduler.num_preemptions > preempted_before,
        "no slot was taken back"
    );
    while core.has_unfinished() {
        for o in core.step().unwrap() {
            out.entry(o.id).or_default().extend(o.token_ids);
        }
        core.check_blocks().unwrap();
    }
    let mut solo = LlmEngine::with_context(&kernels().ctx, &cfg).unwrap();
    for (i, p) in prompts.iter().enumerate().step_by(9) {
        assert_eq!(
            out[&(i as u64)],
            run_all(&mut solo, &[(p.clone(), params(24))])[0],
            "sequence {i}"
        );
    }
    assert_eq!(out[&small], run_all(&mut solo, &[(vec![7, 8, 9], params(4))])[0]);
}

/// q8_0 keeps each head's K and V in whole blocks of 32 (its keys are rotated
/// blockwise): a model of 16-value heads is refused with what to use instead.
#[test]
fn q8_0_cache_refuses_heads_that_are_not_whole_blocks() {
    let cfg = EngineConfig {
        kv_cache_dtype: Some(KvDtype::Q8_0),
        ..tiny_config(tiny_model("engine_q8_heads"), 64, 32)
    };
    let err = match LlmEngine::new(&cfg) {
        Ok(_) => panic!("a q8_0 cache of 16-value heads was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("whole blocks of 32") && err.contains("heads have 16"),
        "{err}"
    );
    assert!(err.contains("--kv-cache-dtype f16"), "{err}");
}
