//! The ops interface on the wgpu backend: every op through the `Backend` trait
//! against its CPU reference (the same cases the cuda tests run), and how
//! `--device` resolves on this machine.

mod common;

use common::backend_ops::check_against_cpu;
use common::kernels;
use wllm::backend::Device;
use wllm::backend::device::cuda_unavailable;
use wllm::{EngineConfig, LlmEngine};

#[test]
fn every_op_through_the_trait_matches_cpu_on_wgpu() {
    check_against_cpu(kernels(), "wgpu");
}

#[test]
fn device_flag_parses() {
    assert_eq!("cuda".parse::<Device>(), Ok(Device::Cuda));
    assert_eq!("WGPU".parse::<Device>(), Ok(Device::Wgpu));
    assert_eq!("vulkan".parse::<Device>(), Ok(Device::Wgpu));
    assert_eq!("auto".parse::<Device>(), Ok(Device::Auto));
    let err = "rocm".parse::<Device>().unwrap_err();
    assert!(err.contains("wgpu, cuda or auto"), "{err}");
}

#[test]
fn device_resolution_follows_what_this_machine_has() {
    match cuda_unavailable() {
        Some(why) => {
            eprintln!("cuda unavailable here: {why}");
            assert_eq!(Device::Auto.resolve().unwrap(), Device::Wgpu);
            assert_eq!(Device::Wgpu.resolve().unwrap(), Device::Wgpu);
            let err = Device::Cuda.resolve().unwrap_err().to_string();
            assert!(err.contains(&why), "{err}");
            if !cfg!(feature = "cuda") {
                assert!(err.contains("--features cuda"), "{err}");
            }
            // An engine asked for cuda says why it cannot start, before touching the model.
            let cfg = EngineConfig {
                model: common::default_model_path(),
                device: Device::Cuda,
                ..Default::default()
            };
            let err = LlmEngine::new(&cfg).err().expect("cuda must be refused").to_string();
            assert!(err.contains(&why), "{err}");
        }
        None => {
            assert_eq!(Device::Auto.resolve().unwrap(), Device::Cuda);
            assert_eq!(Device::Cuda.resolve().unwrap(), Device::Cuda);
        }
    }
}

#[test]
fn engine_decode_steps_reuse_their_bind_groups() {
    let dir = common::test_dir("bind_cache");
    let model = common::tiny::write_tiny_gguf(&dir, "tiny.gguf", &Default::default(), &mut common::rng(3));
    let ks = wllm::backend::wgsl::Kernels::new(&kernels().ctx).expect("kernels");
    let cache = ks.bind_cache.clone();
    let cfg = EngineConfig {
        model,
        kv_cache_memory: Some(256 * 512),
        max_model_len: Some(256),
        ..Default::default()
    };
    let mut engine = LlmEngine::with_backend(ks, &cfg).expect("engine");
    let mut params = wllm::SamplingParams::greedy();
    params.max_tokens = Some(8);
    params.ignore_eos = true;
    engine.add_request((0..20).collect(), params).unwrap();
    let counts = || {
        let c = cache.lock().unwrap();
        (c.made, c.reused)
    };
    // The prefill step, then the first decode step, make their bind groups.
    engine.step().unwrap();
    engine.step().unwrap();
    let (made, reused) = counts();
    assert!(made > 0);
    let mut tokens = 2;
    while engine.has_unfinished() {
        tokens += engine.step().unwrap().iter().map(|o| o.token_ids.len()).sum::<usize>();
    }
    assert_eq!(tokens, 8);
    let (made_after, reused_after) = counts();
    assert_eq!(made_after, made, "decode steps of the same shape made new bind groups");
    // Six more decode steps of at least 18 dispatches each (7 a layer, two
    // layers, and embed, final norm, LM head, argmax), every one reused.
    assert!(reused_after - reused >= 6 * 18, "reused {} -> {}", reused, reused_after);
}
