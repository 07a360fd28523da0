//! The cuda backend (`--features cuda`). Without a device, these check what can
//! be checked: the CUDA C of shaders/cuda compiles with NVRTC (when libnvrtc is
//! present; .ci/run installs it from PyPI) and exports every entry point. With
//! an NVIDIA device, every op is compared with the CPU reference and with the
//! wgpu backend, and the default model must reproduce the oracle on cuda.
//! Tests that need what this machine lacks print why and return.
#![cfg(feature = "cuda")]

mod common;

use common::backend_ops::{check_against, reference_ops, run_ops};
use common::kernels;
use wllm::backend::cuda::{self, CudaBackend, program};

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
        eprintln!("skipped: {}", program::NVRTC_MISSING);
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
    assert_eq!(program::entry_points().len(), 6 + 3 * 6);
}

#[test]
fn every_op_matches_cpu_and_wgpu_on_cuda() {
    let Some(cuda) = device() else { return };
    eprintln!("cuda: {}", cuda.describe());
    let got = run_ops(&cuda);
    check_against(&got, &reference_ops(), "cuda vs CPU");
    let wgpu = run_ops(kernels());
    for (c, w) in got.iter().zip(&wgpu) {
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
