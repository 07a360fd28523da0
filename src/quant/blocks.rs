//! The GGUF block types beyond Q8_0/Q4_0/Q4_1 (Q5_0, Q5_1, the K-quants
//! Q2_K…Q6_K, IQ4_NL, IQ4_XS), decoded into 32-element [`Sub32`]s: integer
//! quants with a scale and a min per 16 elements. Written from the block
//! definitions in ggml's `ggml-common.h` and the reference dequantisers in
//! `ggml-quants.c`; every element is `d * q + m` with `d` and `m` exactly the
//! f32 factors llama.cpp multiplies by (a f16 super-scale times a small
//! integer is exact in f32), so dequantising a `Sub32` gives llama.cpp's bits.

use super::WeightFormat;
use half::f16;

/// 32 consecutive elements of a row: element `j` is `d[j / 16] * q[j] + m[j / 16]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sub32 {
    pub q: [i8; 32],
    pub d: [f32; 2],
    pub m: [f32; 2],
}

impl Sub32 {
    fn new(d: f32, m: f32) -> Sub32 {
        Sub32 {
            q: [0; 32],
            d: [d; 2],
            m: [m; 2],
        }
    }

    /// The element values, as llama.cpp computes them.
    pub fn values(&self) -> [f32; 32] {
        std::array::from_fn(|j| {
            let (d, m, q) = (self.d[j / 16], self.m[j / 16], f32::from(self.q[j]));
            if m == 0.0 { d * q } else { d * q + m }
        })
    }
}

/// IQ4_NL / IQ4_XS's non-linear code book (`kvalues_iq4nl`).
pub const IQ4_VALUES: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Q4_K / Q5_K: the 6-bit scale and min of sub-block `j` (0..8) from the 12 packed bytes.
pub fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Q3_K: the sixteen 6-bit scales (before the -32) from the 12 packed bytes.
pub fn q3k_scales(s: &[u8]) -> [u8; 16] {
    std::array::from_fn(|i| {
        let low = if i < 8 { s[i] & 0xF } else { s[i - 8] >> 4 };
        let high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        low | (high << 4)
    })
}

/// Decodes one stored block of `format` (one of the types of this module, or
/// the Q8_16 layout: 32 `i8`, then f32 d0, m0, d1, m1)
/// into its sub-blocks, appended to `out` in element order.
pub fn decode(format: WeightFormat, b: &[u8], out: &mut Vec<Sub32>) {
    use WeightFormat as F;
    match format {
        F::Q5_0 | F::Q5_1 => {
            let q5_1 = format == F::Q5_1;
            let d = f16_at(b, 0);
            let (m, h) = if q5_1 { (f16_at(b, 2), 4) } else { (0.0, 2) };
            let qh = u32::from_le_bytes([b[h], b[h + 1], b[h + 2], b[h + 3]]);
            let qs = &b[h + 4..h + 20];
            let mut s = Sub32::new(d, m);
            for (j, &byte) in qs.iter().enumerate() {
                let hi0 = ((qh >> j) & 1) as u8;
                let hi1 = ((qh >> (j + 16)) & 1) as u8;
                let (x0, x1) = ((byte & 0xF) | (hi0 << 4), (byte >> 4) | (hi1 << 4));
                let off = if q5_1 { 0 } else { 16 };
                s.q[j] = x0 as i8 - off;
                s.q[j + 16] = x1 as i8 - off;
            }
            out.push(s);
        }
        F::IQ4_NL => {
            let mut s = Sub32::new(f16_at(b, 0), 0.0);
            nl_quants(&b[2..18], &mut s.q);
            out.push(s);
        }
        F::IQ4_XS => {
            let d = f16_at(b, 0);
            let sh = u16::from_le_bytes([b[2], b[3]]);
            for ib in 0..8 {
                let low = (b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF;
                let ls = i32::from(low | ((((sh >> (2 * ib)) & 3) as u8) << 4)) - 32;
                let mut s = Sub32::new(d * ls as f32, 0.0);
                nl_quants(&b[8 + 16 * ib..24 + 16 * ib], &mut s.q);
                out.push(s);
            }
        }
        F::Q4_K | F::Q5_K => {
            let q5 = format == F::Q5_K;
            let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
            let scales = &b[4..16];
            let (qh, qs) = if q5 {
                (&b[16..48], &b[48..176])
            } else {
                (&b[0..0], &b[16..144])
            };
            for j in 0..8 {
                let (sc, mn) = scale_min_k4(j, scales);
                let mut s = Sub32::new(d * f32::from(sc), -(dmin * f32::from(mn)));
                let (bytes, shift) = (&qs[32 * (j / 2)..32 * (j / 2) + 32], 4 * (j % 2));
                for l in 0..32 {
                    let mut q = (bytes[l] >> shift) & 0xF;
                    if q5 {
                        q |= ((qh[l] >> j) & 1) << 4;
                    }
                    s.q[l] = q as i8;
                }
                out.push(s);
            }
        }
        F::Q6_K => {
            let (ql, qh) = (&b[0..128], &b[128..192]);
            let sc = &b[192..208];
            let d = f16_at(b, 208);
            // Element e of the block: half n = e / 128, within it r = e % 128,
            // quarter g = r / 32, lane l = r % 32.
            let mut elems = [0i8; 256];
            for (e, out_q) in elems.iter_mut().enumerate() {
                let (n, r) = (e / 128, e % 128);
                let (g, l) = (r / 32, r % 32);
                let lo = ql[64 * n + l + 32 * (g % 2)];
                let low = if g < 2 { lo & 0xF } else { lo >> 4 };
                let high = (qh[32 * n + l] >> (2 * g)) & 3;
                *out_q = (low | (high << 4)) as i8 - 32;
            }
            for j in 0..8 {
                let mut s = Sub32::new(0.0, 0.0);
                s.q.copy_from_slice(&elems[32 * j..32 * j + 32]);
                s.d = [0, 1].map(|h| d * f32::from(sc[2 * j + h] as i8));
                out.push(s);
            }
        }
        F::Q3_K | F::Q2_K => {
            let q3 = format == F::Q3_K;
            // Q3_K: hmask[32] qs[64] scales[12] d; Q2_K: scales[16] qs[64] d dmin.
            let (qs, d) = if q3 {
                (&b[32..96], f16_at(b, 108))
            } else {
                (&b[16..80], f16_at(b, 80))
            };
            let scales: [u8; 16] = if q3 {
                q3k_scales(&b[96..108])
            } else {
                std::array::from_fn(|i| b[i])
            };
            let dmin = if q3 { 0.0 } else { f16_at(b, 82) };
            // Element e: half n = e / 128, r = e % 128, shift 2·(r / 32), byte 32n + r % 32;
            // sub-block of 16 `e / 16` has scale index e / 16.
            for j in 0..8 {
                let mut s = Sub32::new(0.0, 0.0);
                for h in 0..2 {
                    let sc = scales[2 * j + h];
                    if q3 {
                        s.d[h] = d * (i32::from(sc) - 32) as f32;
                        s.m[h] = 0.0;
                    } else {
                        s.d[h] = d * f32::from(sc & 0xF);
                        s.m[h] = -(dmin * f32::from(sc >> 4));
                    }
                }
                for l in 0..32 {
                    let e = 32 * j + l;
                    let (n, r) = (e / 128, e % 128);
                    let byte = 32 * n + r % 32;
                    let mut q = ((qs[byte] >> (2 * (r / 32))) & 3) as i8;
                    if q3 {
                        let hbit = (b[r % 32] >> (4 * n + r / 32)) & 1;
                        q -= if hbit == 1 { 0 } else { 4 };
                    }
                    s.q[l] = q;
                }
                out.push(s);
            }
        }
        F::Q8_16 => {
            let f = |i: usize| f32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
            let mut s = Sub32::new(0.0, 0.0);
            s.q = std::array::from_fn(|j| b[j] as i8);
            (s.d, s.m) = ([f(32), f(40)], [f(36), f(44)]);
            out.push(s);
        }
        other => unreachable!("{other:?} is not decoded by blocks::decode"),
    }
}

fn nl_quants(qs: &[u8], q: &mut [i8; 32]) {
    for (j, &byte) in qs.iter().enumerate() {
        q[j] = IQ4_VALUES[usize::from(byte & 0xF)];
        q[j + 16] = IQ4_VALUES[usize::from(byte >> 4)];
    }
}
