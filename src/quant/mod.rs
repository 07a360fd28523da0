//! Weight formats as stored in GGUF / safetensors, their CPU dequantisers
//! (written from the GGUF block definitions), and the repacking into the
//! GPU layout the `gemm` and `embed` kernels read.
//!
//! GPU layout of a matrix `W[N][K]`:
//! - f32: rows padded to `Kp = roundup(K, 8)` floats.
//! - f16 / bf16: rows padded to `Kp`, two halves per `u32` (element `2i` in the low half).
//! - Q8_0 / Q4_0 / Q4_1 (`K % 32 == 0`): `quants[N][K/32]` of 8 / 4 / 4 `u32`
//!   (the block's bytes as stored) and `scales[N][K/32]` of f32 `d`
//!   (Q4_1: `vec2(d, m)`).
//! - Q8_16 (a layout only, never in a file): `quants[N][K/32]` of 8 `u32`
//!   (32 `i8`) and `scales[N][K/32]` of `vec4(d0, m0, d1, m1)`: element j of a
//!   block is `d[j / 16] · q_j + m[j / 16]`.
//!
//! The other GGUF types are repacked into one of these (`WeightFormat::layout`)
//! with exactly llama.cpp's factors (see `blocks`): IQ4_NL, IQ4_XS and Q5_0 as
//! Q8_0 (their quants widened to `i8`), Q4_K as Q4_1, and Q5_1, Q5_K, Q6_K,
//! Q3_K, Q2_K as Q8_16. The kernels thus read six quantised layouts while files
//! may hold any of fourteen types; the cost is memory: Q8_16 takes 12 bits a
//! weight on the GPU whatever the file's bits.
//!
//! The narrow layouts (`planes`, layouts only: `Q4_1P`, `Q5_0P`, `Q5_1P`,
//! `Q2_KP` … `Q6_KP`) keep those types near their file size: bit planes of the quants
//! and the file's own super-block scales, from which the kernels rebuild
//! exactly the wide layout's values and f32 factors (same bits out).
//! `repack` writes them; a backend that does not read them widens them at
//! upload (`planes::widen`).

pub mod blocks;
pub mod kquants;
pub mod mix;
pub mod planes;
pub mod quantize;

use half::{bf16, f16};

/// Storage format of a weight matrix: a GGUF / safetensors type, or (Q8_16)
/// a GPU layout that other types are repacked into.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    F32,
    F16,
    Bf16,
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    IQ4_NL,
    IQ4_XS,
    Q8_16,
    Q4_1P,
    Q5_0P,
    Q5_1P,
    Q2_KP,
    Q3_KP,
    Q4_KP,
    Q5_KP,
    Q6_KP,
}

/// A format the engine cannot read.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("weight has {got} bytes, but {format:?} [{n} x {k}] needs {want}")]
    Size {
        format: WeightFormat,
        n: usize,
        k: usize,
        got: usize,
        want: usize,
    },
    #[error("{format:?} needs the row length to be a multiple of {block}, got {k}")]
    BlockAlign {
        format: WeightFormat,
        block: usize,
        k: usize,
    },
    #[error(
        "wllm cannot write {format:?}; it writes F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K and Q6_K"
    )]
    NotWritable { format: WeightFormat },
    #[error("cannot fuse {what}: the matrices differ in format or row length")]
    Mismatch { what: String },
}

impl WeightFormat {
    /// The layouts the kernels read (every format's `layout()` is one of them).
    pub const ALL: [WeightFormat; 7] = [
        Self::F32,
        Self::F16,
        Self::Bf16,
        Self::Q8_0,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q8_16,
    ];

    /// The narrow layouts (`planes`): read from storage buffers, by the wgpu backend.
    pub const NARROW: [WeightFormat; 8] = [
        Self::Q4_1P,
        Self::Q5_0P,
        Self::Q5_1P,
        Self::Q2_KP,
        Self::Q3_KP,
        Self::Q4_KP,
        Self::Q5_KP,
        Self::Q6_KP,
    ];

    /// Every type a model file may hold.
    pub const STORED: [WeightFormat; 15] = [
        Self::F32,
        Self::F16,
        Self::Bf16,
        Self::Q8_0,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q2_K,
        Self::Q3_K,
        Self::Q4_K,
        Self::Q5_K,
        Self::Q6_K,
        Self::IQ4_NL,
        Self::IQ4_XS,
    ];

    /// The GGUF `ggml_type` id of each stored type.
    const GGML_IDS: [(u32, WeightFormat); 15] = [
        (0, Self::F32),
        (1, Self::F16),
        (2, Self::Q4_0),
        (3, Self::Q4_1),
        (6, Self::Q5_0),
        (7, Self::Q5_1),
        (8, Self::Q8_0),
        (10, Self::Q2_K),
        (11, Self::Q3_K),
        (12, Self::Q4_K),
        (13, Self::Q5_K),
        (14, Self::Q6_K),
        (20, Self::IQ4_NL),
        (23, Self::IQ4_XS),
        (30, Self::Bf16),
    ];

    /// The format of GGUF `ggml_type` id `t`.
    pub fn from_ggml_type(t: u32) -> Option<Self> {
        Self::GGML_IDS.iter().find(|(id, _)| *id == t).map(|&(_, f)| f)
    }

    /// The GGUF `ggml_type` id (None for the Q8_16 layout).
    pub fn ggml_type(self) -> Option<u32> {
        Self::GGML_IDS.iter().find(|(_, f)| *f == self).map(|&(id, _)| id)
    }

    /// The name llama.cpp gives the type (`Q4_K`, `BF16`, …).
    pub fn name(self) -> String {
        match self {
            Self::Bf16 => "BF16".into(),
            f => format!("{f:?}"),
        }
    }

    /// The format of llama.cpp type name `s` (case-insensitive).
    pub fn from_name(s: &str) -> Option<Self> {
        Self::STORED.into_iter().find(|f| f.name().eq_ignore_ascii_case(s))
    }

    /// Elements per block and bytes per block as stored.
    pub fn block(self) -> (usize, usize) {
        match self {
            Self::F32 => (1, 4),
            Self::F16 | Self::Bf16 => (1, 2),
            Self::Q8_0 => (32, 34),
            Self::Q4_0 | Self::IQ4_NL => (32, 18),
            Self::Q4_1 => (32, 20),
            Self::Q5_0 => (32, 22),
            Self::Q5_1 => (32, 24),
            Self::Q2_K => (256, 84),
            Self::Q3_K => (256, 110),
            Self::Q4_K => (256, 144),
            Self::Q5_K => (256, 176),
            Self::Q6_K => (256, 210),
            Self::IQ4_XS => (256, 136),
            Self::Q8_16 => (32, 48),
            // Narrow layouts: a block's data words, and its share of the scales.
            f => (32, 4 * planes::data_words(f) + planes::scale_bytes_per_block(f)),
        }
    }

    pub fn is_quantized(self) -> bool {
        self.block().0 > 1
    }

    /// f32 factors per 32-element block in a layout's `scales` (0 for floats).
    pub fn scale_floats(self) -> usize {
        match self.layout() {
            Self::F32 | Self::F16 | Self::Bf16 => 0,
            f if f.is_narrow() => 0,
            Self::Q4_1 => 2,
            Self::Q8_16 => 4,
            _ => 1,
        }
    }

    /// The wide layout whose values a format's layout gives: a narrow
    /// layout's (`planes::wide`), else its `layout()`.
    pub fn wide_layout(self) -> WeightFormat {
        if self.is_narrow() {
            planes::wide(self)
        } else {
            self.layout()
        }
    }

    /// One of the narrow layouts (`NARROW`).
    pub fn is_narrow(self) -> bool {
        Self::NARROW.contains(&self)
    }

    /// The narrow layout `repack` writes this stored type in, if it has one.
    pub fn narrow(self) -> Option<WeightFormat> {
        Some(match self {
            Self::Q4_1 => Self::Q4_1P,
            Self::Q5_0 => Self::Q5_0P,
            Self::Q5_1 => Self::Q5_1P,
            Self::Q2_K => Self::Q2_KP,
            Self::Q3_K => Self::Q3_KP,
            Self::Q4_K => Self::Q4_KP,
            Self::Q5_K => Self::Q5_KP,
            Self::Q6_K => Self::Q6_KP,
            _ => return None,
        })
    }

    /// Bytes of one `k`-element row in this layout: its data and its scales.
    pub fn row_bytes(self, k: usize) -> (usize, usize) {
        let layout = self.layout();
        match layout {
            Self::F32 | Self::F16 | Self::Bf16 => (k.div_ceil(8) * 8 * self.block().1, 0),
            Self::Q4_0 | Self::Q4_1 => (k / 32 * 16, k / 32 * 4 * layout.scale_floats()),
            f if f.is_narrow() => (k / 32 * 4 * planes::data_words(f), planes::scale_row_bytes(f, k)),
            _ => (k / 32 * 32, k / 32 * 4 * layout.scale_floats()),
        }
    }

    /// The wide GPU layout this format is repacked into (see the module doc);
    /// a layout is its own.
    pub fn layout(self) -> WeightFormat {
        match self {
            Self::Q5_0 | Self::IQ4_NL | Self::IQ4_XS => Self::Q8_0,
            Self::Q4_K => Self::Q4_1,
            Self::Q5_1 | Self::Q5_K | Self::Q6_K | Self::Q3_K | Self::Q2_K => Self::Q8_16,
            f => f,
        }
    }

    /// Bytes of an `[n][k]` matrix as stored.
    pub fn stored_bytes(self, n: usize, k: usize) -> usize {
        let (be, bb) = self.block();
        n * k.div_ceil(be) * bb
    }

    fn check(self, bytes: &[u8], n: usize, k: usize) -> Result<(), FormatError> {
        let block = self.block().0;
        if !k.is_multiple_of(block) {
            return Err(FormatError::BlockAlign { format: self, block, k });
        }
        let want = self.stored_bytes(n, k);
        if bytes.len() != want {
            return Err(FormatError::Size {
                format: self,
                n,
                k,
                got: bytes.len(),
                want,
            });
        }
        Ok(())
    }
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Dequantises an `[n][k]` matrix to f32, row-major.
pub fn dequantize(format: WeightFormat, bytes: &[u8], n: usize, k: usize) -> Result<Vec<f32>, FormatError> {
    format.check(bytes, n, k)?;
    let mut out = Vec::with_capacity(n * k);
    match format {
        WeightFormat::F32 => out.extend(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        ),
        WeightFormat::F16 => out.extend(bytes.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())),
        WeightFormat::Bf16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()),
        ),
        WeightFormat::Q8_0 => {
            for blk in bytes.chunks_exact(34) {
                let d = f16_at(blk, 0);
                out.extend(blk[2..].iter().map(|&q| d * f32::from(q as i8)));
            }
        }
        WeightFormat::Q4_0 | WeightFormat::Q4_1 => {
            let q4_1 = format == WeightFormat::Q4_1;
            let hdr = if q4_1 { 4 } else { 2 };
            for blk in bytes.chunks(if q4_1 { 20 } else { 18 }) {
                let d = f16_at(blk, 0);
                let m = if q4_1 { f16_at(blk, 2) } else { 0.0 };
                let qs = &blk[hdr..hdr + 16];
                let val = |q: u8| {
                    if q4_1 {
                        d * f32::from(q) + m
                    } else {
                        d * (f32::from(q) - 8.0)
                    }
                };
                // Element j is the low nibble of byte j, element j + 16 its high nibble.
                out.extend(qs.iter().map(|&b| val(b & 0xF)));
                out.extend(qs.iter().map(|&b| val(b >> 4)));
            }
        }
        f => {
            let mut subs = Vec::new();
            for blk in bytes.chunks_exact(f.block().1) {
                subs.clear();
                blocks::decode(f, blk, &mut subs);
                subs.iter().for_each(|s| out.extend(s.values()));
            }
        }
    }
    Ok(out)
}

/// The types decoded by `blocks`, written in their layout: their `Sub32`s'
/// quants as bytes (Q4_1: nibbles, element j low and j + 16 high in byte j)
/// and their factors as f32 (Q8_0: d; Q4_1: d, m; Q8_16: d0, m0, d1, m1).
fn repack_subs(format: WeightFormat, bytes: &[u8], data: &mut Vec<u8>, scales: &mut Vec<u8>) {
    let mut subs = Vec::new();
    for blk in bytes.chunks_exact(format.block().1) {
        subs.clear();
        blocks::decode(format, blk, &mut subs);
        write_subs(format.layout(), &subs, data, scales);
    }
}

/// `subs` written in wide layout `layout` (Q8_0, Q4_1 or Q8_16).
fn write_subs(layout: WeightFormat, subs: &[blocks::Sub32], data: &mut Vec<u8>, scales: &mut Vec<u8>) {
    for s in subs {
        let factors: &[f32] = match layout {
            WeightFormat::Q8_0 => &s.d[..1],
            WeightFormat::Q4_1 => &[s.d[0], s.m[0]],
            _ => &[s.d[0], s.m[0], s.d[1], s.m[1]],
        };
        factors.iter().for_each(|v| scales.extend(v.to_le_bytes()));
        if layout == WeightFormat::Q4_1 {
            data.extend((0..16).map(|j| (s.q[j] as u8 & 0xF) | ((s.q[j + 16] as u8) << 4)));
        } else {
            data.extend(s.q.iter().map(|&q| q as u8));
        }
    }
}

/// A matrix in the GPU layout (see the module doc).
#[derive(Clone, Debug)]
pub struct Repacked {
    pub format: WeightFormat,
    pub n: usize,
    pub k: usize,
    /// Row stride of `data` in elements of the padded row (f32 / f16 / bf16).
    pub kp: usize,
    pub data: Vec<u8>,
    /// Quantised formats only: f32 `d` (Q4_1: `d, m`; Q8_16: `d0, m0, d1, m1`) per block.
    pub scales: Vec<u8>,
}

/// Rearranges stored bytes into the GPU layout.
pub fn repack(format: WeightFormat, bytes: &[u8], n: usize, k: usize) -> Result<Repacked, FormatError> {
    repack_as(format, bytes, n, k, true)
}

/// Rearranges stored bytes into the wide GPU layout (`WeightFormat::layout`)
/// even where the type has a narrow one (what `planes::widen` gives).
pub fn repack_wide(format: WeightFormat, bytes: &[u8], n: usize, k: usize) -> Result<Repacked, FormatError> {
    repack_as(format, bytes, n, k, false)
}

fn repack_as(format: WeightFormat, bytes: &[u8], n: usize, k: usize, narrow: bool) -> Result<Repacked, FormatError> {
    format.check(bytes, n, k)?;
    let narrow = if narrow { format.narrow() } else { None };
    let kp = k.div_ceil(8) * 8;
    let mut data = Vec::new();
    let mut scales = Vec::new();
    match format {
        WeightFormat::F32 | WeightFormat::F16 | WeightFormat::Bf16 => {
            let es = format.block().1;
            data.reserve(n * kp * es);
            for row in bytes.chunks_exact(k * es) {
                data.extend_from_slice(row);
                data.resize(data.len() + (kp - k) * es, 0);
            }
        }
        f if narrow.is_some() => planes::repack(f, bytes, &mut data, &mut scales),
        WeightFormat::Q8_0 | WeightFormat::Q4_0 | WeightFormat::Q4_1 => {
            let (_, bb) = format.block();
            let hdr = if format == WeightFormat::Q4_1 { 4 } else { 2 };
            for blk in bytes.chunks_exact(bb) {
                scales.extend_from_slice(&f16_at(blk, 0).to_le_bytes());
                if format == WeightFormat::Q4_1 {
                    scales.extend_from_slice(&f16_at(blk, 2).to_le_bytes());
                }
                data.extend_from_slice(&blk[hdr..]);
            }
        }
        f => repack_subs(f, bytes, &mut data, &mut scales),
    }
    Ok(Repacked {
        format: narrow.unwrap_or(format.layout()),
        n,
        k,
        kp,
        data,
        scales,
    })
}

/// Bytes an `[n][k]` matrix of `format` occupies on the device (data and
/// scales), known before reading the tensor (the memory plan counts a
/// model's weights from these): in its narrow layout where it has one and
/// the backend reads it (`narrow`), else in its wide layout.
pub fn resident_bytes(format: WeightFormat, n: usize, k: usize, narrow: bool) -> u64 {
    let layout = match format.narrow() {
        Some(l) if narrow => l,
        _ => format,
    };
    let (d, s) = layout.row_bytes(k);
    n as u64 * (d + s) as u64
}

impl Repacked {
    /// Bytes of one row of `data` and of `scales`.
    pub fn row_bytes(&self) -> (usize, usize) {
        (self.data.len() / self.n.max(1), self.scales.len() / self.n.max(1))
    }

    /// The matrices' rows one after another (`[q; k; v]`): one gemm over the
    /// result computes each output exactly as a gemm over its own part.
    pub fn stack_rows(parts: &[Repacked], what: &str) -> Result<Repacked, FormatError> {
        let first = parts
            .first()
            .ok_or_else(|| FormatError::Mismatch { what: what.into() })?;
        if parts
            .iter()
            .any(|p| p.format != first.format || p.k != first.k || p.kp != first.kp)
        {
            return Err(FormatError::Mismatch { what: what.into() });
        }
        Ok(Repacked {
            format: first.format,
            n: parts.iter().map(|p| p.n).sum(),
            k: first.k,
            kp: first.kp,
            data: parts.iter().flat_map(|p| p.data.iter().copied()).collect(),
            scales: parts.iter().flat_map(|p| p.scales.iter().copied()).collect(),
        })
    }

    /// Row `order[i]` of `self` as row i (`order` a permutation of 0..n).
    pub fn permute_rows(&self, order: &[usize]) -> Repacked {
        let (dr, sr) = self.row_bytes();
        let mut data = Vec::with_capacity(self.data.len());
        let mut scales = Vec::with_capacity(self.scales.len());
        for &r in order {
            data.extend_from_slice(&self.data[r * dr..(r + 1) * dr]);
            scales.extend_from_slice(&self.scales[r * sr..(r + 1) * sr]);
        }
        Repacked {
            data,
            scales,
            ..self.clone()
        }
    }

    /// Rows `range` of `self` (a matrix stored fused with others: Phi-3's
    /// `attn_qkv`, its gate and up in `ffn_up`).
    pub fn slice_rows(&self, range: std::ops::Range<usize>) -> Repacked {
        let (dr, sr) = self.row_bytes();
        Repacked {
            format: self.format,
            n: range.len(),
            k: self.k,
            kp: self.kp,
            data: self.data[range.start * dr..range.end * dr].to_vec(),
            scales: self.scales[range.start * sr..range.end * sr].to_vec(),
        }
    }

    /// Rows of `a` and `b` alternating (a₀, b₀, a₁, b₁, …): gate and up as
    /// `Backend::gemm_silu_mul` reads them.
    pub fn interleave_rows(a: &Repacked, b: &Repacked, what: &str) -> Result<Repacked, FormatError> {
        if a.format != b.format || a.k != b.k || a.kp != b.kp || a.n != b.n {
            return Err(FormatError::Mismatch { what: what.into() });
        }
        let ((dr, sr), mut data, mut scales) = (a.row_bytes(), Vec::new(), Vec::new());
        data.reserve(a.data.len() * 2);
        scales.reserve(a.scales.len() * 2);
        for i in 0..a.n {
            for m in [a, b] {
                data.extend_from_slice(&m.data[i * dr..(i + 1) * dr]);
                scales.extend_from_slice(&m.scales[i * sr..(i + 1) * sr]);
            }
        }
        Ok(Repacked {
            format: a.format,
            n: 2 * a.n,
            k: a.k,
            kp: a.kp,
            data,
            scales,
        })
    }
}

#[cfg(test)]
mod fuse_tests {
    use super::*;

    fn matrix(format: WeightFormat, n: usize, k: usize, seed: u8) -> Repacked {
        let bytes: Vec<u8> = (0..format.stored_bytes(n, k))
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) & 0x3f)
            .collect();
        repack(format, &bytes, n, k).unwrap()
    }

    #[test]
    fn stacked_and_interleaved_rows_keep_every_row() {
        for format in WeightFormat::ALL {
            let (a, b) = (matrix(format, 3, 64, 1), matrix(format, 3, 64, 2));
            let c = matrix(format, 2, 64, 3);
            let s = Repacked::stack_rows(&[a.clone(), b.clone(), c.clone()], "t").unwrap();
            assert_eq!((s.n, s.data.len()), (8, a.data.len() + b.data.len() + c.data.len()));
            let (dr, sr) = a.row_bytes();
            assert_eq!(&s.data[3 * dr..6 * dr], &b.data[..]);
            assert_eq!(&s.scales[6 * sr..], &c.scales[..]);
            let il = Repacked::interleave_rows(&a, &b, "t").unwrap();
            assert_eq!(il.n, 6);
            for i in 0..3 {
                assert_eq!(
                    &il.data[2 * i * dr..(2 * i + 1) * dr],
                    &a.data[i * dr..(i + 1) * dr],
                    "{format:?}"
                );
                assert_eq!(
                    &il.data[(2 * i + 1) * dr..(2 * i + 2) * dr],
                    &b.data[i * dr..(i + 1) * dr]
                );
                assert_eq!(
                    &il.scales[(2 * i + 1) * sr..(2 * i + 2) * sr],
                    &b.scales[i * sr..(i + 1) * sr]
                );
            }
        }
    }

    #[test]
    fn resident_bytes_are_what_repack_gives() {
        for format in WeightFormat::STORED {
            let k = if format.block().0 == 256 { 512 } else { 96 };
            let r = matrix(format, 3, k, 4);
            assert_eq!(
                resident_bytes(format, 3, k, true),
                (r.data.len() + r.scales.len()) as u64,
                "{format:?}"
            );
            let w = planes::widen(&r);
            assert_eq!(
                resident_bytes(format, 3, k, false),
                (w.data.len() + w.scales.len()) as u64,
                "{format:?} widened"
            );
        }
    }

    #[test]
    fn mismatched_matrices_are_refused() {
        let a = matrix(WeightFormat::Q8_0, 2, 64, 1);
        let b = matrix(WeightFormat::Q4_0, 2, 64, 1);
        assert!(Repacked::stack_rows(&[a.clone(), b.clone()], "qkv").is_err());
        assert!(Repacked::interleave_rows(&a, &b, "gate/up").is_err());
        assert!(Repacked::interleave_rows(&a, &matrix(WeightFormat::Q8_0, 3, 64, 1), "x").is_err());
        assert!(Repacked::stack_rows(&[], "none").is_err());
    }
}
