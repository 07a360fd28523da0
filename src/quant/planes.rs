//! The narrow weight layouts: Q5_0 and the K-quants held near their file
//! size on the device, where the wide layouts (`Q8_0`, `Q4_1`, `Q8_16`)
//! spend 9 to 12 bits a weight whatever the file's bits.
//!
//! A row is blocks of 32 elements; a block's quants `q` are stored as bit
//! planes of `x = q & (2^bits - 1)` (two's complement for the signed types),
//! as `u32` words in this order:
//! - a nibble plane (4 words, all but Q3_KP and Q2_KP): byte j holds
//!   element j's low nibble and element j + 16's in its high nibble (Q4_1's);
//! - a 2-bit plane (2 words, Q6_KP's bits 4–5; Q3_KP's and Q2_KP's bits 0–1):
//!   word w holds elements 16w + 4g + b at bits 8b + 2g (g, b in 0..4);
//! - a 1-bit plane (1 word, Q5_0P's, Q5_1P's and Q5_KP's bit 4, Q3_KP's bit 2):
//!   element 4g + b at bit 8b + g (g in 0..8).
//!
//! So that a shift and a mask of a word give four consecutive elements, one a
//! byte, as the wide layouts hold them. The scales: Q5_0P keeps an f32 `d` a
//! block; the K layouts keep their file's super-block: 6 words a 256 elements,
//! the f32 super-scale `d` and `dmin`, then 16 bytes, byte `2j + h` for the
//! half h (16 elements) of block j: Q6_KP and Q3_KP its scale as an `i8`
//! (Q3_K's less 32), Q2_KP its scale in the low nibble and min in the high
//! one, Q4_KP and Q5_KP block j's scale (byte 2j) and min (2j + 1). The
//! factors are computed from them as `blocks::decode` does (`d · sc`,
//! `-(dmin · m)`, in f32), so the kernels and `widen` get the wide layout's
//! factors bit for bit.

use half::f16;

use super::blocks::{self, Sub32};
use super::{Repacked, WeightFormat};

/// f32 words of a K layout's super-block scales (d, dmin, 16 sub-scale bytes).
pub const SUPER_WORDS: usize = 6;

/// Which planes a layout has: (nibbles, 2-bit, 1-bit), its value bits and
/// whether they are signed.
fn planes(layout: WeightFormat) -> (bool, bool, bool, u32, bool) {
    use WeightFormat as F;
    match layout {
        F::Q4_1P => (true, false, false, 4, false),
        F::Q5_0P => (true, false, true, 5, true),
        F::Q5_1P => (true, false, true, 5, false),
        F::Q2_KP => (false, true, false, 2, false),
        F::Q3_KP => (false, true, true, 3, true),
        F::Q4_KP => (true, false, false, 4, false),
        F::Q5_KP => (true, false, true, 5, false),
        F::Q6_KP => (true, true, false, 6, true),
        f => unreachable!("{f:?} is not a narrow layout"),
    }
}

/// The bits of a byte the kernels extract as a signed value when they
/// dequantise a block rebuilt from this layout: a signed narrow type's value
/// bits (its bytes hold them alone; the extraction sign-extends them), else 8.
pub fn extract_bits(layout: WeightFormat) -> u32 {
    if !layout.is_narrow() {
        return 8;
    }
    match planes(layout) {
        (.., bits, true) => bits,
        _ => 8,
    }
}

/// `u32` words of a block's quants.
pub fn data_words(layout: WeightFormat) -> usize {
    let (nib, b2, b1, ..) = planes(layout);
    4 * usize::from(nib) + 2 * usize::from(b2) + usize::from(b1)
}

/// Bytes of a `k`-element row's scales.
pub fn scale_row_bytes(layout: WeightFormat, k: usize) -> usize {
    if per_block_scales(layout) {
        k / 32 * 4
    } else {
        k / 256 * 4 * SUPER_WORDS
    }
}

/// Whether a layout keeps a scale word a block (Q5_0P's f32 d; Q4_1P's
/// and Q5_1P's f16 d and m as stored) rather than super-block scales.
fn per_block_scales(layout: WeightFormat) -> bool {
    matches!(layout, WeightFormat::Q4_1P | WeightFormat::Q5_0P | WeightFormat::Q5_1P)
}

/// A block's share of the scales, in bytes.
pub fn scale_bytes_per_block(layout: WeightFormat) -> usize {
    scale_row_bytes(layout, 256) / 8
}

/// The wide layout whose values and factors a narrow one gives.
pub fn wide(layout: WeightFormat) -> WeightFormat {
    match layout {
        WeightFormat::Q5_0P => WeightFormat::Q8_0,
        WeightFormat::Q4_KP | WeightFormat::Q4_1P => WeightFormat::Q4_1,
        _ => WeightFormat::Q8_16,
    }
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Appends the planes of one block's quants.
fn write_quants(layout: WeightFormat, q: &[i8; 32], data: &mut Vec<u8>) {
    let (nib, b2, b1, bits, _) = planes(layout);
    let x: [u32; 32] = std::array::from_fn(|j| u32::from(q[j] as u8) & ((1 << bits) - 1));
    // Bits above the nibble (or all of them) go to the 2- and 1-bit planes.
    let (low, rest_shift) = if nib { (4, 4) } else { (0, 0) };
    let mut words = Vec::with_capacity(7);
    if nib {
        for w in 0..4 {
            let byte = |b: usize| (x[4 * w + b] & 15) | ((x[4 * w + b + 16] & 15) << 4);
            words.push((0..4).fold(0u32, |acc, b| acc | (byte(b) << (8 * b))));
        }
    }
    if b2 {
        for w in 0..2 {
            let mut word = 0u32;
            for g in 0..4 {
                for b in 0..4 {
                    word |= ((x[16 * w + 4 * g + b] >> rest_shift) & 3) << (8 * b + 2 * g);
                }
            }
            words.push(word);
        }
    }
    if b1 {
        let shift = if nib { low } else { 2 };
        let mut word = 0u32;
        for g in 0..8 {
            for b in 0..4 {
                word |= ((x[4 * g + b] >> shift) & 1) << (8 * b + g);
            }
        }
        words.push(word);
    }
    words.iter().for_each(|w| data.extend(w.to_le_bytes()));
}

/// One block's quants back from its planes (`words`: its data words).
fn read_quants(layout: WeightFormat, words: &[u32]) -> [i8; 32] {
    let (nib, b2, b1, bits, signed) = planes(layout);
    let mut x = [0u32; 32];
    let mut at = 0;
    if nib {
        for (j, v) in x.iter_mut().enumerate() {
            let byte = (words[(j % 16) / 4] >> (8 * (j % 4))) & 0xFF;
            *v = if j < 16 { byte & 15 } else { byte >> 4 };
        }
        at = 4;
    }
    let rest = if nib { 4 } else { 0 };
    if b2 {
        for (e, v) in x.iter_mut().enumerate() {
            let (w, g, b) = (e / 16, (e % 16) / 4, e % 4);
            *v |= ((words[at + w] >> (8 * b + 2 * g)) & 3) << rest;
        }
        at += 2;
    }
    if b1 {
        let shift = if nib { 4 } else { 2 };
        for (e, v) in x.iter_mut().enumerate() {
            *v |= ((words[at] >> (8 * (e % 4) + e / 4)) & 1) << shift;
        }
    }
    x.map(|v| {
        if signed && v >> (bits - 1) == 1 {
            (v as i32 - (1 << bits)) as i8
        } else {
            v as i8
        }
    })
}

/// The stored blocks of `format` (Q5_0 or a K-quant) in its narrow layout.
pub fn repack(format: WeightFormat, bytes: &[u8], data: &mut Vec<u8>, scales: &mut Vec<u8>) {
    use WeightFormat as F;
    let layout = format.narrow().expect("a type with a narrow layout");
    let mut subs = Vec::new();
    for blk in bytes.chunks_exact(format.block().1) {
        if format == F::Q4_1 {
            // Its nibbles are the nibble plane; d and m stay f16.
            data.extend_from_slice(&blk[4..20]);
            scales.extend_from_slice(&blk[0..4]);
            continue;
        }
        subs.clear();
        blocks::decode(format, blk, &mut subs);
        subs.iter().for_each(|s| write_quants(layout, &s.q, data));
        let (d, dmin, sub): (f32, f32, [u8; 16]) = match format {
            F::Q5_0 => {
                scales.extend(subs[0].d[0].to_le_bytes());
                continue;
            }
            F::Q5_1 => {
                scales.extend_from_slice(&blk[0..4]);
                continue;
            }
            F::Q6_K => (f16_at(blk, 208), 0.0, std::array::from_fn(|i| blk[192 + i])),
            F::Q3_K => {
                let sc = blocks::q3k_scales(&blk[96..108]);
                (f16_at(blk, 108), 0.0, sc.map(|s| (i32::from(s) - 32) as i8 as u8))
            }
            F::Q2_K => (f16_at(blk, 80), f16_at(blk, 82), std::array::from_fn(|i| blk[i])),
            _ => {
                // Q4_K / Q5_K: block j's 6-bit scale and min.
                let sub = std::array::from_fn(|i| {
                    let (sc, m) = blocks::scale_min_k4(i / 2, &blk[4..16]);
                    if i % 2 == 0 { sc } else { m }
                });
                (f16_at(blk, 0), f16_at(blk, 2), sub)
            }
        };
        scales.extend(d.to_le_bytes());
        scales.extend(dmin.to_le_bytes());
        scales.extend_from_slice(&sub);
    }
}

/// Block `j` (0..8) of a super-block's factors, from its scales
/// (`sup`: the 6 words as bytes), as the kernels compute them.
fn factors(layout: WeightFormat, sup: &[u8], j: usize) -> ([f32; 2], [f32; 2]) {
    let word = |i: usize| f32::from_le_bytes([sup[4 * i], sup[4 * i + 1], sup[4 * i + 2], sup[4 * i + 3]]);
    let (d, dmin, sub) = (word(0), word(1), &sup[8..24]);
    match layout {
        WeightFormat::Q6_KP | WeightFormat::Q3_KP => ([0, 1].map(|h| d * f32::from(sub[2 * j + h] as i8)), [0.0; 2]),
        WeightFormat::Q2_KP => (
            [0, 1].map(|h| d * f32::from(sub[2 * j + h] & 15)),
            [0, 1].map(|h| -(dmin * f32::from(sub[2 * j + h] >> 4))),
        ),
        _ => {
            let (sc, m) = (d * f32::from(sub[2 * j]), -(dmin * f32::from(sub[2 * j + 1])));
            ([sc; 2], [m; 2])
        }
    }
}

/// The blocks of one narrow row as `Sub32`s (the wide layout's values and factors).
fn row_subs(layout: WeightFormat, k: usize, data: &[u8], scales: &[u8]) -> Vec<Sub32> {
    let dw = data_words(layout);
    let words: Vec<u32> = data
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    (0..k / 32)
        .map(|b| {
            let q = read_quants(layout, &words[b * dw..(b + 1) * dw]);
            let s = &scales[(4 * b).min(scales.len())..];
            let (d, m) = if layout == WeightFormat::Q5_0P {
                ([f32::from_le_bytes([s[0], s[1], s[2], s[3]]); 2], [0.0; 2])
            } else if per_block_scales(layout) {
                ([f16_at(s, 0); 2], [f16_at(s, 2); 2])
            } else {
                let sb = 4 * SUPER_WORDS;
                factors(layout, &scales[b / 8 * sb..(b / 8 + 1) * sb], b % 8)
            };
            Sub32 { q, d, m }
        })
        .collect()
}

/// `r` in the wide layout its narrow layout stands for (`r` itself when it
/// is not narrow): the same values and factors, for backends that read the
/// wide layouts only.
pub fn widen(r: &Repacked) -> Repacked {
    if !r.format.is_narrow() {
        return r.clone();
    }
    let wide = wide(r.format);
    let ((dr, sr), mut data, mut scales) = (r.row_bytes(), Vec::new(), Vec::new());
    for row in 0..r.n {
        let subs = row_subs(
            r.format,
            r.k,
            &r.data[row * dr..(row + 1) * dr],
            &r.scales[row * sr..(row + 1) * sr],
        );
        super::write_subs(wide, &subs, &mut data, &mut scales);
    }
    Repacked {
        format: wide,
        data,
        scales,
        ..r.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(format: WeightFormat, n: usize, k: usize, seed: u32) -> Vec<u8> {
        let mut s = seed;
        let mut b: Vec<u8> = (0..format.stored_bytes(n, k))
            .map(|_| {
                s = s.wrapping_mul(1_103_515_245).wrapping_add(12345);
                (s >> 16) as u8
            })
            .collect();
        // Finite f16 scales: clear each block's f16 exponent top bits.
        let (_, bb) = format.block();
        let at: &[usize] = match format {
            WeightFormat::Q5_0 => &[0],
            WeightFormat::Q4_1 | WeightFormat::Q5_1 => &[0, 2],
            WeightFormat::Q6_K => &[208],
            WeightFormat::Q3_K => &[108],
            WeightFormat::Q2_K => &[80, 82],
            _ => &[0, 2],
        };
        for blk in b.chunks_exact_mut(bb) {
            for &i in at {
                blk[i + 1] &= 0x3B;
            }
        }
        b
    }

    #[test]
    fn quant_planes_round_trip_every_value() {
        for layout in WeightFormat::NARROW {
            let (.., bits, signed) = planes(layout);
            let lo = if signed { -(1i32 << (bits - 1)) } else { 0 };
            let q: [i8; 32] = std::array::from_fn(|j| (lo + (j as i32 * 7) % (1 << bits)) as i8);
            let mut data = Vec::new();
            write_quants(layout, &q, &mut data);
            assert_eq!(data.len(), 4 * data_words(layout));
            let words: Vec<u32> = data
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            assert_eq!(read_quants(layout, &words), q, "{layout:?}");
        }
    }

    #[test]
    fn widened_narrow_layouts_are_the_wide_repack_byte_for_byte() {
        for format in WeightFormat::STORED.into_iter().filter(|f| f.narrow().is_some()) {
            let (n, k) = (3, 512);
            let b = bytes(format, n, k, 7);
            let narrow = super::super::repack(format, &b, n, k).unwrap();
            assert_eq!(narrow.format, format.narrow().unwrap());
            let want = super::super::repack_wide(format, &b, n, k).unwrap();
            let w = widen(&narrow);
            assert_eq!(w.format, format.layout(), "{format:?}");
            assert_eq!(w.data, want.data, "{format:?} data");
            assert_eq!(w.scales, want.scales, "{format:?} scales");
        }
    }
}
