//! Every GGUF type wllm reads, against llama.cpp's gguf-py on random blocks
//! with valid scales: the CPU dequantiser gives gguf-py's values, and the gemm
//! (every row tile, CPU-adapter and GPU shapes) and embed kernels over the
//! repacked layout match a reference computed from gguf-py's values.

mod common;

use common::*;
use wllm::backend::wgsl::{GpuWeight, Kernels, Rows};
use wllm::backend::{Backend, FusedOps};
use wllm::quant::{self, Repacked, WeightFormat};

/// Equal values (+0 and -0 alike), or both NaN.
fn same(a: f32, b: f32) -> bool {
    a == b || (a.is_nan() && b.is_nan())
}

#[test]
fn cpu_dequantiser_equals_gguf_py_for_every_type() {
    for (fi, format) in WeightFormat::STORED.into_iter().enumerate() {
        let (n, k) = (7, awkward_k(format));
        let bytes = rand_weight_bytes(&mut rng(300 + fi as u64), format, n, k);
        let want = gguf_py::dequantize(format, &bytes, n);
        let got = quant::dequantize(format, &bytes, n, k).unwrap();
        assert_eq!(got.len(), want.len(), "{format:?}");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(same(*g, *w), "{format:?} element {i}: wllm {g}, gguf-py {w}");
        }
    }
}

/// Y = X·Wᵀ in f64 and Σ|x·w| for the tolerance.
fn cpu_gemm(x: &[f32], w: &[f32], t: usize, n: usize, k: usize) -> (Vec<f64>, Vec<f64>) {
    let mut y = vec![0.0; t * n];
    let mut mag = vec![0.0; t * n];
    for i in 0..t {
        for j in 0..n {
            for kk in 0..k {
                let p = f64::from(x[i * k + kk]) * f64::from(w[j * k + kk]);
                y[i * n + j] += p;
                mag[i * n + j] += p.abs();
            }
        }
    }
    (y, mag)
}

fn check_kernels(ks: &Kernels, shapes: &str) {
    let quantized = WeightFormat::STORED.into_iter().filter(|f| f.is_quantized());
    for (fi, format) in quantized.enumerate() {
        let (n, k) = (37usize, awkward_k(format));
        let mut r = rng(400 + fi as u64);
        let bytes = rand_weight_bytes(&mut r, format, n, k);
        let want_w = gguf_py::dequantize(format, &bytes, n);
        let w = GpuWeight::upload(&ks.ctx, &quant::repack(format, &bytes, n, k).unwrap(), "w");
        // T = 1, 3, 9, 17 and 67 reach every row tile (1, 4, 8, 16 and the prefill tile).
        for t in [1usize, 3, 9, 17, 67] {
            let x = rand_vec(&mut r, t * k);
            let (xb, yb) = (upload(&x), zeros(t * n));
            let mut enc = encoder();
            ks.gemm(&mut enc, &w, Rows::new(&xb, k), Rows::new(&yb, n), t as u32)
                .unwrap();
            let got: Vec<f32> = run_read(enc, &[(&yb, t * n)]).remove(0);
            let (want, mag) = cpu_gemm(&x, &want_w, t, n, k);
            for i in 0..t * n {
                let err = (f64::from(got[i]) - want[i]).abs();
                assert!(
                    err <= 1e-5 * mag[i] + 1e-6,
                    "{shapes} gemm {format:?} T={t}: element {i} got {} want {}",
                    got[i],
                    want[i]
                );
            }
        }
        let ids = [0u32, 36, 5, 5, 20];
        let (ib, ob) = (upload(&ids), zeros(ids.len() * k));
        let mut enc = encoder();
        ks.embed(&mut enc, &w, &ib, ids.len() as u32, &ob).unwrap();
        let got: Vec<f32> = run_read(enc, &[(&ob, ids.len() * k)]).remove(0);
        for (t, &id) in ids.iter().enumerate() {
            let want = &want_w[id as usize * k..(id as usize + 1) * k];
            close(
                &got[t * k..(t + 1) * k],
                want,
                1e-6,
                &format!("{shapes} embed {format:?}"),
            );
        }
    }
}

#[test]
fn kernels_match_gguf_py_for_every_type_and_tile() {
    check_kernels(kernels(), "adapter shapes");
}

#[test]
fn gpu_shaped_kernels_match_gguf_py_for_every_type_and_tile() {
    let mut ks = Kernels::new(&kernels().ctx).unwrap();
    ks.use_gpu_shapes();
    check_kernels(&ks, "gpu shapes");
}

#[test]
fn misaligned_rows_and_sizes_are_refused() {
    for format in [WeightFormat::Q4_K, WeightFormat::Q6_K, WeightFormat::IQ4_XS] {
        // A row of 576 is no whole number of 256-element super-blocks.
        let bytes = vec![0u8; format.stored_bytes(2, 768)];
        let e = quant::repack(format, &bytes, 2, 512).unwrap_err().to_string();
        assert!(e.contains("bytes"), "{e}");
        let e = quant::dequantize(format, &vec![0u8; 4096], 2, 576)
            .unwrap_err()
            .to_string();
        assert!(e.contains("multiple of 256"), "{format:?}: {e}");
    }
}

/// The narrow layouts (`quant::planes`) give the wide layouts' bits: the
/// gemm at every row tile and the embedding gather over a narrow weight
/// equal, element for element, the same over it widened (what files were
/// read as before, and what backends without the narrow kernels get); and
/// they take at most 1.15× the file's bytes.
fn check_narrow_bits(ks: &Kernels, shapes: &str) {
    let types = WeightFormat::STORED.into_iter().filter(|f| f.narrow().is_some());
    for (fi, format) in types.enumerate() {
        let (n, k) = (37usize, awkward_k(format));
        let mut r = rng(500 + fi as u64);
        let bytes = rand_weight_bytes(&mut r, format, n, k);
        let narrow = quant::repack(format, &bytes, n, k).unwrap();
        assert!(narrow.format.is_narrow(), "{format:?}");
        let resident = (narrow.data.len() + narrow.scales.len()) as f64;
        let ratio = resident / bytes.len() as f64;
        assert!(
            ratio <= 1.15,
            "{format:?}: {resident} bytes resident for {} in the file",
            bytes.len()
        );
        let wide = quant::planes::widen(&narrow);
        let (wn, ww) = (
            GpuWeight::upload(&ks.ctx, &narrow, "narrow"),
            GpuWeight::upload(&ks.ctx, &wide, "wide"),
        );
        for t in [1usize, 3, 9, 17, 67] {
            let x = rand_vec(&mut r, t * k);
            let xb = upload(&x);
            let (yn, yw) = (zeros(t * n), zeros(t * n));
            let mut enc = encoder();
            ks.gemm(&mut enc, &wn, Rows::new(&xb, k), Rows::new(&yn, n), t as u32)
                .unwrap();
            ks.gemm(&mut enc, &ww, Rows::new(&xb, k), Rows::new(&yw, n), t as u32)
                .unwrap();
            let got = run_read::<f32>(enc, &[(&yn, t * n), (&yw, t * n)]);
            if let Some(i) = (0..t * n).find(|&i| got[0][i].to_bits() != got[1][i].to_bits()) {
                panic!(
                    "{shapes} gemm {format:?} T={t} element {i}: narrow {} wide {}",
                    got[0][i], got[1][i]
                );
            }
        }
        // The silu·mul epilogue over gate and up interleaved, narrow against wide.
        let up = quant::repack(format, &rand_weight_bytes(&mut r, format, n, k), n, k).unwrap();
        let il = |a: &Repacked, b: &Repacked| {
            GpuWeight::upload(&ks.ctx, &Repacked::interleave_rows(a, b, "gate/up").unwrap(), "il")
        };
        let (iln, ilw) = (il(&narrow, &up), il(&wide, &quant::planes::widen(&up)));
        for t in [1usize, 9, 67] {
            let x = rand_vec(&mut r, t * k);
            let xb = upload(&x);
            let (yn, yw) = (zeros(t * n), zeros(t * n));
            let mut enc = encoder();
            ks.gemm_silu_mul(&mut enc, &iln, Rows::new(&xb, k), None, Rows::new(&yn, n), t as u32)
                .unwrap();
            ks.gemm_silu_mul(&mut enc, &ilw, Rows::new(&xb, k), None, Rows::new(&yw, n), t as u32)
                .unwrap();
            let got = run_read::<f32>(enc, &[(&yn, t * n), (&yw, t * n)]);
            if let Some(i) = (0..t * n).find(|&i| got[0][i].to_bits() != got[1][i].to_bits()) {
                panic!(
                    "{shapes} gemm_silu_mul {format:?} T={t} element {i}: narrow {} wide {}",
                    got[0][i], got[1][i]
                );
            }
        }
        let ids = [0u32, 36, 5, 20];
        let (ib, on, ow) = (upload(&ids), zeros(ids.len() * k), zeros(ids.len() * k));
        let mut enc = encoder();
        ks.embed(&mut enc, &wn, &ib, ids.len() as u32, &on).unwrap();
        ks.embed(&mut enc, &ww, &ib, ids.len() as u32, &ow).unwrap();
        let got = run_read::<f32>(enc, &[(&on, ids.len() * k), (&ow, ids.len() * k)]);
        if let Some(i) = (0..got[0].len()).find(|&i| got[0][i].to_bits() != got[1][i].to_bits()) {
            panic!(
                "{shapes} embed {format:?} element {i}: narrow {} wide {}",
                got[0][i], got[1][i]
            );
        }
    }
}

#[test]
fn narrow_layouts_give_the_wide_layouts_bits() {
    check_narrow_bits(kernels(), "adapter shapes");
    let mut ks = Kernels::new(&kernels().ctx).unwrap();
    ks.use_gpu_shapes();
    check_narrow_bits(&ks, "gpu shapes");
}
