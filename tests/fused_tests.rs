//! The fused kernels give exactly the bits of the ops they replace: the
//! gate·up gemm with its silu·mul epilogue equals a stacked gemm then
//! `silu_mul` under every row tile (and a row alone equals it in a batch),
//! `rope_cache_write` equals `rope` then `cache_write`, and the qkv gemm with
//! its rope epilogue equals the qkv gemm then `rope_cache_write`. Both also against CPU
//! references, on awkward sizes.

mod common;

use common::*;
use wllm::backend::wgsl::{GpuWeight, PagedKv, Rows};
use wllm::backend::{Backend, FusedOps, KvDtype, RopeArgs, RopePairing};
use wllm::model::layer_weights::pair_rope_rows;
use wllm::model::rope::rope_table;
use wllm::quant::{self, Repacked, WeightFormat};

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

/// silu(x·gateᵀ)·(x·upᵀ) on the CPU in f64.
fn cpu_gate_up(x: &[f32], gate: &[f32], up: &[f32], t: usize, inter: usize, k: usize) -> Vec<f32> {
    let dot = |w: &[f32], i: usize, j: usize| -> f64 {
        (0..k)
            .map(|kk| f64::from(x[i * k + kk]) * f64::from(w[j * k + kk]))
            .sum()
    };
    let mut out = Vec::with_capacity(t * inter);
    for i in 0..t {
        for j in 0..inter {
            let (g, u) = (dot(gate, i, j), dot(up, i, j));
            out.push((g / (1.0 + (-g).exp()) * u) as f32);
        }
    }
    out
}

#[test]
fn gemm_silu_mul_equals_gemm_then_silu_mul_every_format_and_tile() {
    check_gate_up(kernels(), &WeightFormat::ALL);
}

#[test]
fn gpu_shaped_gemm_silu_mul_equals_gemm_then_silu_mul() {
    let mut ks = wllm::backend::wgsl::Kernels::new(&kernels().ctx).unwrap();
    ks.use_gpu_shapes();
    check_gate_up(&ks, &WeightFormat::ALL);
    // An odd TN is rounded up to even for the epilogue (a quantised and a
    // float format: each tile compiles its own pipelines).
    ks.tiles.decode_tn = 3;
    ks.tiles.prefill_tn = 5;
    check_gate_up(&ks, &[WeightFormat::Q4_1, WeightFormat::F16]);
}

/// Every row tile for the default model's format and f16 (Hugging Face
/// checkpoints); the decode tile and the largest for the other formats, whose
/// tiles differ from those only in the dequantisation each tile shares (every
/// tile is its own pipeline, and compiling them all cost minutes of CI).
fn tiles_to_check(tiles: Vec<u32>, format: WeightFormat) -> Vec<u32> {
    if matches!(format, WeightFormat::Q4_1 | WeightFormat::F16) || tiles.len() <= 2 {
        return tiles;
    }
    vec![tiles[0], tiles[tiles.len() - 1]]
}

fn check_gate_up(ks: &wllm::backend::wgsl::Kernels, formats: &[WeightFormat]) {
    for (fi, &format) in formats.iter().enumerate() {
        for (k, inter, t) in [(awkward_k(format), 37usize, 67usize), (576, 100, 3), (576, 9, 1)] {
            let mut r = rng(40 + fi as u64);
            let (gb, ub) = (
                rand_weight_bytes(&mut r, format, inter, k),
                rand_weight_bytes(&mut r, format, inter, k),
            );
            let repack = |b: &[u8]| quant::repack_wide(format, b, inter, k).unwrap();
            let (g, u) = (repack(&gb), repack(&ub));
            let il = GpuWeight::upload(&ks.ctx, &Repacked::interleave_rows(&g, &u, "t").unwrap(), "il");
            let st = GpuWeight::upload(&ks.ctx, &Repacked::stack_rows(&[g, u], "t").unwrap(), "st");
            let x = rand_vec(&mut r, t * k);
            let xb = upload(&x);
            let (gu, unfused) = (zeros(t * 2 * inter), zeros(t * inter));
            let mut enc = encoder();
            ks.gemm(&mut enc, &st, Rows::new(&xb, k), Rows::new(&gu, 2 * inter), t as u32)
                .unwrap();
            ks.act_mul(
                &mut enc,
                &gu,
                &unfused,
                t as u32,
                inter as u32,
                wllm::backend::Activation::Silu,
            )
            .unwrap();
            let tiles = tiles_to_check(ks.row_tiles(&il), format);
            let fused: Vec<wgpu::Buffer> = tiles.iter().map(|_| zeros(t * inter)).collect();
            for (tm, out) in tiles.iter().zip(&fused) {
                ks.gemm_silu_mul_with(
                    &mut enc,
                    &il,
                    Rows::new(&xb, k),
                    Rows::new(out, inter),
                    t as u32,
                    *tm,
                    None,
                )
                .unwrap();
            }
            let mut reads = vec![(&unfused, t * inter)];
            reads.extend(fused.iter().map(|b| (b, t * inter)));
            let outs: Vec<Vec<f32>> = run_read(enc, &reads);
            for (tm, got) in tiles.iter().zip(&outs[1..]) {
                assert_eq!(bits(got), bits(&outs[0]), "{format:?} K={k} T={t} tile {tm}");
            }
            let gc = quant::dequantize(format, &gb, inter, k).unwrap();
            let uc = quant::dequantize(format, &ub, inter, k).unwrap();
            let want = cpu_gate_up(&x, &gc, &uc, t, inter, k);
            for (i, (a, b)) in outs[0].iter().zip(&want).enumerate() {
                let tol = 1e-4 * b.abs().max(1.0) * k as f32 / 64.0;
                assert!((a - b).abs() <= tol, "{format:?} element {i}: got {a} want {b}");
            }
        }
    }
}

#[test]
fn gemm_silu_mul_row_alone_equals_row_in_a_batch() {
    let ks = kernels();
    let (format, k, inter, t) = (WeightFormat::Q4_1, 576usize, 70usize, 40usize);
    let mut r = rng(77);
    let g = quant::repack_wide(format, &rand_weight_bytes(&mut r, format, inter, k), inter, k).unwrap();
    let u = quant::repack_wide(format, &rand_weight_bytes(&mut r, format, inter, k), inter, k).unwrap();
    let il = GpuWeight::upload(&ks.ctx, &Repacked::interleave_rows(&g, &u, "t").unwrap(), "il");
    let x = rand_vec(&mut r, t * k);
    let (xb, batch) = (upload(&x), zeros(t * inter));
    let mut enc = encoder();
    ks.gemm_silu_mul(
        &mut enc,
        &il,
        Rows::new(&xb, k),
        None,
        Rows::new(&batch, inter),
        t as u32,
    )
    .unwrap();
    let batch: Vec<f32> = run_read(enc, &[(&batch, t * inter)]).remove(0);
    for row in [0usize, 17, 39] {
        let (x1, y1) = (upload(&x[row * k..(row + 1) * k]), zeros(inter));
        let mut enc = encoder();
        ks.gemm_silu_mul(&mut enc, &il, Rows::new(&x1, k), None, Rows::new(&y1, inter), 1)
            .unwrap();
        let one: Vec<f32> = run_read(enc, &[(&y1, inter)]).remove(0);
        assert_eq!(bits(&one), bits(&batch[row * inter..(row + 1) * inter]), "row {row}");
    }
}

#[test]
fn rope_cache_write_equals_rope_then_cache_write() {
    let ks = kernels();
    for (hq, hk, hd, t, pairing) in [
        (9u32, 3u32, 64u32, 19usize, RopePairing::Adjacent),
        (4, 4, 32, 5, RopePairing::RotateHalf),
        (6, 2, 80, 1, RopePairing::RotateHalf),
    ] {
        let width = ((hq + 2 * hk) * hd) as usize;
        let kvw = (hk * hd) as usize;
        let slots = 3 * t + 5;
        let mut r = rng(u64::from(hq * hd));
        let qkv = rand_vec(&mut r, t * width);
        let pos: Vec<u32> = (0..t as u32).map(|i| (i * 13 + 2) % 40).collect();
        // Distinct slots, out of order.
        let slot: Vec<u32> = (0..t as u32).map(|i| (i * 7 + 3) % slots as u32).collect();
        let table = upload(&rope_table(40, hd as usize, 10000.0));
        let (pb, sb) = (upload(&pos), upload(&slot));
        // `tex`: the caches as `Backend::kv_cache` makes them (textures on CPU adapters).
        let run = |fused: bool, tex: bool, dtype: KvDtype| -> Vec<Vec<f32>> {
            let cache = || match tex {
                true => ks.kv_cache(slots as u64, kvw as u32, dtype).unwrap(),
                false => zeros((slots * dtype.row_bytes(kvw as u64) as usize).div_ceil(4)),
            };
            let (xb, kc, vc) = (upload(&qkv), cache(), cache());
            let kv = PagedKv {
                k_cache: &kc,
                v_cache: &vc,
                dtype,
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
            let rope = RopeArgs {
                positions: &pb,
                table: &table,
                max_pos: 40,
                pairing,
            };
            let mut enc = encoder();
            if fused {
                ks.rope_cache_write(&mut enc, &xb, width as u32, rope, kv, hq, &sb, t as u32)
                    .unwrap();
            } else {
                ks.rope(
                    &mut enc,
                    &xb,
                    width as u32,
                    &pb,
                    &table,
                    40,
                    t as u32,
                    hq + hk,
                    hd,
                    pairing,
                )
                .unwrap();
                ks.cache_write(
                    &mut enc,
                    Rows::new(&xb, width),
                    hq * hd,
                    (hq + hk) * hd,
                    hk * hd,
                    &sb,
                    &kc,
                    &vc,
                    slots as u32,
                    dtype,
                    t as u32,
                )
                .unwrap();
            }
            let qkv_out: Vec<f32> = run_read(enc, &[(&xb, t * width)]).remove(0);
            let read = |c| ks.read_kv_cache(c, slots as u32, kvw as u32, dtype).unwrap();
            vec![qkv_out, read(&kc), read(&vc)]
        };
        // (q8_0 where the KV row is whole blocks of 32.)
        for dtype in KvDtype::ALL
            .into_iter()
            .filter(|d| kvw.is_multiple_of(d.row_multiple() as usize))
        {
            let unfused = run(false, false, dtype);
            for (fused, tex) in [(true, false), (true, true), (false, true)] {
                let got = run(fused, tex, dtype);
                for (what, (a, b)) in ["qkv", "k_cache", "v_cache"].iter().zip(got.iter().zip(&unfused)) {
                    assert_eq!(
                        bits(a),
                        bits(b),
                        "{what}: hq {hq} hk {hk} hd {hd} T {t}, fused {fused}, textures {tex}, {dtype}"
                    );
                }
            }
            // The halves are the f32 cache's values, each rounded to the
            // nearest half, ties to even (half_pack.wgsl), as `half` rounds.
            if dtype == KvDtype::F16 {
                let full = run(false, false, KvDtype::F32);
                for c in 1..3 {
                    let rounded: Vec<f32> = full[c].iter().map(|&x| half::f16::from_f32(x).to_f32()).collect();
                    assert_eq!(bits(&unfused[c]), bits(&rounded), "f16 cache {c}: hq {hq} hd {hd}");
                }
            }
        }
        let fused = run(true, false, KvDtype::F32);
        // The written slots hold the rotated K and the V of their token.
        for (i, &s) in slot.iter().enumerate() {
            let row = &fused[0][i * width..(i + 1) * width];
            let k_at = (hq * hd) as usize;
            assert_eq!(
                &fused[1][s as usize * kvw..(s as usize + 1) * kvw],
                &row[k_at..k_at + kvw]
            );
            assert_eq!(&fused[2][s as usize * kvw..(s as usize + 1) * kvw], &row[k_at + kvw..]);
            if pos[i] > 0 {
                assert_ne!(&row[..k_at], &qkv[i * width..i * width + k_at], "q was rotated");
            }
        }
    }
}

/// The qkv gemm with its rope epilogue (q and k rows paired by
/// `pair_rope_rows`) writes exactly the qkv rows and cache rows of the qkv
/// gemm then `rope_cache_write`, under every row tile, both pairings, on the
/// CPU shapes (weight textures) and the GPU shapes (buffers), into caches as
/// buffers and as `Backend::kv_cache` makes them (textures on CPU adapters,
/// written a texel at a time by the epilogue).
#[test]
fn gemm_rope_kv_equals_gemm_then_rope_cache_write() {
    let mut gpu = wllm::backend::wgsl::Kernels::new(&kernels().ctx).unwrap();
    gpu.use_gpu_shapes();
    // Each shape set with a quantised and a float format, both pairings
    // (every tile compiles its own pipeline: two formats each keep this short).
    let cases = [
        (WeightFormat::Q4_1, 9u32, 3u32, 64u32, 7usize, RopePairing::Adjacent),
        (WeightFormat::F16, 3, 1, 16, 1, RopePairing::RotateHalf),
        (WeightFormat::Q8_0, 4, 2, 32, 19, RopePairing::RotateHalf),
        (WeightFormat::F32, 2, 2, 8, 33, RopePairing::Adjacent),
    ];
    for (ks, shapes, cases) in [(kernels(), "cpu", &cases[..2]), (&gpu, "gpu", &cases[2..])] {
        assert!(ks.fuses_qkv_rope(), "{shapes}");
        for (fi, &(format, hq, hk, hd, t, pairing)) in cases.iter().enumerate() {
            let (k, width) = (576usize, ((hq + 2 * hk) * hd) as usize);
            let (q_rows, kv_rows) = ((hq * hd) as usize, (hk * hd) as usize);
            let mut r = rng(90 + fi as u64);
            let parts: Vec<Repacked> = [q_rows, kv_rows, kv_rows]
                .iter()
                .map(|&n| quant::repack_wide(format, &rand_weight_bytes(&mut r, format, n, k), n, k).unwrap())
                .collect();
            let plain = GpuWeight::upload(&ks.ctx, &Repacked::stack_rows(&parts, "t").unwrap(), "qkv");
            let hdu = hd as usize;
            let paired = [
                pair_rope_rows(&parts[0], hdu, pairing),
                pair_rope_rows(&parts[1], hdu, pairing),
                parts[2].clone(),
            ];
            let fused_w = GpuWeight::upload(&ks.ctx, &Repacked::stack_rows(&paired, "t").unwrap(), "qkv");
            let x = rand_vec(&mut r, t * k);
            let pos: Vec<u32> = (0..t as u32).map(|i| (i * 5 + 1) % 30).collect();
            let slots = 2 * t + 3;
            let slot: Vec<u32> = (0..t as u32).map(|i| (i * 7 + 2) % slots as u32).collect();
            let (xb, pb, sb) = (upload(&x), upload(&pos), upload(&slot));
            let table = upload(&rope_table(30, hdu, 10000.0));
            let rope = RopeArgs {
                positions: &pb,
                table: &table,
                max_pos: 30,
                pairing,
            };
            let kvw = kv_rows;
            // `tex`: the caches as `Backend::kv_cache` makes them (textures on CPU adapters).
            let run = |tm: Option<u32>, tex: bool, dtype: KvDtype| -> Vec<Vec<f32>> {
                let cache = || match tex {
                    true => ks.kv_cache(slots as u64, kvw as u32, dtype).unwrap(),
                    false => zeros((slots * dtype.row_bytes(kvw as u64) as usize).div_ceil(4)),
                };
                let (qkv, kc, vc) = (zeros(t * width), cache(), cache());
                let kv = PagedKv {
                    k_cache: &kc,
                    v_cache: &vc,
                    dtype,
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
                let (xr, yr) = (Rows::new(&xb, k), Rows::new(&qkv, width));
                match tm {
                    Some(tm) => ks
                        .gemm_rope_kv_with(&mut enc, &fused_w, xr, yr, rope, kv, hq, &sb, t as u32, tm, None)
                        .unwrap(),
                    None => {
                        ks.gemm(&mut enc, &plain, xr, yr, t as u32).unwrap();
                        ks.rope_cache_write(&mut enc, &qkv, width as u32, rope, kv, hq, &sb, t as u32)
                            .unwrap();
                    }
                }
                let qkv_out: Vec<f32> = run_read(enc, &[(&qkv, t * width)]).remove(0);
                let read = |c| ks.read_kv_cache(c, slots as u32, kvw as u32, dtype).unwrap();
                vec![qkv_out, read(&kc), read(&vc)]
            };
            for dtype in KvDtype::ALL
                .into_iter()
                .filter(|d| kvw.is_multiple_of(d.row_multiple() as usize))
            {
                let want = run(None, false, dtype);
                let tiles = ks.row_tiles(&fused_w);
                for &tm in &tiles {
                    // The texel stores and the halves do not depend on TM: the
                    // decode and the largest tile check them (every tile
                    // compiles its own pipeline).
                    let ends = tm == tiles[0] || Some(&tm) == tiles.last();
                    if dtype != KvDtype::F32 && !ends {
                        continue;
                    }
                    for tex in [false, true].into_iter().filter(|&tex| !tex || ends) {
                        let got = run(Some(tm), tex, dtype);
                        for (what, (a, b)) in ["qkv", "k_cache", "v_cache"].iter().zip(got.iter().zip(&want)) {
                            assert_eq!(
                                bits(a),
                                bits(b),
                                "{shapes} {format:?} {pairing:?} tile {tm} textures {tex} {dtype}: {what}"
                            );
                        }
                    }
                }
            }
        }
    }
}
