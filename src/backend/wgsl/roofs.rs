//! The adapter's roofs, measured now: the read roof is the best of several read
//! kernels (plain runs, unrolled runs, strided rounds from a storage buffer;
//! rows of texels from a texture, as the gemm reads weights on CPU adapters)
//! over several launch sizes, and the FMA roof a register-only kernel of
//! independent fma chains. The launch cost is what one dispatch of an
//! almost empty kernel takes, many back to back in one submission: what each
//! of a step's dispatches costs before its work (on lavapipe a hand-off to
//! the driver's worker threads and back).
//! Benchmarks compare every kernel against them (`cargo bench --bench kernels`).

use std::sync::Arc;
use std::time::Instant;

use super::Kernels;
use super::weight::texture;
use crate::gpu::{Binding, Bound, BufSlice, GpuContext, GpuError, Kernel, StepEncoder};

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
    /// Seconds one dispatch of dispatch.wgsl takes, 200 back to back.
    pub dispatch_s: f64,
}

const READS: [(&str, &str); 3] = [
    ("read_runs", include_str!("../../../shaders/bench/read_runs.wgsl")),
    ("read_runs4", include_str!("../../../shaders/bench/read_runs4.wgsl")),
    ("read_strided", include_str!("../../../shaders/bench/read_strided.wgsl")),
];

fn bench_kernel(ctx: &GpuContext, name: &str, src: &str) -> Result<Arc<Kernel>, GpuError> {
    Kernel::new(&ctx.device, name, src, &[Binding::Read, Binding::ReadWrite], None).map(Arc::new)
}

fn read_tex_kernel(ctx: &GpuContext) -> Result<Arc<Kernel>, GpuError> {
    Kernel::new(
        &ctx.device,
        "read_tex",
        include_str!("../../../shaders/bench/read_tex.wgsl"),
        &[Binding::LoadRgba32Uint, Binding::ReadWrite],
        None,
    )
    .map(Arc::new)
}

fn record_read_tex(enc: &mut StepEncoder, k: &Arc<Kernel>, src: &Bound, out: &wgpu::Buffer, dims: [u32; 3]) {
    let [width, rows, groups] = dims;
    let params = [width, rows, groups, 0];
    enc.dispatch_bound(
        k,
        bytemuck::cast_slice(&params),
        vec![src.clone(), Bound::Buf(BufSlice::whole(out))],
        [groups, 1, 1],
    );
}

/// Runs read_tex.wgsl once over `data` as a `width` x `rows` rgba32uint
/// texture (width a multiple of 256) in `groups` workgroups and returns the
/// XOR of what its invocations wrote: the XOR of every u32 of `data` when it
/// reads each texel once (what the roof's bytes count).
pub fn read_tex_xor(ks: &Kernels, data: &[u8], width: u32, rows: u32, groups: u32) -> Result<u32, GpuError> {
    let ctx = &ks.ctx;
    let src = texture(ctx, data, width, rows, wgpu::TextureFormat::Rgba32Uint, "read_tex data");
    let out = ks.scratch(u64::from(groups) * 64 * 4);
    let mut enc = StepEncoder::new(ctx);
    record_read_tex(&mut enc, &read_tex_kernel(ctx)?, &src, &out, [width, rows, groups]);
    let read = enc.submit_and_read(&[BufSlice::whole(&out)])?;
    let words: Vec<u32> = read
        .first()
        .map(|b| bytemuck::pod_collect_to_vec(b))
        .unwrap_or_default();
    Ok(words.iter().fold(0, |a, w| a ^ w))
}

/// The best GB/s of read_tex.wgsl over `group_counts` (and the count that
/// reached it), reading a texture of up to `bytes`.
fn read_tex(ks: &Kernels, bytes: u64, group_counts: &[u32], out: &wgpu::Buffer) -> Result<(f64, u32), GpuError> {
    let ctx = &ks.ctx;
    let width = 1024u32;
    let rows = ((bytes / 16 / u64::from(width)) as u32).min(ctx.limits.max_texture_dimension_2d);
    if width > ctx.limits.max_texture_dimension_2d || rows == 0 || !ctx.storage_read_textures {
        return Ok((0.0, 0));
    }
    let tex_bytes = u64::from(width) * u64::from(rows) * 16;
    let data: Vec<u8> = (0..tex_bytes).map(|i| ((i * 2654435761) >> 13) as u8).collect();
    let src = texture(
        ctx,
        &data,
        width,
        rows,
        wgpu::TextureFormat::Rgba32Uint,
        "read roof texture",
    );
    drop(data);
    let k = read_tex_kernel(ctx)?;
    let mut best = (0.0f64, 0u32);
    for &groups in group_counts {
        let secs = time_reps(ctx, 5, |enc| {
            record_read_tex(enc, &k, &src, out, [width, rows, groups]);
            Ok(())
        })?;
        let gbs = tex_bytes as f64 / secs / 1e9;
        if gbs > best.0 {
            best = (gbs, groups);
        }
    }
    Ok(best)
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
    let (gbs, groups) = read_tex(ks, bytes, group_counts, &out)?;
    if gbs > best.0 {
        best = (gbs, format!("read_tex x{groups} workgroups"));
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
    let launch = bench_kernel(ctx, "dispatch", include_str!("../../../shaders/bench/dispatch.wgsl"))?;
    let dispatch_s = time_reps(ctx, 200, |enc| {
        enc.dispatch(
            &launch,
            bytemuck::cast_slice(&[1u32, 0, 0, 0]),
            &[BufSlice::whole(&src), BufSlice::whole(&out)],
            [1, 1, 1],
        );
        Ok(())
    })?;
    Ok(Roofs {
        read_gbs: best.0,
        read_kernel: best.1,
        fma_gflops,
        dispatch_s,
    })
}
