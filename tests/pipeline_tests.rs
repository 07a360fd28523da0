//! Start-up: pipelines are compiled on first use, once per device in a process
//! (engines share them), and persisted through wgpu's pipeline cache where the
//! adapter offers it, in a file that a corrupt or foreign copy cannot poison.

mod common;

use common::tiny::{TinySpec, write_tiny_gguf};
use common::*;
use wllm::backend::wgsl::{Kernels, pipeline_store};
use wllm::config::PipelineCacheDir;
use wllm::gpu::{GpuContext, GpuOptions};
use wllm::{EngineConfig, LlmEngine, Prompt, SamplingParams};

fn tiny_config(name: &str) -> EngineConfig {
    let dir = test_dir(name);
    EngineConfig {
        model: write_tiny_gguf(&dir, "tiny.gguf", &TinySpec::default(), &mut rng(5)),
        kv_cache_memory: Some(256 * 512),
        max_model_len: Some(256),
        ..Default::default()
    }
}

/// A tiny model with a pool of 2048 tokens (more blocks than the warm-up's
/// 64-token step has tokens) and a context of 1024.
fn roomy_config(name: &str) -> EngineConfig {
    EngineConfig {
        kv_cache_memory: Some(2048 * 512),
        max_model_len: Some(1024),
        ..tiny_config(name)
    }
}

/// A device of the test's own, without a persisted pipeline cache, so that
/// other tests' compiles do not count in its store.
fn private_device() -> GpuContext {
    GpuContext::new(&GpuOptions {
        pipeline_cache: PipelineCacheDir::Off,
        ..Default::default()
    })
    .unwrap()
}

/// Runs `prompt` to `n` greedy tokens (EOS ignored).
fn run_prompt(engine: &mut LlmEngine, prompt: Vec<u32>, n: usize) {
    let params = SamplingParams {
        max_tokens: Some(n),
        ignore_eos: true,
        ..SamplingParams::greedy()
    };
    engine.add_request(prompt, params).unwrap();
    while engine.has_unfinished() {
        engine.step().unwrap();
    }
}

fn generate(engine: &mut LlmEngine, n: usize) {
    let p = engine.tokenize(&Prompt::Text("hello there".into())).unwrap();
    run_prompt(engine, p, n);
}

#[test]
fn a_second_engine_on_the_device_compiles_nothing() {
    // A device of this test's own, so that other tests' compiles do not count.
    let ctx = private_device();
    let store = pipeline_store(&ctx);
    let cfg = tiny_config("pipelines_shared");
    let mut first = LlmEngine::with_context(&ctx, &cfg).unwrap();
    let at_load = store.stats().compiled;
    generate(&mut first, 3);
    let after_first = store.stats().compiled;
    assert!(
        after_first > at_load,
        "the first steps compile the gemm/embed/attention variants they need ({at_load} -> {after_first})"
    );
    let mut second = LlmEngine::with_context(&ctx, &cfg).unwrap();
    generate(&mut second, 3);
    assert_eq!(
        store.stats().compiled,
        after_first,
        "the second engine reuses every pipeline"
    );
    assert_eq!(second.load_timings.pipeline_stats.compiled, after_first);
}

#[test]
fn one_token_prompts_build_only_the_tiles_they_use() {
    let ctx = private_device();
    let mut engine = LlmEngine::with_context(&ctx, &tiny_config("pipelines_lazy")).unwrap();
    generate(&mut engine, 1);
    let after_prefill = pipeline_store(&ctx).stats().compiled;
    generate(&mut engine, 2);
    let after_decode = pipeline_store(&ctx).stats().compiled;
    assert!(
        after_decode > after_prefill,
        "a decode step needs row tile 1, which a one-token prompt never built ({after_prefill} -> {after_decode})"
    );
}

/// An engine that no warm-up has tuned (the CLI's: generate, chat, embed)
/// runs batched gemms under the smallest row-tile cap, whose pipelines compile
/// fastest (its first prompt compiles them); a warm-up replaces it with the
/// cap it times fastest.
#[test]
fn an_engine_starts_under_the_smallest_row_tile_cap() {
    let ctx = private_device();
    let cfg = roomy_config("pipelines_start_cap");
    let mut engine = LlmEngine::with_context(&ctx, &cfg).unwrap();
    let caps = engine.runner.row_tile_caps();
    let want = caps.last().copied().unwrap_or(u32::MAX);
    assert_eq!(engine.runner.row_tile_cap(), want, "caps {caps:?}");
    // A prompt longer than every tile runs under it.
    run_prompt(&mut engine, (0..40).map(|i| 10 + i).collect(), 2);
    assert_eq!(engine.runner.row_tile_cap(), want);
    if caps.len() > 1 {
        drop(engine);
        let mut fresh = LlmEngine::with_context(&ctx, &cfg).unwrap();
        fresh.warm_up().unwrap();
        let r = fresh.row_tile.as_ref().expect("the warm-up chose a cap");
        assert_eq!(
            fresh.runner.row_tile_cap(),
            r.cap,
            "the warm-up's choice is in force: {r:?}"
        );
    } else {
        eprintln!("this adapter offers no row-tile caps ({caps:?}): nothing to start under");
    }
}

/// `prime` (what `wllm chat` runs while a person types its first message)
/// builds every pipeline that short prompts and their decodes use: after it,
/// prompts of 1 to 40 tokens compile nothing.
#[test]
fn a_primed_engine_compiles_nothing_for_short_prompts() {
    let ctx = private_device();
    let cfg = roomy_config("pipelines_primed");
    let mut engine = LlmEngine::with_context(&ctx, &cfg).unwrap();
    let store = pipeline_store(&ctx);
    let before = store.stats().compiled;
    // Asked before each step; stopped where it says no.
    let mut asked = 0;
    let stopped = engine
        .prime(|| {
            asked += 1;
            asked < 2
        })
        .unwrap();
    assert_eq!((stopped, asked), (1, 2), "one step, then stopped");
    assert_eq!(
        engine.prime(|| true).unwrap(),
        3,
        "8 tokens of one sequence, one token, 4 tokens"
    );
    let primed = store.stats().compiled;
    assert!(primed > before);
    let params = SamplingParams {
        max_tokens: Some(3),
        ignore_eos: true,
        ..SamplingParams::greedy()
    };
    for n in [1u32, 3, 8, 9, 17, 40] {
        engine
            .add_request((0..n).map(|i| 10 + i).collect(), params.clone())
            .unwrap();
        assert_eq!(engine.prime(|| true).unwrap(), 0, "no priming once requests are in");
        while engine.has_unfinished() {
            engine.step().unwrap();
        }
        assert_eq!(
            store.stats().compiled,
            primed,
            "a {n}-token prompt compiled pipelines after prime"
        );
    }
}

#[test]
fn a_corrupt_or_foreign_cache_file_is_ignored_and_rewritten() {
    let dir = test_dir("pipelines_disk");
    let opts = GpuOptions {
        pipeline_cache: PipelineCacheDir::At(dir.clone()),
        ..Default::default()
    };
    let ctx = GpuContext::new(&opts).unwrap();
    let store = pipeline_store(&ctx);
    let Some(path) = store.cache_path().map(|p| p.to_path_buf()) else {
        // Only adapters without PIPELINE_CACHE (or without a wgpu cache key) get here.
        assert!(
            !ctx.features.contains(wgpu::Features::PIPELINE_CACHE)
                || wgpu::util::pipeline_cache_key(&ctx.info).is_none()
        );
        eprintln!("this adapter offers no pipeline cache: {}", ctx.describe());
        return;
    };
    assert!(path.starts_with(dir.join("pipelines")), "{}", path.display());
    let kernels = Kernels::new(&ctx).unwrap();
    kernels.save_pipelines();
    let good = std::fs::read(&path).expect("the cache file is written after compiling");
    assert!(good.starts_with(b"WLLMPC01"));

    // A fresh process (here: a fresh device) loads it.
    let ctx2 = GpuContext::new(&opts).unwrap();
    assert!(pipeline_store(&ctx2).stats().disk_cache_loaded);

    // Garbage, a truncated copy and a copy for another key are all ignored;
    // the kernels still compile and the file is written anew.
    let mut foreign = good.clone();
    foreign[8] ^= 0xff;
    for bad in [
        b"not a pipeline cache".to_vec(),
        good[..good.len() / 2].to_vec(),
        foreign,
    ] {
        std::fs::write(&path, &bad).unwrap();
        let ctx3 = GpuContext::new(&opts).unwrap();
        let store3 = pipeline_store(&ctx3);
        assert!(!store3.stats().disk_cache_loaded, "a bad file was loaded");
        let k = Kernels::new(&ctx3).unwrap();
        assert!(store3.stats().compiled >= 5, "the fixed kernels compiled");
        k.save_pipelines();
        assert_eq!(
            std::fs::read(&path).unwrap()[..8],
            good[..8],
            "rewritten with a valid header"
        );
    }
}

#[test]
fn a_warmed_up_engine_compiles_nothing_when_serving() {
    let ctx = private_device();
    let store = pipeline_store(&ctx);
    // A pool of more blocks than the 64-token step has tokens, so that the
    // decode-shaped warm-up steps run as one-token sequences while the
    // chunk-sized one must still be a prefill (its attention tiles a prompt's
    // tokens, a kernel no decode compiles).
    let cfg = roomy_config("pipelines_warm");
    let mut engine = LlmEngine::with_context(&ctx, &cfg).unwrap();
    assert!(engine.plan.num_blocks >= 64, "{} blocks", engine.plan.num_blocks);
    let before = store.stats().compiled;
    let caps = engine.runner.row_tile_caps();
    // Tuned: a 64-token step twice under each cap, whose time under the
    // chosen one seeds the cost; else one 64-token step timed at the end.
    let tuning = if caps.len() > 1 { 2 * caps.len() } else { 1 };
    assert_eq!(
        engine.warm_up().unwrap(),
        11 + tuning,
        "a 64-token prompt twice under each row-tile cap {caps:?}, then 1, 4, 8, 16 and 32 \
         one-token sequences, then those five again timed (and 64 tokens timed where no cap was), \
         then one token in the pool's last block"
    );
    match &engine.row_tile {
        Some(r) => {
            assert!(tuning > 0 && caps.contains(&r.cap), "{r:?} not of {caps:?}");
            assert_eq!(r.times.iter().map(|t| t.0).collect::<Vec<_>>(), caps);
            assert!(r.times.iter().all(|t| t.1 > 0.0 && t.1.is_finite()), "{r:?}");
        }
        None => assert_eq!(tuning, 1, "caps {caps:?} offered but none chosen"),
    }
    // Six timed step sizes (1 to 32 one-token sequences, then the chunk)
    // seed the cost. Whether their fit has a positive slope is the machine's
    // timing (a tiny model's steps cost about the same at any size, and a
    // busy machine tilts them), so the test checks the seeding, not the fit.
    let seeded = engine.budget.cost.weight();
    // Six steps weigh 5.57 after decay, five 4.71.
    assert!(seeded > 5.0, "the timed steps seed the step cost: weight {seeded}");
    let warmed = store.stats().compiled;
    assert!(warmed > before);
    // Batches of 1 to 20 sequences, prefill chunks and decodes: nothing new to compile.
    let params = SamplingParams {
        max_tokens: Some(3),
        ignore_eos: true,
        ..SamplingParams::greedy()
    };
    for n in [1usize, 3, 7, 20] {
        for i in 0..n {
            // Prompts of 1 to 9 repeats: prefill chunks of many sizes.
            let p = engine
                .tokenize(&Prompt::Text("hello there ".repeat(1 + (i % 5) * 2)))
                .unwrap();
            engine.add_request(p, params.clone()).unwrap();
        }
        assert_eq!(engine.warm_up().unwrap(), 0, "no warm-up once requests are in");
        while engine.has_unfinished() {
            engine.step().unwrap();
        }
    }
    assert_eq!(
        store.stats().compiled,
        warmed,
        "serving compiled a pipeline the warm-up missed"
    );
    engine.check_blocks().unwrap();
}
