//! Kernel benchmarks on the real adapter: the roofs (best read kernel, FMA),
//! decode GEMV GB/s and weights/s for the default model's matrices as the
//! engine runs them (qkv stacked, gate·up interleaved) in every
//! weight type a file may hold (K-quants only where K is a multiple of 256;
//! GB/s counts the bytes of the GPU layout the type is repacked into, which is
//! what the kernel reads), and prefill GEMM GFLOP/s at T = 128, each as % of
//! its roof; the prefill in the row tile the engine would choose (each cap
//! timed, as its warm-up does). Beside each decode GEMV, its format's
//! dequant roof on the same weight (CPU adapters: `dequant_roof.wgsl` walks
//! and dequantises the same texels with x in registers and no reduction
//! order), the most a GEMV of f32 math on that format can reach here, and
//! the GEMV's share of it: the GEMV, the roof and the prefill are timed in
//! turn, three rounds, and each keeps its fastest. A dequant roof kernel that reads faster than the read
//! kernels raises the read roof, as a GEMV does. `WLLM_BENCH_FORMATS` (e.g.
//! `Q4_1,F16`) and `WLLM_BENCH_SHAPES` (`quick`, or `576x49152,1536x576`)
//! narrow the run; `WLLM_BENCH_GPU_SHAPES=1` times the GPU kernels (storage
//! buffers) on a CPU adapter. A type with a narrow layout is timed in it and
//! widened. Then `paged_attention` with the default model's heads
//! (`kernels/attention.rs`): one-row decodes at 128, 1024 and 4096 tokens of
//! context and a 512-token prefill chunk, GB/s and GFLOP/s against the same
//! roofs.
//! Run with `cargo bench --bench kernels`.

#[path = "kernels/attention.rs"]
mod attention;

use std::convert::Infallible;

use rand::{Rng, SeedableRng};
use wllm::backend::Backend;
use wllm::backend::wgsl::dequant_roof::DequantRoof;
use wllm::backend::wgsl::{GpuWeight, Kernels, Rows, roofs};
use wllm::engine::RowTileChoice;
use wllm::gpu::{GpuContext, GpuOptions};
use wllm::quant::{self, WeightFormat};

fn buffer(ks: &Kernels, bytes: usize) -> wgpu::Buffer {
    ks.scratch(bytes as u64)
}

fn main() {
    // SAFETY: first thing in `main`, before any thread exists.
    unsafe { wllm::gpu::default_llvmpipe_threads() };
    let ctx = GpuContext::new(&GpuOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    // WLLM_GEMM_TILES (as `wllm --gemm-tiles`) benches other tiles than the adapter's.
    let tiles = std::env::var("WLLM_GEMM_TILES")
        .ok()
        .map(|s| s.parse().unwrap_or_else(|e| panic!("WLLM_GEMM_TILES: {e}")));
    let mut ks = Kernels::with_tiles(&ctx, tiles).unwrap_or_else(|e| panic!("{e}"));
    // WLLM_BENCH_GPU_SHAPES=1: the GPU kernels (storage buffers) on any adapter.
    if std::env::var("WLLM_BENCH_GPU_SHAPES").is_ok_and(|v| v == "1") {
        ks.use_gpu_shapes();
    }
    let ks = ks;
    println!("adapter: {}", ctx.describe());

    // The roofs, measured in this run: the best of several read kernels and
    // launch sizes, and a register-only FMA kernel.
    let roofs = roofs::measure(&ks).expect("roofs");
    println!(
        "read roof {:.2} GB/s ({}), FMA roof {:.1} GFLOP/s, launch {:.1} µs a dispatch\n",
        roofs.read_gbs,
        roofs.read_kernel,
        roofs.fma_gflops,
        roofs.dispatch_s * 1e6
    );

    let formats: Vec<WeightFormat> = match std::env::var("WLLM_BENCH_FORMATS").ok() {
        Some(f) => WeightFormat::STORED
            .into_iter()
            .filter(|x| f.split(',').any(|n| n.eq_ignore_ascii_case(&format!("{x:?}"))))
            .collect(),
        None => WeightFormat::STORED.to_vec(),
    };
    let shapes: Vec<(usize, usize)> = match std::env::var("WLLM_BENCH_SHAPES").ok().as_deref() {
        Some("quick") => vec![(576, 1536)],
        // Or a list of K x N shapes: "576x49152,1536x576".
        Some(list) => list.split(',').map(shape).collect(),
        // The default model's matrices as the engine runs them: q, k and v
        // stacked (one gemm with the rope epilogue), o, gate and up
        // interleaved (one gemm with silu·mul), down, the output head.
        None => vec![(576, 960), (576, 576), (576, 3072), (1536, 576), (576, 49152)],
    };
    // WLLM_BENCH_DECODE_REPS: decode dispatches a measurement, and no
    // prefill (a long decode run to sample, as scripts/jit-mix.sh does).
    let decode_reps: Option<usize> = std::env::var("WLLM_BENCH_DECODE_REPS")
        .ok()
        .map(|v| v.parse().unwrap_or_else(|e| panic!("WLLM_BENCH_DECODE_REPS: {v}: {e}")));
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let mut rows = Vec::new();
    for &format in &formats {
        for &(k, n) in shapes.iter().filter(|(k, _)| k.is_multiple_of(format.block().0)) {
            // Random blocks (the values do not change the speed); quantising
            // keeps every scale finite.
            let x: Vec<f32> = (0..n * k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            let stored = if quant::quantize::WRITABLE.contains(&format) {
                quant::quantize::quantize(format, &x, n, k).expect("quantize")
            } else {
                (0..format.stored_bytes(n, k))
                    .map(|i| if i % 2 == 1 { 0x10 } else { rng.random() })
                    .collect()
            };
            // A type with a narrow layout is timed in it and widened (the
            // wide layout's textures on CPU adapters), one after the other.
            let narrow = quant::repack(format, &stored, n, k).expect("repack");
            let mut held = vec![quant::planes::widen(&narrow)];
            if narrow.format.is_narrow() {
                held.insert(0, narrow);
            }
            for rp in held {
                let layout_bytes = rp.data.len() + rp.scales.len();
                let w = GpuWeight::upload(&ctx, &rp, "bench");
                ks.prepare_gemm(&w).expect("prepare");
                let x = buffer(&ks, 128 * k * 4);
                let y = buffer(&ks, 128 * n * 4);
                let reps = decode_reps.unwrap_or(if n > 10000 { 5 } else { 30 });
                // The prefill in the row tile the engine's warm-up would choose
                // (`RowTileChoice::time_caps`: each cap timed twice in turn, the
                // fastest kept; every tile gives the same bits), or the tiles'
                // own where there is no choice (one cap, or tiles given). No
                // prefill with WLLM_BENCH_DECODE_REPS.
                let prefill_s = || {
                    roofs::time_reps(&ctx, 2.max(reps / 10), |enc| {
                        ks.gemm(enc, &w, Rows::new(&x, k), Rows::new(&y, n), 128)
                    })
                    .expect("gemm")
                };
                let (mut pre, mut tile) = (f64::INFINITY, 0);
                if decode_reps.is_none() {
                    let caps = ks.row_tile_caps(format);
                    let (_, choice) = RowTileChoice::time_caps(&caps, 128, |cap| {
                        ks.set_row_tile_cap(cap);
                        Ok::<_, Infallible>(Some(prefill_s() * 1e3))
                    })
                    .unwrap_or_else(|e| match e {});
                    ks.set_row_tile_cap(choice.as_ref().map_or(u32::MAX, |c| c.cap));
                    pre = choice.as_ref().map_or(f64::INFINITY, |c| c.chosen_ms() / 1e3);
                    tile = ks.row_tile(&w, 128);
                }
                // Then the GEMV, its format's dequant roof on this weight (CPU
                // adapters' textures) and the prefill in that tile in turn, three
                // rounds, each the fastest of its rounds: all under the same
                // drift of a shared machine, as the roofs are the best of theirs.
                let roof = DequantRoof::new(&ks, &w).expect("dequant roof");
                let (mut dec, mut dq) = (f64::INFINITY, None::<f64>);
                for _ in 0..3 {
                    let s = roofs::time_reps(&ctx, reps, |enc| {
                        ks.gemm(enc, &w, Rows::new(&x, k), Rows::new(&y, n), 1)
                    })
                    .expect("gemm");
                    dec = dec.min(s);
                    if let Some(roof) = &roof {
                        let r = roof.seconds(reps).expect("dequant roof");
                        dq = Some(dq.map_or(r, |d| d.min(r)));
                    }
                    if decode_reps.is_none() {
                        pre = pre.min(prefill_s());
                    }
                }
                ks.set_row_tile_cap(u32::MAX);
                let gbs = layout_bytes as f64 / dec / 1e9;
                let weights = (n * k) as f64 / dec / 1e9;
                let gflops = 2.0 * 128.0 * (n * k) as f64 / pre / 1e9;
                let dq_weights = dq.map(|s| (n * k) as f64 / s / 1e9);
                rows.push((
                    format,
                    rp.format,
                    k,
                    n,
                    gbs,
                    weights,
                    gflops,
                    tile,
                    layout_bytes,
                    dq_weights,
                ));
            }
        }
    }
    let attention_rows = if decode_reps.is_none() {
        attention::measure(&ks)
    } else {
        Vec::new()
    };
    // The roofs again at the end (a shared machine's speed drifts over the
    // run): each roof is the better of its two measurements.
    let again = roofs::measure(&ks).expect("roofs");
    println!(
        "roofs at the end: read {:.2} GB/s ({}), FMA {:.1} GFLOP/s\n",
        again.read_gbs, again.read_kernel, again.fma_gflops
    );
    let (read_measured, fma_measured) = (
        roofs.read_gbs.max(again.read_gbs),
        roofs.fma_gflops.max(again.fma_gflops),
    );
    // A GEMV or a dequant roof kernel (the same texels) that read faster
    // than the read kernels sets the read roof.
    let best_gemv = rows
        .iter()
        .map(|r| r.4.max(r.9.map_or(0.0, |d| d * r.8 as f64 / (r.3 * r.2) as f64)))
        .fold(0.0f64, f64::max);
    let read_roof = roof_at_least(read_measured, best_gemv, || {
        format!(
            "a GEMV (or its dequant roof kernel) read {best_gemv:.2} GB/s, above the read kernels' {read_measured:.2}: that is the read roof below"
        )
    });
    let best_gemm = rows.iter().map(|r| r.6).fold(0.0f64, f64::max);
    let fma_roof = roof_at_least(fma_measured, best_gemm, || {
        format!(
            "a GEMM reached {best_gemm:.1} GFLOP/s, above the FMA kernel's {fma_measured:.1}: that is the FMA roof below"
        )
    });
    // A decode GEMV is one dispatch: at best its bytes at the read roof plus
    // one launch (the faster of the two launch measurements), so a small
    // weight cannot reach the read roof however fast its kernel.
    let launch = roofs.dispatch_s.min(again.dispatch_s);
    println!(
        "| type (layout) | K→N | decode GB/s | % read roof | % read roof at best with a launch | decode G weights/s | dequant roof G weights/s (GB/s, % read roof) | % dequant roof | prefill T=128 GFLOP/s (row tile) | % FMA roof |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (format, layout, k, n, gbs, weights, gflops, tile, bytes, dq) in rows {
        let at_roof = bytes as f64 / (read_roof * 1e9);
        // The dequant roof's rate in the GEMV's bytes, and its share of the read roof.
        let (dq_roof, dq_share) = match dq {
            Some(d) => {
                let d_gbs = d * bytes as f64 / (n * k) as f64;
                (
                    format!("{d:.2} ({d_gbs:.2}, {:.0} %)", 100.0 * d_gbs / read_roof),
                    format!("{:.0} %", 100.0 * weights / d),
                )
            }
            None => ("–".into(), "–".into()),
        };
        println!(
            "| {format:?} ({layout:?}) | {k}→{n} | {gbs:.2} | {:.0} % | {:.0} % | {weights:.2} | {dq_roof} | {dq_share} | {gflops:.1} ({tile}) | {:.0} % |",
            100.0 * gbs / read_roof,
            100.0 * at_roof / (at_roof + launch),
            100.0 * gflops / fma_roof
        );
    }
    if !attention_rows.is_empty() {
        println!(
            "\n| paged attention (9 query heads, 3 KV heads of 64, blocks of 16) | ms | GB/s | % read roof | GFLOP/s | % FMA roof |"
        );
        println!("|---|---|---|---|---|---|");
        for r in attention_rows {
            let (gbs, gflops) = (r.bytes / r.secs / 1e9, r.flops / r.secs / 1e9);
            println!(
                "| {} | {:.3} | {gbs:.2} | {:.0} % | {gflops:.1} | {:.0} % |",
                r.what,
                r.secs * 1e3,
                100.0 * gbs / read_roof,
                100.0 * gflops / fma_roof
            );
        }
    }
}

/// "KxN" of `WLLM_BENCH_SHAPES`.
fn shape(s: &str) -> (usize, usize) {
    let dim = |v: &str| {
        v.trim()
            .parse::<usize>()
            .unwrap_or_else(|e| panic!("WLLM_BENCH_SHAPES: {s}: {e}"))
    };
    match s.split_once(['x', 'X']) {
        Some((k, n)) => (dim(k), dim(n)),
        None => panic!("WLLM_BENCH_SHAPES: {s} is not KxN (e.g. 576x49152)"),
    }
}

/// A roof below what a kernel achieved is no roof: `measured`, or `best`
/// (saying so with `why`) where a kernel beat it.
fn roof_at_least(measured: f64, best: f64, why: impl FnOnce() -> String) -> f64 {
    if best > measured {
        println!("({})\n", why());
        best
    } else {
        measured
    }
}
