//! The layer's norms and residual adds fused into its gemms
//! (`Backend::fuses_norm`), in both shapes on every adapter (the CPU shapes'
//! x and norm weight as textures, the GPU shapes' as buffers): the
//! gate·up and qkv gemms normalise their x rows as
//! they read them, the same bits under every row tile (so a row's result does
//! not depend on its batch), close to `rms_norm` then the plain gemm and to a
//! CPU reference; the residual epilogue adds exactly what `gemm` computes.

mod common;

use common::*;
use wllm::backend::wgsl::{GpuWeight, Kernels, PagedKv, Rows};
use wllm::backend::{Backend, FusedOps, KvDtype, NormArgs, RopeArgs, RopePairing};
use wllm::model::layer_weights::pair_rope_rows;
use wllm::model::rope::rope_table;
use wllm::quant::{self, Repacked, WeightFormat};

const EPS: f32 = 1e-5;

/// Kernels in the CPU adapters' shapes, whose gemms fuse the norm: the
/// adapter's own on lavapipe, forced on GPUs (which run rms_norm on its own).
fn cpu_shaped() -> &'static Kernels {
    static K: std::sync::OnceLock<Kernels> = std::sync::OnceLock::new();
    K.get_or_init(|| {
        let mut ks = Kernels::new(&kernels().ctx).unwrap_or_else(|e| panic!("{e}"));
        ks.use_cpu_shapes();
        ks
    })
}

/// Kernels in the GPU shapes (x and the norm weight as `vec4` buffers), whose
/// gemms fuse the norm too: the adapter's own on GPUs, forced on lavapipe.
fn gpu_shaped() -> &'static Kernels {
    static K: std::sync::OnceLock<Kernels> = std::sync::OnceLock::new();
    K.get_or_init(|| {
        let mut ks = Kernels::new(&kernels().ctx).unwrap_or_else(|e| panic!("{e}"));
        ks.use_gpu_shapes();
        ks
    })
}

/// Both shapes, each checked on its own.
fn shapes() -> [&'static Kernels; 2] {
    [cpu_shaped(), gpu_shaped()]
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

/// Every row tile for Q4_1 (the default model's format, whose pipelines the
/// engine tests share); the decode tile and the next for the others, whose
/// tiles differ only in how many rows the same code unrolls (each tile is a
/// pipeline to compile, the large ones for many seconds on lavapipe).
fn tiles_to_check(ks: &Kernels, w: &GpuWeight) -> Vec<u32> {
    let tiles = ks.row_tiles(w);
    if w.format == WeightFormat::Q4_1 || tiles.len() <= 2 {
        return tiles;
    }
    tiles[..2].to_vec()
}

/// rms_norm of each row of `x` (rows of `k`) with weight `g`, in f64.
fn cpu_rms_norm(x: &[f32], g: &[f32], k: usize) -> Vec<f64> {
    x.chunks(k)
        .flat_map(|row| {
            let ms = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / k as f64;
            let inv = 1.0 / (ms + f64::from(EPS)).sqrt();
            row.iter().zip(g).map(move |(&v, &w)| f64::from(v) * inv * f64::from(w))
        })
        .collect()
}

#[test]
fn gemm_silu_mul_with_norm_is_the_same_under_every_tile_and_matches_the_cpu() {
    for ks in shapes() {
        gemm_silu_mul_with_norm(ks);
    }
}

fn gemm_silu_mul_with_norm(ks: &Kernels) {
    assert!(
        ks.fuses_norm(576) && !ks.fuses_norm(100),
        "both shapes fuse norms of 64-float multiples, neither of rows of 100 floats"
    );
    // Q4_1 (scaled, with the min term), Q4_0 (scaled), Q8_0, f16 (floats).
    let cases = [
        (WeightFormat::Q4_1, 576usize, 37usize, 19usize),
        (WeightFormat::Q4_0, 640, 20, 5),
        (WeightFormat::Q8_0, 576, 11, 3),
        (WeightFormat::F16, 576, 9, 17),
    ];
    for (ci, &(format, k, inter, t)) in cases.iter().enumerate() {
        let mut r = rng(300 + ci as u64);
        let (gb, ub) = (
            rand_weight_bytes(&mut r, format, inter, k),
            rand_weight_bytes(&mut r, format, inter, k),
        );
        let repack = |b: &[u8]| quant::repack_wide(format, b, inter, k).unwrap();
        let il = GpuWeight::upload(
            &ks.ctx,
            &Repacked::interleave_rows(&repack(&gb), &repack(&ub), "t").unwrap(),
            "il",
        );
        // Rows of different magnitudes: the norm must take each row's own scale.
        let mut x = rand_vec(&mut r, t * k);
        for (i, v) in x.iter_mut().enumerate() {
            *v *= 1.0 + (i / k) as f32 * 3.0;
        }
        let g: Vec<f32> = rand_vec(&mut r, k).iter().map(|v| 1.0 + 0.5 * v).collect();
        let (xb, gbuf) = (upload(&x), upload(&g));
        let norm = Some(NormArgs { w: &gbuf, eps: EPS });
        let tiles = tiles_to_check(ks, &il);
        let outs: Vec<wgpu::Buffer> = tiles.iter().map(|_| zeros(t * inter)).collect();
        let mut enc = encoder();
        for (tm, out) in tiles.iter().zip(&outs) {
            let (xr, yr) = (Rows::new(&xb, k), Rows::new(out, inter));
            ks.gemm_silu_mul_with(&mut enc, &il, xr, yr, t as u32, *tm, norm)
                .unwrap();
        }
        // The last row alone, through the trait (the decode tile).
        let (x1, y1) = (upload(&x[(t - 1) * k..]), zeros(inter));
        ks.gemm_silu_mul(&mut enc, &il, Rows::new(&x1, k), norm, Rows::new(&y1, inter), 1)
            .unwrap();
        let mut reads: Vec<(&wgpu::Buffer, usize)> = outs.iter().map(|b| (b, t * inter)).collect();
        reads.push((&y1, inter));
        let got: Vec<Vec<f32>> = run_read(enc, &reads);
        for (tm, out) in tiles.iter().zip(&got).skip(1) {
            assert_eq!(
                bits(out),
                bits(&got[0]),
                "{format:?} tile {tm} against tile {}",
                tiles[0]
            );
        }
        assert_eq!(
            bits(&got[tiles.len()]),
            bits(&got[0][(t - 1) * inter..]),
            "{format:?}: a row alone"
        );
        // The CPU: rms_norm, then silu(x̂·gateᵀ)·(x̂·upᵀ), in f64.
        let xn = cpu_rms_norm(&x, &g, k);
        let gc = quant::dequantize(format, &gb, inter, k).unwrap();
        let uc = quant::dequantize(format, &ub, inter, k).unwrap();
        let dot =
            |w: &[f32], i: usize, j: usize| -> f64 { (0..k).map(|kk| xn[i * k + kk] * f64::from(w[j * k + kk])).sum() };
        for i in 0..t {
            for j in 0..inter {
                let (gv, uv) = (dot(&gc, i, j), dot(&uc, i, j));
                let want = (gv / (1.0 + (-gv).exp()) * uv) as f32;
                let a = got[0][i * inter + j];
                let tol = 1e-4 * want.abs().max(1.0) * k as f32 / 64.0;
                assert!(
                    (a - want).abs() <= tol,
                    "{format:?} row {i} col {j}: got {a} want {want}"
                );
            }
        }
    }
}

#[test]
fn gemm_rope_kv_with_norm_is_the_same_under_every_tile_and_close_to_rms_norm_then_gemm() {
    for ks in shapes() {
        gemm_rope_kv_with_norm(ks);
    }
}

fn gemm_rope_kv_with_norm(ks: &Kernels) {
    let cases = [
        (WeightFormat::Q4_1, 9u32, 3u32, 64u32, 7usize, RopePairing::Adjacent),
        (WeightFormat::F16, 3, 1, 16, 2, RopePairing::RotateHalf),
    ];
    for (ci, &(format, hq, hk, hd, t, pairing)) in cases.iter().enumerate() {
        let (k, width) = (576usize, ((hq + 2 * hk) * hd) as usize);
        let (q_rows, kv_rows) = ((hq * hd) as usize, (hk * hd) as usize);
        let mut r = rng(310 + ci as u64);
        let parts: Vec<Repacked> = [q_rows, kv_rows, kv_rows]
            .iter()
            .map(|&n| quant::repack_wide(format, &rand_weight_bytes(&mut r, format, n, k), n, k).unwrap())
            .collect();
        let hdu = hd as usize;
        let paired = [
            pair_rope_rows(&parts[0], hdu, pairing),
            pair_rope_rows(&parts[1], hdu, pairing),
            parts[2].clone(),
        ];
        let w = GpuWeight::upload(&ks.ctx, &Repacked::stack_rows(&paired, "t").unwrap(), "qkv");
        let x: Vec<f32> = rand_vec(&mut r, t * k).iter().map(|v| v * 4.0).collect();
        let g: Vec<f32> = rand_vec(&mut r, k).iter().map(|v| 1.0 + 0.5 * v).collect();
        let pos: Vec<u32> = (0..t as u32).map(|i| (i * 5 + 1) % 30).collect();
        let slots = 2 * t + 3;
        // Distinct slots, in reverse order (two tokens on one slot would race).
        let slot: Vec<u32> = (0..t as u32).map(|i| slots as u32 - 1 - 2 * i).collect();
        let (xb, gbuf, pb, sb) = (upload(&x), upload(&g), upload(&pos), upload(&slot));
        let table = upload(&rope_table(30, hdu, 10000.0));
        let rope = RopeArgs {
            positions: &pb,
            table: &table,
            max_pos: 30,
            pairing,
        };
        // `tm`: the fused norm under that tile; None: rms_norm, then the gemm.
        let run = |tm: Option<u32>| -> Vec<Vec<f32>> {
            let (qkv, kc, vc) = (
                zeros(t * width),
                ks.kv_cache(slots as u64, kv_rows as u32, KvDtype::F16).unwrap(),
                ks.kv_cache(slots as u64, kv_rows as u32, KvDtype::F16).unwrap(),
            );
            let kv = PagedKv {
                k_cache: &kc,
                v_cache: &vc,
                dtype: KvDtype::F16,
                kv_heads: hk,
                head_dim: hd,
                block_size: 16,
                positions: &pb,
                token_seq: &pb,
                block_tables: &pb,
                max_blocks: 1,
                kv_rows: slots as u32,
                max_query_len: t as u32,
                window: 0,
                scale: wllm::backend::PagedKv::<()>::default_scale(hd),
                softcap: 0.0,
            };
            let mut enc = encoder();
            let yr = Rows::new(&qkv, width);
            let xn = zeros(t * k);
            match tm {
                Some(tm) => {
                    let norm = Some(NormArgs { w: &gbuf, eps: EPS });
                    let xr = Rows::new(&xb, k);
                    ks.gemm_rope_kv_with(&mut enc, &w, xr, yr, rope, kv, hq, &sb, t as u32, tm, norm)
                        .unwrap()
                }
                None => {
                    let xr = Rows::new(&xb, k);
                    ks.rms_norm(&mut enc, xr, &gbuf, None, None, EPS, t as u32, k as u32, &xn)
                        .unwrap();
                    ks.gemm_rope_kv(&mut enc, &w, Rows::new(&xn, k), None, yr, rope, kv, hq, &sb, t as u32)
                        .unwrap();
                }
            }
            let qkv_out: Vec<f32> = run_read(enc, &[(&qkv, t * width)]).remove(0);
            let read = |c| ks.read_kv_cache(c, slots as u32, kv_rows as u32, KvDtype::F16).unwrap();
            vec![qkv_out, read(&kc), read(&vc)]
        };
        let unfused = run(None);
        let tiles = tiles_to_check(ks, &w);
        let first = run(Some(tiles[0]));
        for &tm in &tiles[1..] {
            let got = run(Some(tm));
            for (what, (a, b)) in ["qkv", "k_cache", "v_cache"].iter().zip(got.iter().zip(&first)) {
                assert_eq!(bits(a), bits(b), "{format:?} tile {tm}: {what}");
            }
        }
        for (what, (a, b)) in ["qkv", "k_cache", "v_cache"].iter().zip(first.iter().zip(&unfused)) {
            close(
                a,
                b,
                1e-4 * k as f32 / 64.0,
                &format!("{format:?} {what}: fused norm against rms_norm then gemm"),
            );
        }
    }
}

#[test]
fn gemm_residual_adds_exactly_the_gemm_under_every_tile() {
    let ks = kernels();
    for (ci, &(format, k, n, t)) in [
        (WeightFormat::Q4_1, 1536usize, 70usize, 21usize),
        (WeightFormat::F32, 576, 33, 4),
    ]
    .iter()
    .enumerate()
    {
        let mut r = rng(320 + ci as u64);
        let (w, _) = rand_weight(&mut r, format, n, k);
        let (x, y0) = (rand_vec(&mut r, t * k), rand_vec(&mut r, t * n));
        let xb = upload(&x);
        let plain = zeros(t * n);
        let tiles = tiles_to_check(ks, &w);
        let outs: Vec<wgpu::Buffer> = tiles.iter().map(|_| upload(&y0)).collect();
        let mut enc = encoder();
        ks.gemm(&mut enc, &w, Rows::new(&xb, k), Rows::new(&plain, n), t as u32)
            .unwrap();
        for (tm, out) in tiles.iter().zip(&outs) {
            ks.gemm_residual_with(&mut enc, &w, Rows::new(&xb, k), Rows::new(out, n), t as u32, *tm)
                .unwrap();
        }
        let mut reads = vec![(&plain, t * n)];
        reads.extend(outs.iter().map(|b| (b, t * n)));
        let got: Vec<Vec<f32>> = run_read(enc, &reads);
        let want: Vec<f32> = y0.iter().zip(&got[0]).map(|(a, b)| a + b).collect();
        for (tm, out) in tiles.iter().zip(&got[1..]) {
            assert_eq!(bits(out), bits(&want), "{format:?} tile {tm}: y0 + gemm");
        }
    }
}

#[test]
fn a_norm_the_gemm_cannot_fuse_is_an_error_not_a_panic() {
    let gpu = gpu_shaped();
    assert!(
        gpu.fuses_norm(576),
        "GPU shapes fuse norms of rows of a multiple of 8 floats"
    );
    assert!(!gpu.fuses_norm(100), "but not of 100 floats");
    let (format, k, inter) = (WeightFormat::Q4_1, 576usize, 8usize);
    let mut r = rng(330);
    let g = quant::repack_wide(format, &rand_weight_bytes(&mut r, format, inter, k), inter, k).unwrap();
    let il = GpuWeight::upload(&gpu.ctx, &Repacked::interleave_rows(&g, &g, "t").unwrap(), "il");
    let (xb, gbuf, out) = (upload(&rand_vec(&mut r, k + 1)), upload(&vec![1.0f32; k]), zeros(inter));
    let mut enc = encoder();
    let norm = Some(NormArgs { w: &gbuf, eps: EPS });
    // x rows that do not start on a vec4 (offset 1) cannot be normalised as read.
    let x = Rows {
        buf: &xb,
        off: 1,
        stride: k as u32,
    };
    let e = gpu
        .gemm_silu_mul(&mut enc, &il, x, norm, Rows::new(&out, inter), 1)
        .unwrap_err();
    assert!(e.to_string().contains("rms_norm"), "{e}");
}
