//! Shared by the test binaries: one device per process, upload/readback helpers,
//! and random weights in every format.
#![allow(dead_code)]

pub mod attention_case;
pub mod backend_ops;
#[cfg(feature = "cuda")]
pub mod cuda_emu;
pub mod gguf_py;
pub mod oracle_check;
pub mod reference;

use std::sync::OnceLock;

use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use wllm::backend::wgsl::{GpuWeight, Kernels};
use wllm::gpu::{BufSlice, GpuContext, GpuOptions, StepEncoder};
use wllm::quant::{self, WeightFormat};

/// The process's kernels on the real adapter. No adapter is a failure, with the
/// install hint, never a skip.
pub fn kernels() -> &'static Kernels {
    static K: OnceLock<Kernels> = OnceLock::new();
    K.get_or_init(|| {
        let ctx = GpuContext::new(&GpuOptions::default()).unwrap_or_else(|e| panic!("{e}"));
        eprintln!("adapter: {}", ctx.describe());
        Kernels::new(&ctx).unwrap_or_else(|e| panic!("{e}"))
    })
}

pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

pub fn rand_vec(r: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| r.random_range(-1.0f32..1.0)).collect()
}

/// Every element within `tol` relative (plus `tol` absolute) of the reference.
pub fn close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}: element {i} got {g} want {w}"
        );
    }
}

pub fn upload<T: bytemuck::Pod>(data: &[T]) -> wgpu::Buffer {
    kernels().ctx.storage_buffer(bytemuck::cast_slice(data), "test")
}

pub fn zeros(n: usize) -> wgpu::Buffer {
    kernels().scratch((n * 4) as u64)
}

pub fn encoder() -> StepEncoder {
    StepEncoder::new(&kernels().ctx)
}

/// Submits `enc` and reads `n` f32 (or u32) values from each buffer.
pub fn run_read<T: bytemuck::Pod>(enc: StepEncoder, bufs: &[(&wgpu::Buffer, usize)]) -> Vec<Vec<T>> {
    let reads: Vec<BufSlice> = bufs
        .iter()
        .map(|(b, n)| BufSlice::range(b, 0, (n * 4) as u64))
        .collect();
    enc.submit_and_read(&reads)
        .expect("readback")
        .into_iter()
        .map(|b| bytemuck::pod_collect_to_vec(&b))
        .collect()
}

/// Random stored bytes of an `[n][k]` matrix in `format` (finite scales).
pub fn rand_weight_bytes(r: &mut StdRng, format: WeightFormat, n: usize, k: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(format.stored_bytes(n, k));
    match format {
        WeightFormat::F32 => (0..n * k).for_each(|_| out.extend(r.random_range(-1.0f32..1.0).to_le_bytes())),
        WeightFormat::F16 => {
            (0..n * k).for_each(|_| out.extend(f16::from_f32(r.random_range(-1.0..1.0)).to_le_bytes()))
        }
        WeightFormat::Bf16 => {
            (0..n * k).for_each(|_| out.extend(bf16::from_f32(r.random_range(-1.0..1.0)).to_le_bytes()))
        }
        q => {
            let (be, bb) = q.block();
            let (f16s, f32s) = scale_fields(q);
            // Super-blocks multiply d by 6-bit scales: smaller d keeps values near ±1.
            let range = if be == 256 { 0.003 } else { 0.1 };
            for _ in 0..n * k / be {
                let blk = out.len();
                (0..bb).for_each(|_| out.push(r.random()));
                for &o in f16s {
                    let v = f16::from_f32(r.random_range(-range..range)).to_le_bytes();
                    out[blk + o..blk + o + 2].copy_from_slice(&v);
                }
                for &o in f32s {
                    let v = r.random_range(-range..range).to_le_bytes();
                    out[blk + o..blk + o + 4].copy_from_slice(&v);
                }
            }
        }
    }
    out
}

/// Byte offsets of a block's f16 and f32 factors (the rest of a block is any bytes).
pub fn scale_fields(format: WeightFormat) -> (&'static [usize], &'static [usize]) {
    use WeightFormat as F;
    match format {
        F::Q8_0 | F::Q4_0 | F::Q5_0 | F::IQ4_NL | F::IQ4_XS => (&[0], &[]),
        F::Q4_1 | F::Q5_1 | F::Q4_K | F::Q5_K => (&[0, 2], &[]),
        F::Q2_K => (&[80, 82], &[]),
        F::Q3_K => (&[108], &[]),
        F::Q6_K => (&[208], &[]),
        F::Q8_16 => (&[], &[32, 36, 40, 44]),
        F::F32 | F::F16 | F::Bf16 => (&[], &[]),
        // Narrow layouts: never in a file.
        F::Q4_1P | F::Q5_0P | F::Q5_1P | F::Q2_KP | F::Q3_KP | F::Q4_KP | F::Q5_KP | F::Q6_KP => (&[], &[]),
    }
}

/// A random weight on the GPU and its f32 dequantisation on the CPU.
pub fn rand_weight(r: &mut StdRng, format: WeightFormat, n: usize, k: usize) -> (GpuWeight, Vec<f32>) {
    let bytes = rand_weight_bytes(r, format, n, k);
    let cpu = quant::dequantize(format, &bytes, n, k).expect("dequantize");
    let rp = quant::repack_wide(format, &bytes, n, k).expect("repack");
    (GpuWeight::upload(&kernels().ctx, &rp, "test weight"), cpu)
}

/// The K of the tests: awkward for floats (no multiple of 8), block-aligned for
/// quantised (5 blocks of 32, or 3 super-blocks of 256).
pub fn awkward_k(format: WeightFormat) -> usize {
    match format.block().0 {
        1 => 77,
        32 => 160,
        _ => 768,
    }
}

/// The default model's path (fetched by models/fetch.sh, which the test command runs).
pub fn default_model_path() -> std::path::PathBuf {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.exists(),
        "{} is missing: run ./models/fetch.sh (the README's test command does)",
        p.display()
    );
    p
}

/// Gemma 3 270M (fetched by models/fetch-gemma3.sh, which the test command runs).
pub fn gemma3_path() -> std::path::PathBuf {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/gemma-3-270m-q4_k_m.gguf");
    assert!(
        p.exists(),
        "{} is missing: run ./models/fetch-gemma3.sh (the README's test command does)",
        p.display()
    );
    p
}

/// The oracle file of the default model.
pub fn oracle() -> serde_json::Value {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/oracle-smollm2-135m-instruct-q4_1.json");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).expect("oracle JSON")
}

pub mod tiny;

/// A fresh directory under the cargo target dir for one test's files.
pub fn test_dir(name: &str) -> std::path::PathBuf {
    let d = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create test dir");
    d
}

/// Serves `engine` on a free local port from a runtime of its own (two
/// workers) until the runtime is dropped; returns the runtime and the address.
pub fn serve_in_background(
    engine: &wllm::Engine,
    cfg: wllm::server::ServerConfig,
) -> (tokio::runtime::Runtime, std::net::SocketAddr) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind a local port");
    let addr = listener.local_addr().expect("the bound address");
    rt.spawn(wllm::server::serve_until(
        listener,
        engine.clone(),
        cfg,
        std::future::pending(),
    ));
    (rt, addr)
}

/// The lines of tests/py/arch_ref.py (the float64 reference over gguf-py's
/// dequantised weights) for `prompts` under `mode` (a token count, or "embed").
pub fn arch_ref(model: &std::path::Path, mode: &str, prompts: &[Vec<u32>]) -> Vec<serde_json::Value> {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/arch_ref.py");
    let ids: Vec<String> = prompts
        .iter()
        .map(|p| p.iter().map(u32::to_string).collect::<Vec<_>>().join(","))
        .collect();
    let out = std::process::Command::new("python3")
        .arg(&script)
        .arg(model)
        .arg(mode)
        .arg(ids.join(";"))
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "arch_ref.py failed: {}\n(the README's test command installs gguf and numpy; else `python3 -m pip install gguf`)",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect()
}
