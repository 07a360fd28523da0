//! The engine on the default model: batch invariance with chunked prefill and
//! preemption, prefix caching, stop strings and stop reasons.

mod common;

use std::collections::HashMap;

use common::*;
use rand::Rng;
use wllm::engine::LlmEngine;
use wllm::{EngineConfig, FinishReason, KvDtype, Prompt, RequestOutput, SamplingParams};

fn config(kv_tokens: usize, budget: usize, max_model_len: usize) -> EngineConfig {
    EngineConfig {
        model: default_model_path(),
        kv_cache_memory: Some(kv_tokens as u64 * KvDtype::default().row_bytes(11520)),
        max_num_batched_tokens: budget,
        max_num_seqs: 16,
        max_model_len: Some(max_model_len),
        ..Default::default()
    }
}

fn run_all(core: &mut LlmEngine, reqs: &[(Vec<u32>, SamplingParams)]) -> Vec<Vec<RequestOutput>> {
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
    ids.iter().map(|id| out.remove(id).unwrap_or_default()).collect()
}

fn tokens(outs: &[RequestOutput]) -> Vec<u32> {
    outs.iter().flat_map(|o| o.token_ids.clone()).collect()
}

#[test]
fn sixteen_requests_match_their_solo_runs() {
    let mut r = rng(5);
    let shared: Vec<u32> = (0..150).map(|_| r.random_range(100..40000)).collect();
    let reqs: Vec<(Vec<u32>, SamplingParams)> = (0..16)
        .map(|i| {
            let len = [1, 300, 17, 150, 64, 250, 3, 120, 199, 33, 80, 280, 8, 160, 45, 100][i];
            let mut p: Vec<u32> = (0..len).map(|_| r.random_range(100..40000)).collect();
            if i % 4 == 1 {
                let k = len.min(150);
                p[..k].copy_from_slice(&shared[..k]);
            }
            let mut s = SamplingParams::greedy();
            s.max_tokens = Some(6 + i % 8);
            s.ignore_eos = true;
            (p, s)
        })
        .collect();
    let ks = &kernels().ctx;
    let mut solo_engine = LlmEngine::with_context(ks, &config(1024, 512, 1024)).unwrap();
    let solo: Vec<Vec<u32>> = reqs
        .iter()
        .map(|q| tokens(&run_all(&mut solo_engine, std::slice::from_ref(q)).remove(0)))
        .collect();
    drop(solo_engine);
    // 320 KV tokens for ~2000 prompt tokens, 64-token steps.
    let mut core = LlmEngine::with_context(ks, &config(320, 64, 320)).unwrap();
    let together: Vec<Vec<u32>> = run_all(&mut core, &reqs).iter().map(|o| tokens(o)).collect();
    eprintln!(
        "default model, 16 requests: {} preemptions, {} steps, {} prefix-cache hit tokens",
        core.metrics.num_preemptions_total, core.metrics.num_steps_total, core.metrics.prefix_cache_hits_total
    );
    assert!(
        core.metrics.num_preemptions_total > 0,
        "the pool was meant to force preemption"
    );
    for i in 0..16 {
        assert_eq!(solo[i], together[i], "request {i} ({} prompt tokens)", reqs[i].0.len());
    }
    core.reset_prefix_cache();
    core.check_blocks().unwrap();
    assert_eq!(
        core.scheduler.blocks.num_free_blocks(),
        core.scheduler.blocks.num_blocks()
    );
}

#[test]
fn prefix_cache_skips_a_shared_512_token_prefix() {
    let mut core = LlmEngine::with_context(&kernels().ctx, &config(2048, 512, 2048)).unwrap();
    let mut r = rng(8);
    let prefix: Vec<u32> = (0..512).map(|_| r.random_range(100..40000)).collect();
    let with = |suffix: &[u32]| [prefix.clone(), suffix.to_vec()].concat();
    let mut s = SamplingParams::greedy();
    s.max_tokens = Some(2);
    let first = run_all(&mut core, &[(with(&[11, 12, 13]), s.clone())]).remove(0);
    assert_eq!(first.last().unwrap().metrics.as_ref().unwrap().num_cached_tokens, 0);
    let steps_before = core.metrics.num_steps_total;
    let hits_before = core.metrics.prefix_cache_hits_total;
    let second = run_all(&mut core, &[(with(&[21, 22, 23, 24, 25]), s.clone())]).remove(0);
    let m = second.last().unwrap().metrics.clone().unwrap();
    // 512 tokens = 32 full blocks come from the cache; 5 are computed.
    assert_eq!(m.num_cached_tokens, 512);
    assert_eq!(m.num_prompt_tokens - m.num_cached_tokens, 5);
    assert_eq!(core.metrics.prefix_cache_hits_total - hits_before, 512);
    // One step computes the 5 remaining tokens, one more the second output token.
    assert_eq!(core.metrics.num_steps_total - steps_before, 2);
    // The cached result equals a run without the cache.
    let mut cold = LlmEngine::with_context(
        &kernels().ctx,
        &EngineConfig {
            enable_prefix_caching: false,
            ..config(2048, 512, 2048)
        },
    )
    .unwrap();
    let uncached = run_all(&mut cold, &[(with(&[21, 22, 23, 24, 25]), s.clone())]).remove(0);
    assert_eq!(tokens(&second), tokens(&uncached));
    // A different first token: no hit at all.
    let mut changed = with(&[21, 22, 23, 24, 25]);
    changed[0] += 1;
    let third = run_all(&mut core, &[(changed, s)]).remove(0);
    assert_eq!(third.last().unwrap().metrics.as_ref().unwrap().num_cached_tokens, 0);
}

#[test]
fn stop_strings_are_never_half_emitted() {
    let mut core = LlmEngine::with_context(&kernels().ctx, &config(1024, 256, 1024)).unwrap();
    let prompt = core.tokenize(&Prompt::Text("1, 2, 3, 4, 5,".into())).unwrap();
    let plain = SamplingParams {
        max_tokens: Some(12),
        ..SamplingParams::greedy()
    };
    let full: String = run_all(&mut core, &[(prompt.clone(), plain)])
        .remove(0)
        .iter()
        .map(|o| o.text.clone())
        .collect();
    assert!(full.starts_with(" 6, 7, 8, 9"), "{full:?}");
    let s = SamplingParams {
        max_tokens: Some(30),
        stop: vec!["8, 9".into()],
        ..SamplingParams::greedy()
    };
    let outs = run_all(&mut core, &[(prompt.clone(), s)]).remove(0);
    let text: String = outs.iter().map(|o| o.text.clone()).collect();
    assert_eq!(text, " 6, 7, ");
    assert!(
        outs.iter().all(|o| !o.text.contains('8')),
        "a piece of the stop string was streamed"
    );
    assert_eq!(outs.last().unwrap().finish_reason, Some(FinishReason::Stop));
    // Length: max_tokens reached.
    let s = SamplingParams {
        max_tokens: Some(3),
        ..SamplingParams::greedy()
    };
    let outs = run_all(&mut core, &[(prompt.clone(), s)]).remove(0);
    assert_eq!(tokens(&outs).len(), 3);
    assert_eq!(outs.last().unwrap().finish_reason, Some(FinishReason::Length));
    // A stop token id ends the request with "stop" and the token included.
    let stop_id = tokens(&outs)[1];
    let s = SamplingParams {
        max_tokens: Some(10),
        stop_token_ids: vec![stop_id],
        ..SamplingParams::greedy()
    };
    let outs = run_all(&mut core, &[(prompt, s)]).remove(0);
    assert_eq!(tokens(&outs).len(), 2);
    assert_eq!(outs.last().unwrap().finish_reason, Some(FinishReason::Stop));
}

/// The memory plan, made from the file's tensor shapes before loading,
/// counts what the engine then allocates (weights with rope tables, step
/// buffers) to within 3%, and gives the pool the bytes asked for.
#[test]
fn the_memory_plan_counts_what_the_engine_allocates() {
    for (tokens, budget, seqs, len) in [(4096, 512, 16, 2048), (8448, 64, 4, 8192)] {
        let cfg = EngineConfig {
            max_num_seqs: seqs,
            ..config(tokens, budget, len)
        };
        let core = LlmEngine::with_context(&kernels().ctx, &cfg).unwrap();
        let m = &core.memory;
        let planned = m.weights + m.activations;
        let measured = core.static_bytes();
        let err = (planned as f64 - measured as f64).abs() / measured as f64;
        eprintln!(
            "budget {budget}, {seqs} seqs, len {len}: planned {planned} (weights {}, step buffers {}), allocated {measured}",
            m.weights, m.activations
        );
        assert!(err < 0.03, "planned {planned} bytes against {measured} allocated");
        assert_eq!(m.kv, cfg.kv_cache_memory.unwrap());
        assert_eq!(m.sizing, wllm::engine::KvSizing::Given);
    }
}

/// An error the device raises outside any op (out of memory as it
/// allocates, or any other) fails what is running, with a message, where
/// wgpu's default handler panicked the process: a step's readback fails
/// with it, and so does an engine's load. Where the adapter reports a memory
/// budget, a driver budget of 1 % for resource creation makes the load run
/// out of memory for real, and the error names what to lower.
#[test]
fn errors_the_device_raises_fail_the_step_or_load_not_the_process() {
    use wllm::config::PipelineCacheDir;
    use wllm::gpu::{BufSlice, GpuContext, GpuOptions, StepEncoder};
    let ctx = GpuContext::new(&GpuOptions {
        pipeline_cache: PipelineCacheDir::Off,
        ..Default::default()
    })
    .unwrap();
    // A buffer no device may create (mappable for reading and storage): an
    // uncaptured validation error.
    let bad = || {
        ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("invalid usages"),
            size: 256,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        })
    };
    let ok = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("fine"),
        size: 256,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    let read = || StepEncoder::new(&ctx).submit_and_read(&[BufSlice::range(&ok, 0, 16)]);
    read().expect("a clean device reads back");
    let _b = bad();
    let err = read().expect_err("the step after a device error fails");
    assert!(err.to_string().contains("the GPU reported an error"), "{err}");
    read().expect("the error is reported once; the next step runs");
    let _b = bad();
    let err = LlmEngine::with_context(&ctx, &config(4096, 512, 2048))
        .err()
        .expect("a load during which the device failed fails");
    assert!(err.to_string().contains("loading the model"), "{err}");
    match ctx.memory.and_then(|m| m.available) {
        Some(_) => {
            let tight = GpuContext::new(&GpuOptions {
                pipeline_cache: PipelineCacheDir::Off,
                memory_budget_threshold: Some(1),
                ..Default::default()
            })
            .unwrap();
            let err = LlmEngine::with_context(&tight, &config(4096, 512, 2048))
                .err()
                .expect("the load must fail on a device that cannot hold the weights");
            let msg = err.to_string();
            assert!(
                msg.contains("ran out of memory") && msg.contains("--kv-cache-memory"),
                "{msg}"
            );
        }
        None => eprintln!(
            "{}: reports no memory budget (VK_EXT_memory_budget), so no budget threshold can make it run out",
            ctx.describe()
        ),
    }
}
