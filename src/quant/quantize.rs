//! f32 rows into stored GGUF blocks: the legacy types (Q8_0, Q4_0, Q4_1, Q5_0,
//! Q5_1) bit for bit as gguf-py's `gguf.quants.quantize` (llama.cpp's
//! reference rounding: the quants from the f32 scale, the scale stored as f16),
//! the K-quants by llama.cpp's reference algorithms (`kquants`), F16 / BF16 by
//! round-to-nearest-even.

use super::{FormatError, WeightFormat, kquants};
use half::f16;

/// The types `quantize` can write.
pub const WRITABLE: [WeightFormat; 13] = [
    WeightFormat::F32,
    WeightFormat::F16,
    WeightFormat::Bf16,
    WeightFormat::Q8_0,
    WeightFormat::Q4_0,
    WeightFormat::Q4_1,
    WeightFormat::Q5_0,
    WeightFormat::Q5_1,
    WeightFormat::Q2_K,
    WeightFormat::Q3_K,
    WeightFormat::Q4_K,
    WeightFormat::Q5_K,
    WeightFormat::Q6_K,
];

/// Quantises an `[n][k]` row-major matrix into `format`'s stored blocks.
pub fn quantize(format: WeightFormat, x: &[f32], n: usize, k: usize) -> Result<Vec<u8>, FormatError> {
    if !WRITABLE.contains(&format) {
        return Err(FormatError::NotWritable { format });
    }
    let block = format.block().0;
    if !k.is_multiple_of(block) {
        return Err(FormatError::BlockAlign { format, block, k });
    }
    if x.len() != n * k {
        return Err(FormatError::Size {
            format,
            n,
            k,
            got: x.len() * 4,
            want: n * k * 4,
        });
    }
    let mut out = Vec::with_capacity(format.stored_bytes(n, k));
    for b in x.chunks_exact(block) {
        quantize_block(format, b, &mut out);
    }
    Ok(out)
}

fn quantize_block(format: WeightFormat, x: &[f32], out: &mut Vec<u8>) {
    use WeightFormat as F;
    match format {
        F::F32 => out.extend(x[0].to_le_bytes()),
        F::F16 => out.extend(f16::from_f32(x[0]).to_le_bytes()),
        F::Bf16 => out.extend(bf16_bits(x[0]).to_le_bytes()),
        F::Q8_0 => {
            let amax = x.iter().fold(0f32, |a, v| if v.abs() > a { v.abs() } else { a });
            let d = amax / 127.0;
            let id = if d == 0.0 { 0.0 } else { 1.0 / d };
            out.extend(f16::from_f32(d).to_le_bytes());
            out.extend(x.iter().map(|v| (v * id).round() as i8 as u8));
        }
        F::Q4_0 | F::Q5_0 => {
            let nmax = if format == F::Q4_0 { 8.0 } else { 16.0 };
            let max = first_abs_max(x);
            let d = max / -nmax;
            let id = if d == 0.0 { 0.0 } else { 1.0 / d };
            let q: Vec<u8> = x
                .iter()
                .map(|v| ((v * id + (nmax + 0.5)).trunc() as u8).min(2 * nmax as u8 - 1))
                .collect();
            out.extend(f16::from_f32(d).to_le_bytes());
            push_quants(&q, format == F::Q5_0, out);
        }
        F::Q4_1 | F::Q5_1 => {
            let levels = if format == F::Q4_1 { 15.0 } else { 31.0 };
            let max = x.iter().fold(f32::NEG_INFINITY, |a, &v| if v > a { v } else { a });
            let min = x.iter().fold(f32::INFINITY, |a, &v| if v < a { v } else { a });
            let d = (max - min) / levels;
            let id = if d == 0.0 { 0.0 } else { 1.0 / d };
            let q: Vec<u8> = x
                .iter()
                .map(|v| (((v - min) * id + 0.5).trunc() as u8).min(levels as u8))
                .collect();
            out.extend(f16::from_f32(d).to_le_bytes());
            out.extend(f16::from_f32(min).to_le_bytes());
            push_quants(&q, format == F::Q5_1, out);
        }
        F::Q2_K => kquants::q2_k(x, out),
        F::Q3_K => kquants::q3_k(x, out),
        F::Q4_K => kquants::q45_k(x, 4, out),
        F::Q5_K => kquants::q45_k(x, 5, out),
        F::Q6_K => kquants::q6_k(x, out),
        other => unreachable!("{other:?} is not writable"),
    }
}

/// `quantize` with the rows split over the CPU's threads.
pub fn quantize_parallel(format: WeightFormat, x: &[f32], n: usize, k: usize) -> Result<Vec<u8>, FormatError> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |t| t.get())
        .min(n.max(1));
    let rows = n.div_ceil(threads).max(1);
    let parts: Vec<Result<Vec<u8>, FormatError>> = std::thread::scope(|s| {
        let handles: Vec<_> = x
            .chunks(rows * k.max(1))
            .map(|c| s.spawn(move || quantize(format, c, c.len() / k.max(1), k)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| unreachable!("quantize never panics")))
            .collect()
    });
    let mut out = Vec::with_capacity(format.stored_bytes(n, k));
    for p in parts {
        out.extend(p?);
    }
    Ok(out)
}

/// The value of largest magnitude, the first one on ties (numpy's argmax).
fn first_abs_max(x: &[f32]) -> f32 {
    let mut best = x[0];
    for &v in &x[1..] {
        if v.abs() > best.abs() {
            best = v;
        }
    }
    best
}

/// 32 quants: Q5's high bits as a little-endian u32 (bit j = bit 4 of quant j),
/// then byte j = quant j's low nibble | quant j + 16's low nibble << 4.
fn push_quants(q: &[u8], five_bit: bool, out: &mut Vec<u8>) {
    if five_bit {
        let qh = q
            .iter()
            .enumerate()
            .fold(0u32, |a, (j, &v)| a | (u32::from(v >> 4) << j));
        out.extend(qh.to_le_bytes());
    }
    out.extend((0..16).map(|j| (q[j] & 0xF) | (q[j + 16] << 4)));
}

/// f32 to bf16 as gguf-py does it: NaN kept quiet, else round to nearest even.
fn bf16_bits(v: f32) -> u16 {
    let mut n = v.to_bits();
    if n & 0x7fff_ffff > 0x7f80_0000 {
        n = (n & 0xffff_0000) | (64 << 16);
    }
    ((u64::from(n) + 0x7fff + u64::from((n >> 16) & 1)) >> 16) as u16
}
