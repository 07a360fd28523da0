//! The adapter's roofs, measured now: the read roof is the best of several read
//! kernels (plain runs, unrolled runs, strided rounds) over several launch
//! sizes, and the FMA roof a register-only kernel of independent fma chains.
//! Benchmarks compare every kernel against them (`cargo bench --bench kernels`).

use std::sync::Arc;
use std::time::Instant;

use super::Kernels;
use crate::gpu::{Binding, BufSlice, GpuContext, GpuError, Kernel, StepEncoder};

/// Seconds per repetition of `record`: the median of 5 submissions of `reps`
/// repetitions each, after one warm-up.
pub fn time_reps(
    ctx: &GpuContext,
    reps: usize,
    mut record: impl FnMut(&mut StepEncoder) -> Result<(), GpuError>,
) -> Result<f64, GpuError> {
    let mut enc = StepEncoder::new(ctx);
    record(&mut enc)?;
    enc.submit_and_read(&[])?;
    let mut runs = Vec::new();
    for _ in 0..5 {
        let mut enc = StepEncoder::new(ctx);
        for _ in 0..reps {
            record(&mut enc)?;
        }
        let t0 = Instant::now();
        enc.submit_and_read(&[])?;
        runs.push(t0.elapsed().as_secs_f64() / reps.max(1) as f64);
    }
    runs.sort_by(|a, b| a.total_cmp(b));
    Ok(runs[2])
}

/// The roofs and which kernel set the read roof.
#[derive(Clone, Debug)]
pub struct Roofs {
    pub read_gbs: f64,
    /// The read kernel and launch that reached `read_gbs`.
    pub read_kernel: String,
    pub fma_gflops: f64,
}

const READS: [(&str, &str); 3] = [
    ("read_runs", include_str!("../../../shaders/bench/read_runs.wgsl")),
    ("read_runs4", include_str!("../../../shaders/bench/read_runs4.wgsl")),
    ("read_strided", include_str!("../../../shaders/bench/read_strided.wgsl")),
];

fn bench_kernel(ctx: &GpuContext, name: &str, src: &str) -> Result<Arc<Kernel>, GpuError> {
    Kernel::new(&ctx.device, name, src, &[Binding::Read, Binding::ReadWrite], None).map(Arc::new)
}

/// Measures both roofs on `ks`'s adapter.
pub fn measure(ks: &Kernels) -> Result<Roofs, GpuError> {
    let ctx = &ks.ctx;
    let cpu = ctx.is_cpu();
    let bytes: u64 = if cpu { 64 << 20 } else { 256 << 20 };
    let n4 = (bytes / 16) as u32;
    let src = ks.scratch(bytes);
    let group_counts: &[u32] = if cpu { &[16, 64, 256] } else { &[1024, 4096, 16384] };
    let out = ks.scratch(u64::from(*group_counts.iter().max().unwrap_or(&1)) * 64 * 4);
    let mut best = (0.0f64, String::new());
    for (name, source) in READS {
        let k = bench_kernel(ctx, name, source)?;
        for &groups in group_counts {
            let threads = groups * 64;
            let second = if name == "read_strided" {
                threads
            } else {
                n4.div_ceil(threads)
            };
            let params = [n4, second, 0, 0];
            let secs = time_reps(ctx, 5, |enc| {
                enc.dispatch(
                    &k,
                    bytemuck::cast_slice(&params),
                    &[BufSlice::whole(&src), BufSlice::whole(&out)],
                    [groups, 1, 1],
                );
                Ok(())
            })?;
            let gbs = bytes as f64 / secs / 1e9;
            if gbs > best.0 {
                best = (gbs, format!("{name} x{groups} workgroups"));
            }
        }
    }
    let fma = bench_kernel(ctx, "fma_roof", include_str!("../../../shaders/bench/fma_roof.wgsl"))?;
    let seed = ctx.storage_buffer(bytemuck::bytes_of(&1.0f32), "fma seed");
    let mut fma_gflops = 0.0f64;
    for &groups in group_counts {
        let iters = if cpu { 2048u32 } else { 4096 };
        let params = [iters, 0, 0, 0];
        let secs = time_reps(ctx, 3, |enc| {
            enc.dispatch(
                &fma,
                bytemuck::cast_slice(&params),
                &[BufSlice::whole(&seed), BufSlice::whole(&out)],
                [groups, 1, 1],
            );
            Ok(())
        })?;
        let flops = f64::from(groups) * 64.0 * f64::from(iters) * 64.0;
        fma_gflops = fma_gflops.max(flops / secs / 1e9);
    }
    Ok(Roofs {
        read_gbs: best.0,
        read_kernel: best.1,
        fma_gflops,
    })
}
