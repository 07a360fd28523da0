//! Kernel benchmarks on the real adapter: the read roof, decode GEMV GB/s and
//! weights/s for the default model's shapes in every weight format, and prefill
//! GEMM GFLOP/s at T = 128. Run with `cargo bench --bench kernels`.

use std::sync::Arc;
use std::time::Instant;

use rand::{Rng, SeedableRng};
use wllm::backend::Backend;
use wllm::backend::wgsl::{GpuWeight, Kernels, Rows};
use wllm::gpu::{Binding, BufSlice, GpuContext, GpuOptions, Kernel, StepEncoder};
use wllm::quant::{self, WeightFormat};

/// Seconds per repetition of `record`, median of 5 runs of `reps` in one submission.
fn time(ctx: &GpuContext, reps: usize, mut record: impl FnMut(&mut StepEncoder)) -> f64 {
    let mut enc = StepEncoder::new(ctx);
    record(&mut enc);
    enc.submit_and_read(&[]).expect("warm-up");
    let mut runs = Vec::new();
    for _ in 0..5 {
        let mut enc = StepEncoder::new(ctx);
        for _ in 0..reps {
            record(&mut enc);
        }
        let t0 = Instant::now();
        enc.submit_and_read(&[]).expect("run");
        runs.push(t0.elapsed().as_secs_f64() / reps as f64);
    }
    runs.sort_by(|a, b| a.total_cmp(b));
    runs[2]
}

fn buffer(ks: &Kernels, bytes: usize) -> wgpu::Buffer {
    ks.scratch(bytes as u64)
}

fn main() {
    let ctx = GpuContext::new(&GpuOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let ks = Kernels::new(&ctx).unwrap_or_else(|e| panic!("{e}"));
    println!("adapter: {}", ctx.describe());

    // The read roof: 64 MiB as vec4<u32>.
    let roof_kernel = Arc::new(
        Kernel::new(
            &ctx.device,
            "read_roof",
            include_str!("../shaders/read_roof.wgsl"),
            &[Binding::Read, Binding::ReadWrite],
            None,
        )
        .expect("read_roof"),
    );
    let bytes = 64 << 20;
    let src = buffer(&ks, bytes);
    let groups = if ctx.is_cpu() { 64u32 } else { 1024 };
    let out = buffer(&ks, groups as usize * 64 * 4);
    let params = [(bytes / 16) as u32, (bytes / 16) as u32 / (groups * 64), 0, 0];
    let secs = time(&ctx, 10, |enc| {
        enc.dispatch(
            &roof_kernel,
            bytemuck::cast_slice(&params),
            &[BufSlice::whole(&src), BufSlice::whole(&out)],
            [groups, 1, 1],
        );
    });
    let roof = bytes as f64 / secs / 1e9;
    println!("read roof (64 MiB as vec4<u32>): {roof:.2} GB/s\n");

    let formats: Vec<WeightFormat> = match std::env::var("WLLM_BENCH_FORMATS").ok() {
        Some(f) => WeightFormat::ALL
            .into_iter()
            .filter(|x| f.split(',').any(|n| n.eq_ignore_ascii_case(&format!("{x:?}"))))
            .collect(),
        None => WeightFormat::ALL.to_vec(),
    };
    let shapes: Vec<(usize, usize)> = match std::env::var("WLLM_BENCH_SHAPES").ok().as_deref() {
        Some("quick") => vec![(576, 1536)],
        _ => vec![(576, 1536), (576, 192), (1536, 576), (576, 49152)],
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    println!("| format | K→N | decode GB/s | % roof | decode G weights/s | prefill T=128 GFLOP/s |");
    println!("|---|---|---|---|---|---|");
    for &format in &formats {
        for &(k, n) in &shapes {
            let stored: Vec<u8> = (0..format.stored_bytes(n, k))
                .map(|i| if i % 34 < 2 { 0x10 } else { rng.random() })
                .collect();
            let w = GpuWeight::upload(&ctx, &quant::repack(format, &stored, n, k).expect("repack"), "bench");
            ks.prepare_gemm(&w).expect("prepare");
            let x = buffer(&ks, 128 * k * 4);
            let y = buffer(&ks, 128 * n * 4);
            let reps = if n > 10000 { 5 } else { 30 };
            let dec = time(&ctx, reps, |enc| {
                ks.gemm(enc, &w, Rows::new(&x, k), Rows::new(&y, n), 1).expect("gemm")
            });
            let pre = time(&ctx, 2.max(reps / 10), |enc| {
                ks.gemm(enc, &w, Rows::new(&x, k), Rows::new(&y, n), 128).expect("gemm")
            });
            let gbs = w.stored_bytes() as f64 / dec / 1e9;
            println!(
                "| {format:?} | {k}→{n} | {gbs:.2} | {:.0} % | {:.2} | {:.1} |",
                100.0 * gbs / roof,
                (n * k) as f64 / dec / 1e9,
                2.0 * 128.0 * (n * k) as f64 / pre / 1e9
            );
        }
    }
}
