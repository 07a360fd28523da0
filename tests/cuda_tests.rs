//! The cuda backend (`--features cuda`). Without a device, these check what can
//! be checked: the CUDA C of shaders/cuda compiles with NVRTC (when libnvrtc is
//! present; scripts/test.sh fetches it from PyPI) and exports every entry
//! point; and the backend's whole op layer and kernels run on a CPU emulation of
//! the CUDA execution model (tests/cuda_emu, built with g++), where every op
//! must match the CPU reference and an engine on a tiny model must generate
//! what the wgpu engine generates. With an NVIDIA device, every op is compared
//! with the CPU reference and with the wgpu backend, and the default model must
//! reproduce the oracle on cuda. Tests that need what this machine lacks print
//! why and return.
#![cfg(feature = "cuda")]

mod common;

use common::backend_ops::{check_against_cpu, run_ops};
use common::kernels;
use wllm::backend::cuda::{self, CudaBackend, program};
use wllm::quant::WeightFormat;

/// Skips a test whose tools (NVRTC, g++) this machine lacks: prints why and
/// returns, except where `WLLM_REQUIRE_CUDA_TOOLS=1` (CI sets it), where a
/// missing tool fails the test so that nothing passes by not running.
fn skip_for_missing_tool(why: &str) {
    if std::env::var("WLLM_REQUIRE_CUDA_TOOLS").is_ok_and(|v| v == "1") {
        panic!("WLLM_REQUIRE_CUDA_TOOLS=1 but {why}");
    }
    eprintln!("skipped: {why}");
}

/// The cuda backend, or `None` after printing why this machine cannot run it.
fn device() -> Option<CudaBackend> {
    if let Some(why) = cuda::unavailable() {
        eprintln!("skipped: no usable NVIDIA device: {why}");
        return None;
    }
    Some(CudaBackend::new(0).unwrap_or_else(|e| panic!("{e}")))
}

#[test]
fn kernels_compile_with_nvrtc_for_every_supported_architecture() {
    if !program::nvrtc_present() {
        skip_for_missing_tool(program::NVRTC_MISSING);
        return;
    }
    // Ampere, Ada, Hopper.
    for (major, minor) in [(8, 0), (8, 9), (9, 0)] {
        let ptx = program::compile(major, minor).unwrap_or_else(|e| panic!("sm_{major}{minor}: {e}"));
        let text = ptx.to_src();
        for name in program::entry_points() {
            assert!(
                text.contains(&format!(".entry {name}(")),
                "sm_{major}{minor}: the PTX has no entry point {name}"
            );
        }
    }
}

#[test]
fn program_source_names_each_kernel_file() {
    let src = program::source();
    for (name, body) in program::FILES {
        assert!(src.contains(&format!("#line 1 \"{name}\"")), "{name} is not marked");
        assert!(src.contains(body), "{name} is missing from the program");
    }
    // The ops (rms_norm, rope, act_mul, bias_add, head_norm, elementwise, cache_write,
    // argmax, masked_argmax, paged_attention), then gemm, embed and dequant a format.
    assert_eq!(program::entry_points().len(), 10 + 3 * WeightFormat::ALL.len());
}

/// The cuda backend on the CPU emulation, or `None` after printing why it cannot be built.
fn emulated() -> Option<CudaBackend> {
    match common::cuda_emu::emulator() {
        Ok(e) => Some(CudaBackend::with_executor(Box::new(common::cuda_emu::EmuHandle(e)))),
        Err(why) => {
            skip_for_missing_tool(&format!("cannot emulate the CUDA kernels here: {why}"));
            None
        }
    }
}

#[test]
fn every_op_matches_cpu_on_the_cuda_emulation() {
    let Some(cuda) = emulated() else { return };
    check_against_cpu(&cuda, "emulated cuda vs CPU");
}

#[test]
fn every_op_matches_cpu_and_wgpu_on_cuda() {
    let Some(cuda) = device() else { return };
    eprintln!("cuda: {}", cuda.describe());
    check_against_cpu(&cuda, "cuda vs CPU");
    let got = run_ops(&cuda);
    let wgpu = run_ops(kernels());
    for (c, w) in got.iter().zip(&wgpu) {
        assert_eq!(c.name, w.name, "the same cases in the same order");
        common::close(
            &c.values,
            &w.values,
            c.tol.max(1e-5) * 2.0,
            &format!("cuda vs wgpu: {}", c.name),
        );
    }
}

#[test]
fn default_model_matches_the_oracle_on_cuda() {
    let Some(cuda) = device() else { return };
    let (tok, runner) = common::oracle_check::load(cuda);
    common::oracle_check::check_greedy(&tok, &runner);
}

/// Greedy token ids of a few requests on an engine over `backend` (prefill in
/// chunks of 64 tokens: the cuBLAS path for chunks, the kernel for decodes).
fn tiny_engine_tokens(engine: &mut wllm::LlmEngine) -> Vec<Vec<u32>> {
    let prompts: Vec<Vec<u32>> = [3usize, 37, 70]
        .iter()
        .map(|&n| (0..n).map(|i| ((i * 37 + n) % 250) as u32).collect())
        .collect();
    let mut params = wllm::SamplingParams::greedy();
    params.max_tokens = Some(5);
    params.ignore_eos = true;
    let ids: Vec<u64> = prompts
        .iter()
        .map(|p| engine.add_request(p.clone(), params.clone()).unwrap())
        .collect();
    let mut out: std::collections::HashMap<u64, Vec<u32>> = Default::default();
    while engine.has_unfinished() {
        for o in engine.step().unwrap() {
            out.entry(o.id).or_default().extend(o.token_ids);
        }
    }
    engine.check_blocks().unwrap();
    ids.iter().map(|id| out.remove(id).unwrap_or_default()).collect()
}

#[test]
fn engine_on_emulated_cuda_generates_what_wgpu_generates() {
    let Some(cuda) = emulated() else { return };
    let dir = common::test_dir("cuda_tiny");
    let model = common::tiny::write_tiny_gguf(&dir, "tiny.gguf", &Default::default(), &mut common::rng(7));
    let cfg = wllm::EngineConfig {
        model,
        kv_cache_memory: Some(1024 * 512),
        max_num_batched_tokens: 64,
        max_model_len: Some(512),
        ..Default::default()
    };
    let mut on_cuda = wllm::LlmEngine::with_backend(cuda, &cfg).unwrap();
    let mut on_wgpu = wllm::LlmEngine::with_context(&kernels().ctx, &cfg).unwrap();
    let (c, w) = (tiny_engine_tokens(&mut on_cuda), tiny_engine_tokens(&mut on_wgpu));
    assert!(c.iter().all(|t| t.len() == 5), "{c:?}");
    assert_eq!(c, w, "greedy tokens, emulated cuda vs wgpu");
}
