//! The quantiser against llama.cpp's gguf-py: the legacy types bit for bit
//! with `gguf.quants.quantize`; the K-quants within their formats' error and
//! read back by gguf-py as wllm reads them.

mod common;

use common::*;
use rand::Rng;
use wllm::quant::{self, WeightFormat, quantize::quantize};

/// Rows of weight-like values: Gaussian-ish, with an all-zero block, a block
/// of ties and a few outliers (the awkward cases of each rounding rule).
fn weights(seed: u64, n: usize, k: usize) -> Vec<f32> {
    let mut r = rng(seed);
    let mut x: Vec<f32> = (0..n * k)
        .map(|_| {
            let s: f32 = (0..4).map(|_| r.random_range(-1.0f32..1.0)).sum();
            0.05 * s
        })
        .collect();
    x[..32].fill(0.0);
    x[32..64].fill(0.25);
    x[64 + 7] = 3.0;
    x[n * k - 5] = -2.5;
    x
}

#[test]
fn legacy_types_equal_gguf_py_bit_for_bit() {
    for format in [
        WeightFormat::Q8_0,
        WeightFormat::Q4_0,
        WeightFormat::Q4_1,
        WeightFormat::Q5_0,
        WeightFormat::Q5_1,
        WeightFormat::F16,
        WeightFormat::Bf16,
    ] {
        let (n, k) = (6, 320);
        let x = weights(11, n, k);
        let ours = quantize(format, &x, n, k).unwrap();
        let theirs = gguf_py::quantize(format, &x, n);
        assert_eq!(ours.len(), theirs.len(), "{format:?} size");
        let first = ours.iter().zip(&theirs).position(|(a, b)| a != b);
        assert!(first.is_none(), "{format:?}: first differing byte {first:?}");
    }
}

/// RMS error of the round trip over RMS of the values, the format's bound:
/// about 0.5 of a quantisation step over the spread a sub-block's scale covers.
fn bound(format: WeightFormat) -> f64 {
    match format {
        WeightFormat::Q2_K => 0.45,
        WeightFormat::Q3_K => 0.22,
        WeightFormat::Q4_K => 0.11,
        WeightFormat::Q5_K => 0.055,
        WeightFormat::Q6_K => 0.03,
        _ => unreachable!(),
    }
}

#[test]
fn k_quants_round_trip_within_their_bound_and_gguf_py_reads_them() {
    for (fi, format) in [
        WeightFormat::Q2_K,
        WeightFormat::Q3_K,
        WeightFormat::Q4_K,
        WeightFormat::Q5_K,
        WeightFormat::Q6_K,
    ]
    .into_iter()
    .enumerate()
    {
        let (n, k) = (8, 768);
        let x = weights(20 + fi as u64, n, k);
        let bytes = quantize(format, &x, n, k).unwrap();
        assert_eq!(bytes.len(), format.stored_bytes(n, k));
        let ours = quant::dequantize(format, &bytes, n, k).unwrap();
        let theirs = gguf_py::dequantize(format, &bytes, n);
        assert_eq!(ours, theirs, "{format:?}: wllm and gguf-py read the blocks differently");
        // Zero blocks stay zero; the error is measured on the rest.
        assert!(ours[..32].iter().all(|&v| v == 0.0), "{format:?} zero block");
        let (mut se, mut sx) = (0f64, 0f64);
        for (a, b) in x.iter().zip(&ours) {
            se += f64::from(a - b).powi(2);
            sx += f64::from(*a).powi(2);
        }
        let rel = (se / sx).sqrt();
        eprintln!("{format:?}: relative RMS error {rel:.4}");
        assert!(rel <= bound(format), "{format:?}: relative RMS error {rel:.4} over {}", bound(format));
    }
}

#[test]
fn finer_k_quants_are_more_precise() {
    let (n, k) = (4, 512);
    let x = weights(5, n, k);
    let err = |f: WeightFormat| -> f64 {
        let y = quant::dequantize(f, &quantize(f, &x, n, k).unwrap(), n, k).unwrap();
        x.iter().zip(&y).map(|(a, b)| f64::from(a - b).powi(2)).sum()
    };
    let e: Vec<f64> = [
        WeightFormat::Q2_K,
        WeightFormat::Q3_K,
        WeightFormat::Q4_K,
        WeightFormat::Q5_K,
        WeightFormat::Q6_K,
        WeightFormat::Q8_0,
    ]
    .into_iter()
    .map(err)
    .collect();
    assert!(e.windows(2).all(|w| w[0] > w[1]), "errors not decreasing: {e:?}");
}

#[test]
fn bad_quantize_input_is_refused() {
    let x = vec![0.5f32; 2 * 576];
    let e = quantize(WeightFormat::Q4_K, &x, 2, 576).unwrap_err().to_string();
    assert!(e.contains("multiple of 256"), "{e}");
    let e = quantize(WeightFormat::IQ4_NL, &x, 2, 576).unwrap_err().to_string();
    assert!(e.contains("cannot write"), "{e}");
    assert!(quantize(WeightFormat::Q8_0, &x, 3, 576).is_err());
}
