//! llama.cpp's reference K-quant quantisers (`quantize_row_q{2..6}_K_ref` in
//! ggml-quants.c, the path `llama-quantize` takes without an importance
//! matrix), written in Rust from their description: per sub-block a scale
//! (and min) fitted by a weighted least-squares search, the sub-block factors
//! quantised to 4/6/8 bits against a super-block f16 scale, then every value
//! re-quantised against the factors as stored. Float operations follow the C
//! order one for one (Rust never contracts to fma); `nearest_int` is ggml's
//! round-half-even trick.

// Index loops over parallel arrays mirror the reference one for one.
#![allow(clippy::needless_range_loop)]

use super::blocks::scale_min_k4;
use half::f16;

const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: rounds half to even by adding 1.5·2²³.
pub fn nearest_int(f: f32) -> i32 {
    let v = f + 12_582_912.0;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

fn fp16(v: f32) -> [u8; 2] {
    f16::from_f32(v).to_le_bytes()
}

fn rt16(v: f32) -> f32 {
    f16::from_f32(v).to_f32()
}

/// The signed value of largest magnitude (the first one on ties), and its magnitude.
fn signed_max(x: &[f32]) -> (f32, f32) {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    (max, amax)
}

/// Symmetric quants in [-nmax, nmax) weighted by x² (rmse_type 1), trying 18
/// scales around the max-based one; `l` gets the quants plus nmax.
fn make_qx_quants(nmax: i32, x: &[f32], l: &mut [i8]) -> f32 {
    let (max, amax) = signed_max(x);
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let q = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
        for &v in x {
            let (lv, w) = (q(iscale, v) as f32, v * v);
            sumlx += w * v * lv;
            suml2 += w * lv * lv;
        }
        (sumlx, suml2)
    };
    let mut iscale = -(nmax as f32) / max;
    for (o, &v) in l.iter_mut().zip(x) {
        *o = (q(iscale, v) + nmax) as i8;
    }
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in (-9..=9).filter(|&i| i != 0) {
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (o, &v) in l.iter_mut().zip(x) {
                *o = (q(iscale, v) + nmax) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Q3_K's sub-block fit: symmetric quants, then up to five rounds of moving
/// single quants while the x²-weighted fit improves; `l` gets quants plus nmax.
fn make_q3_quants(nmax: i32, x: &[f32], l: &mut [i8]) -> f32 {
    let (max, amax) = signed_max(x);
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    let mut li: Vec<i32> = Vec::with_capacity(x.len());
    for &v in x {
        let q = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        li.push(q);
        let w = v * v;
        sumlx += w * v * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    for _ in 0..5 {
        let mut changed = 0;
        for (i, &v) in x.iter().enumerate() {
            let w = v * v;
            let mut slx = sumlx - w * v * li[i] as f32;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * li[i] as f32 * li[i] as f32;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != li[i] {
                    slx += w * v * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        li[i] = new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        changed += 1;
                    }
                }
            }
        }
        if changed == 0 {
            break;
        }
    }
    for (o, q) in l.iter_mut().zip(li) {
        *o = (q + nmax) as i8;
    }
    if suml2 > 0.0 { sumlx / suml2 } else { 0.0 }
}

/// Asymmetric quants in [0, nmax] with a min ≤ 0: least squares over nstep + 1
/// candidate scales; returns (scale, -min) and leaves the quants in `l`.
#[allow(clippy::too_many_arguments)]
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        min = if x[i] < min { x[i] } else { min };
        max = if x[i] > max { x[i] } else { max };
        sum_w += weights[i];
        sum_x += weights[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l.fill(0);
        return (0.0, -min);
    }
    let err = |scale: f32, min: f32, q: u8, v: f32| {
        let d = scale * q as f32 + min - v;
        if use_mad { d.abs() } else { d * d }
    };
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        l[i] = nearest_int(iscale * (x[i] - min)).clamp(0, nmax) as u8;
        best_error += weights[i] * err(scale, min, l[i], x[i]);
    }
    let mut laux = vec![0u8; n];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = q as u8;
            let (w, q) = (weights[i], q as f32);
            sum_l += w * q;
            sum_l2 += w * q * q;
            sum_xl += w * q * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur = 0.0f32;
            for i in 0..n {
                cur += weights[i] * err(this_scale, this_min, laux[i], x[i]);
            }
            if cur < best_error {
                l.copy_from_slice(&laux);
                best_error = cur;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Packs 2-bit quants `l[256]` as Q2_K / Q3_K store them: byte 32·h + j holds
/// elements 128h + j, +32, +64, +96 at shifts 0, 2, 4, 6.
fn pack_2bit(l: &[u8], qs: &mut [u8]) {
    for h in 0..2 {
        for j in 0..32 {
            let e = 128 * h + j;
            qs[32 * h + j] = l[e] | (l[e + 32] << 2) | (l[e + 64] << 4) | (l[e + 96] << 6);
        }
    }
}

/// One Q2_K super-block: scales[16] qs[64] d dmin.
pub fn q2_k(x: &[f32], out: &mut Vec<u8>) {
    let mut b = [0u8; 84];
    let mut l = [0u8; 256];
    let (mut scales, mut mins) = ([0f32; 16], [0f32; 16]);
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..16 {
        let xs = &x[16 * j..16 * j + 16];
        let w: Vec<f32> = xs.iter().map(|v| v.abs()).collect();
        (scales[j], mins[j]) = make_qkx2_quants(3, xs, &w, &mut l[16 * j..16 * j + 16], -0.5, 0.1, 15, true);
        max_scale = max_scale.max_c(scales[j]);
        max_min = max_min.max_c(mins[j]);
    }
    let (d, dmin) = if max_scale > 0.0 {
        let iscale = 15.0 / max_scale;
        for j in 0..16 {
            b[j] = nearest_int(iscale * scales[j]) as u8;
        }
        (max_scale / 15.0, 0.0)
    } else {
        (0.0, 0.0)
    };
    let dmin = if max_min > 0.0 {
        let iscale = 15.0 / max_min;
        for j in 0..16 {
            b[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
        }
        max_min / 15.0
    } else {
        dmin
    };
    b[80..82].copy_from_slice(&fp16(d));
    b[82..84].copy_from_slice(&fp16(dmin));
    let (d, dmin) = (rt16(d), rt16(dmin));
    for j in 0..16 {
        let dl = d * (b[j] & 0xF) as f32;
        if dl == 0.0 {
            continue;
        }
        let ml = dmin * (b[j] >> 4) as f32;
        for i in 16 * j..16 * j + 16 {
            l[i] = nearest_int((x[i] + ml) / dl).clamp(0, 3) as u8;
        }
    }
    pack_2bit(&l, &mut b[16..80]);
    out.extend_from_slice(&b);
}

/// One Q3_K super-block: hmask[32] qs[64] scales[12] d.
pub fn q3_k(x: &[f32], out: &mut Vec<u8>) {
    let mut b = [0u8; 110];
    let mut l = [0i8; 256];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut amax) = (0f32, 0f32);
    for j in 0..16 {
        scales[j] = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16]);
        if scales[j].abs() > amax {
            amax = scales[j].abs();
            max_scale = scales[j];
        }
    }
    let sc = &mut b[96..108];
    let d = if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        for j in 0..16 {
            let q = (nearest_int(iscale * scales[j]) as i8).clamp(-32, 31) + 32;
            if j < 8 {
                sc[j] = (q & 0xF) as u8;
            } else {
                sc[j - 8] |= ((q & 0xF) << 4) as u8;
            }
            sc[j % 4 + 8] |= ((q >> 4) as u8) << (2 * (j / 4));
        }
        1.0 / iscale
    } else {
        0.0
    };
    b[108..110].copy_from_slice(&fp16(d));
    let d = rt16(d);
    let unpacked = super::blocks::q3k_scales(&b[96..108]);
    for j in 0..16 {
        let dl = d * (i32::from(unpacked[j]) - 32) as f32;
        if dl == 0.0 {
            continue;
        }
        for i in 16 * j..16 * j + 16 {
            l[i] = (nearest_int(x[i] / dl).clamp(-4, 3) + 4) as i8;
        }
    }
    let mut lu = [0u8; 256];
    for (e, &q) in l.iter().enumerate() {
        let mut q = q as u8;
        if q > 3 {
            b[e % 32] |= 1 << (e / 32);
            q -= 4;
        }
        lu[e] = q;
    }
    pack_2bit(&lu, &mut b[32..96]);
    out.extend_from_slice(&b);
}

/// Q4_K (`bits` 4) or Q5_K (`bits` 5) super-block: d dmin scales[12] [qh[32]] qs[128].
pub fn q45_k(x: &[f32], bits: u32, out: &mut Vec<u8>) {
    let nmax = (1 << bits) - 1;
    let q5 = bits == 5;
    let mut b = vec![0u8; if q5 { 176 } else { 144 }];
    let mut l = [0u8; 256];
    let (mut scales, mut mins) = ([0f32; 8], [0f32; 8]);
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    let (rmin, nstep) = if q5 { (-0.5, 15) } else { (-1.0, 20) };
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        xs.iter().for_each(|v| sum_x2 += v * v);
        let av_x = (sum_x2 / 32.0).sqrt();
        let w: Vec<f32> = xs.iter().map(|v| av_x + v.abs()).collect();
        (scales[j], mins[j]) = make_qkx2_quants(nmax, xs, &w, &mut l[32 * j..32 * j + 32], rmin, 0.1, nstep, false);
        max_scale = max_scale.max_c(scales[j]);
        max_min = max_min.max_c(mins[j]);
    }
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let sc = &mut b[4..16];
    for j in 0..8 {
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            sc[j] = ls;
            sc[j + 4] = lm;
        } else {
            sc[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            sc[j - 4] |= (ls >> 4) << 6;
            sc[j] |= (lm >> 4) << 6;
        }
    }
    b[0..2].copy_from_slice(&fp16(max_scale / 63.0));
    b[2..4].copy_from_slice(&fp16(max_min / 63.0));
    let (d, dmin) = (rt16(max_scale / 63.0), rt16(max_min / 63.0));
    for j in 0..8 {
        let (s, m) = scale_min_k4(j, &b[4..16]);
        let dl = d * s as f32;
        if dl == 0.0 {
            continue;
        }
        let dm = dmin * m as f32;
        for i in 32 * j..32 * j + 32 {
            l[i] = nearest_int((x[i] + dm) / dl).clamp(0, nmax) as u8;
        }
    }
    let (qh_at, qs_at) = if q5 { (16, 48) } else { (0, 16) };
    for c in 0..4 {
        for j in 0..32 {
            let (mut l1, mut l2) = (l[64 * c + j], l[64 * c + j + 32]);
            if l1 > 15 {
                l1 -= 16;
                b[qh_at + j] |= 1 << (2 * c);
            }
            if l2 > 15 {
                l2 -= 16;
                b[qh_at + j] |= 2 << (2 * c);
            }
            b[qs_at + 32 * c + j] = l1 | (l2 << 4);
        }
    }
    out.extend_from_slice(&b);
}

/// One Q6_K super-block: ql[128] qh[64] scales[16] d.
pub fn q6_k(x: &[f32], out: &mut Vec<u8>) {
    let mut b = [0u8; 210];
    let mut l = [0i8; 256];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut max_abs) = (0f32, 0f32);
    for ib in 0..16 {
        scales[ib] = make_qx_quants(32, &x[16 * ib..16 * ib + 16], &mut l[16 * ib..16 * ib + 16]);
        if scales[ib].abs() > max_abs {
            max_abs = scales[ib].abs();
            max_scale = scales[ib];
        }
    }
    if max_abs < GROUP_MAX_EPS {
        out.extend_from_slice(&b);
        return;
    }
    let iscale = -128.0 / max_scale;
    b[208..210].copy_from_slice(&fp16(1.0 / iscale));
    for ib in 0..16 {
        b[192 + ib] = nearest_int(iscale * scales[ib]).min(127) as i8 as u8;
    }
    let d = rt16(1.0 / iscale);
    for j in 0..16 {
        let dl = d * (b[192 + j] as i8) as f32;
        if dl == 0.0 {
            continue;
        }
        for i in 16 * j..16 * j + 16 {
            l[i] = (nearest_int(x[i] / dl).clamp(-32, 31) + 32) as i8;
        }
    }
    for h in 0..2 {
        for j in 0..32 {
            let q = |o: usize| l[128 * h + j + o] as u8;
            b[64 * h + j] = (q(0) & 0xF) | ((q(64) & 0xF) << 4);
            b[64 * h + j + 32] = (q(32) & 0xF) | ((q(96) & 0xF) << 4);
            b[128 + 32 * h + j] = (q(0) >> 4) | ((q(32) >> 4) << 2) | ((q(64) >> 4) << 4) | ((q(96) >> 4) << 6);
        }
    }
    out.extend_from_slice(&b);
}

/// C's `if (v > m) m = v` (NaN never replaces).
trait MaxC {
    fn max_c(self, v: f32) -> f32;
}

impl MaxC for f32 {
    fn max_c(self, v: f32) -> f32 {
        if v > self { v } else { self }
    }
}
