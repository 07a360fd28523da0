//! rms_norm, rope, silu_mul, embed and argmax against CPU references, and the
//! batch invariance of rms_norm and rope.

mod common;

use common::reference::*;
use common::*;
use wllm::backend::Backend;
use wllm::backend::wgsl::{RopePairing, Rows};
use wllm::model::rope::rope_table;
use wllm::quant::{self, WeightFormat};

#[test]
fn rms_norm_matches_cpu_with_and_without_residual_and_gather() {
    let ks = kernels();
    for (t, d) in [(1usize, 576usize), (3, 77), (67, 1000), (130, 5)] {
        let mut r = rng(t as u64);
        let (x, res, w) = (rand_vec(&mut r, t * d), rand_vec(&mut r, t * d), rand_vec(&mut r, d));
        let (xb, wb, rb) = (upload(&x), upload(&w), upload(&res));
        let (y0, y1) = (zeros(t * d), zeros(t * d));
        let mut enc = encoder();
        ks.rms_norm(
            &mut enc,
            Rows::new(&xb, d),
            &wb,
            None,
            None,
            1e-5,
            t as u32,
            d as u32,
            &y0,
        )
        .unwrap();
        ks.rms_norm(
            &mut enc,
            Rows::new(&xb, d),
            &wb,
            Some(&rb),
            None,
            1e-5,
            t as u32,
            d as u32,
            &y1,
        )
        .unwrap();
        let out: Vec<Vec<f32>> = run_read(enc, &[(&y0, t * d), (&y1, t * d), (&rb, t * d)]);
        let h: Vec<f32> = x.iter().zip(&res).map(|(a, b)| a + b).collect();
        for i in 0..t {
            let row = i * d..(i + 1) * d;
            close(
                &out[0][row.clone()],
                &cpu_rms_norm(&x[row.clone()], &w, 1e-5),
                1e-5,
                "rms_norm",
            );
            close(
                &out[1][row.clone()],
                &cpu_rms_norm(&h[row.clone()], &w, 1e-5),
                1e-5,
                "rms_norm+residual",
            );
        }
        assert_eq!(out[2], h, "the residual stream must hold x + r");
    }
    // Gather: output row i normalises input row rows[i].
    let (t, d) = (10usize, 64usize);
    let mut r = rng(99);
    let (x, w) = (rand_vec(&mut r, t * d), rand_vec(&mut r, d));
    let rows = [9u32, 0, 4];
    let (xb, wb, rowb, y) = (upload(&x), upload(&w), upload(&rows), zeros(3 * d));
    let mut enc = encoder();
    ks.rms_norm(
        &mut enc,
        Rows::new(&xb, d),
        &wb,
        None,
        Some(&rowb),
        1e-6,
        3,
        d as u32,
        &y,
    )
    .unwrap();
    let got: Vec<f32> = run_read(enc, &[(&y, 3 * d)]).remove(0);
    for (i, &src) in rows.iter().enumerate() {
        let s = src as usize;
        close(
            &got[i * d..(i + 1) * d],
            &cpu_rms_norm(&x[s * d..(s + 1) * d], &w, 1e-6),
            1e-5,
            "gathered rms_norm",
        );
    }
}

#[test]
fn rms_norm_and_rope_are_batch_invariant() {
    let ks = kernels();
    let (t, d, hd) = (64usize, 576usize, 64u32);
    let mut r = rng(5);
    let (x, w) = (rand_vec(&mut r, t * d), rand_vec(&mut r, d));
    let pos: Vec<u32> = (0..t as u32).map(|i| i * 7 % 50).collect();
    let table = upload(&rope_table(64, hd as usize, 10000.0));
    let (xb, wb, pb) = (upload(&x), upload(&w), upload(&pos));
    let (yb, rot) = (zeros(t * d), upload(&x));
    let mut enc = encoder();
    ks.rms_norm(
        &mut enc,
        Rows::new(&xb, d),
        &wb,
        None,
        None,
        1e-5,
        t as u32,
        d as u32,
        &yb,
    )
    .unwrap();
    ks.rope(
        &mut enc,
        &rot,
        d as u32,
        &pb,
        &table,
        64,
        t as u32,
        9,
        hd,
        RopePairing::Adjacent,
    )
    .unwrap();
    let batch: Vec<Vec<f32>> = run_read(enc, &[(&yb, t * d), (&rot, t * d)]);
    for row in [0usize, 13, 63] {
        let xr = &x[row * d..(row + 1) * d];
        let (x1, y1, r1, p1) = (upload(xr), zeros(d), upload(xr), upload(&pos[row..row + 1]));
        let mut enc = encoder();
        ks.rms_norm(&mut enc, Rows::new(&x1, d), &wb, None, None, 1e-5, 1, d as u32, &y1)
            .unwrap();
        ks.rope(
            &mut enc,
            &r1,
            d as u32,
            &p1,
            &table,
            64,
            1,
            9,
            hd,
            RopePairing::Adjacent,
        )
        .unwrap();
        let one: Vec<Vec<f32>> = run_read(enc, &[(&y1, d), (&r1, d)]);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&one[0]),
            bits(&batch[0][row * d..(row + 1) * d]),
            "rms_norm row {row}"
        );
        assert_eq!(bits(&one[1]), bits(&batch[1][row * d..(row + 1) * d]), "rope row {row}");
    }
}

#[test]
fn rope_matches_cpu_both_pairings() {
    let ks = kernels();
    for (pairing, adjacent) in [(RopePairing::RotateHalf, false), (RopePairing::Adjacent, true)] {
        for (t, heads, hd, extra) in [
            (1usize, 9usize, 64usize, 3usize),
            (3, 3, 32, 0),
            (67, 12, 64, 64),
            (130, 2, 16, 5),
        ] {
            let stride = heads * hd + extra;
            let theta = 100000.0;
            let mut r = rng(t as u64 + 3);
            let x = rand_vec(&mut r, t * stride);
            let pos: Vec<u32> = (0..t as u32).map(|i| (i * 37) % 1000).collect();
            let table = upload(&rope_table(1000, hd, theta));
            let (xb, pb) = (upload(&x), upload(&pos));
            let mut enc = encoder();
            ks.rope(
                &mut enc,
                &xb,
                stride as u32,
                &pb,
                &table,
                1000,
                t as u32,
                heads as u32,
                hd as u32,
                pairing,
            )
            .unwrap();
            let got: Vec<f32> = run_read(enc, &[(&xb, t * stride)]).remove(0);
            let mut want = x.clone();
            for i in 0..t {
                cpu_rope(
                    &mut want[i * stride..i * stride + heads * hd],
                    pos[i] as usize,
                    heads,
                    hd,
                    theta,
                    adjacent,
                );
            }
            close(&got, &want, 1e-5, "rope");
        }
    }
}

#[test]
fn silu_mul_matches_cpu() {
    let ks = kernels();
    for (t, inter) in [(1usize, 1536usize), (3, 7), (67, 100), (130, 65)] {
        let mut r = rng(t as u64);
        let gu: Vec<f32> = rand_vec(&mut r, t * 2 * inter).iter().map(|v| v * 8.0).collect();
        let (gb, ob) = (upload(&gu), zeros(t * inter));
        let mut enc = encoder();
        ks.act_mul(
            &mut enc,
            &gb,
            &ob,
            t as u32,
            inter as u32,
            wllm::backend::Activation::Silu,
        )
        .unwrap();
        let got: Vec<f32> = run_read(enc, &[(&ob, t * inter)]).remove(0);
        let mut want = Vec::new();
        for i in 0..t {
            for j in 0..inter {
                let g = f64::from(gu[i * 2 * inter + j]);
                let u = f64::from(gu[i * 2 * inter + inter + j]);
                want.push((g / (1.0 + (-g).exp()) * u) as f32);
            }
        }
        close(&got, &want, 1e-5, "silu_mul");
    }
}

#[test]
fn embed_gathers_rows_in_every_format() {
    let ks = kernels();
    for format in WeightFormat::ALL {
        for d in [quant_or(format, 77), 576] {
            let vocab = 1000;
            let mut r = rng(d as u64);
            let bytes = rand_weight_bytes(&mut r, format, vocab, d);
            let cpu = quant::dequantize(format, &bytes, vocab, d).unwrap();
            let w = wllm::backend::wgsl::GpuWeight::upload(
                &ks.ctx,
                &quant::repack_wide(format, &bytes, vocab, d).unwrap(),
                "emb",
            );
            let ids = [0u32, 999, 17, 17, 500, 3, 250];
            let (ib, ob) = (upload(&ids), zeros(ids.len() * d));
            let mut enc = encoder();
            ks.embed(&mut enc, &w, &ib, ids.len() as u32, &ob).unwrap();
            let got: Vec<f32> = run_read(enc, &[(&ob, ids.len() * d)]).remove(0);
            for (t, &id) in ids.iter().enumerate() {
                let id = id as usize;
                close(
                    &got[t * d..(t + 1) * d],
                    &cpu[id * d..(id + 1) * d],
                    1e-6,
                    &format!("embed {format:?} d={d}"),
                );
            }
        }
    }
}

fn quant_or(format: WeightFormat, k: usize) -> usize {
    if format.is_quantized() { 96 } else { k }
}

#[test]
fn argmax_finds_first_maximum() {
    // The adapter's workgroup size, and the other shape's (64 lanes on CPU
    // adapters, 256 on GPUs).
    let mut other = wllm::backend::wgsl::Kernels::new(&kernels().ctx).unwrap();
    if other.cpu_shapes {
        other.use_gpu_shapes();
    } else {
        other.use_cpu_shapes();
    }
    assert_ne!(kernels().argmax_wg(), other.argmax_wg());
    for ks in [kernels(), &other] {
        argmax_of_rows(ks);
    }
}

fn argmax_of_rows(ks: &wllm::backend::wgsl::Kernels) {
    for (rows, n) in [(1usize, 49152usize), (3, 7), (67, 1000), (130, 65), (2, 300)] {
        let mut r = rng(n as u64);
        let mut x = rand_vec(&mut r, rows * n);
        // Ties: the lowest index must win.
        for i in 0..rows {
            let a = (i * 31) % n;
            let b = (i * 17 + n / 2) % n;
            x[i * n + a] = 5.0;
            x[i * n + b] = 5.0;
            x[i * n + (i % n)] = f32::NAN;
        }
        let (xb, ob) = (upload(&x), zeros(rows));
        let mut enc = encoder();
        ks.argmax(&mut enc, &xb, n as u32, rows as u32, &ob).unwrap();
        let got: Vec<u32> = run_read(enc, &[(&ob, rows)]).remove(0);
        for i in 0..rows {
            let row = &x[i * n..(i + 1) * n];
            let mut best = 0;
            for (j, &v) in row.iter().enumerate() {
                if !v.is_nan() && (row[best].is_nan() || v > row[best]) {
                    best = j;
                }
            }
            assert_eq!(got[i] as usize, best, "row {i} of {rows}x{n}");
        }
    }
}
