//! Every op of the `Backend` interface on fixed random data with awkward sizes,
//! run through the trait (so the same cases run on wgpu and on cuda). Each case
//! (`OpCase`) holds its run and its plain CPU reference together, with the
//! tolerance it allows: `check_against_cpu(b)` runs them all.

use rand::Rng;
use wllm::backend::{Activation, Backend, Elementwise, KvDtype, MaskedArgmax, RopePairing, Rows};
use wllm::model::rope::rope_table;
use wllm::quant::{self, WeightFormat};

use super::attention_case::{reference_attention, reference_attention_with, run_attention, run_attention_with};
use super::reference::{cpu_rms_norm, cpu_rope};
use super::{awkward_k, rand_vec, rand_weight_bytes, rng};

/// Runs a case on a backend and reads its output.
pub type RunFn<B> = Box<dyn Fn(&B) -> Vec<f32>>;

/// One case: what it runs on a backend and what the CPU says it must give.
pub struct OpCase<B: Backend> {
    pub name: String,
    /// Relative + absolute tolerance against the CPU reference.
    pub tol: f32,
    pub run: RunFn<B>,
    pub reference: Box<dyn Fn() -> Vec<f32>>,
}

impl<B: Backend> OpCase<B> {
    fn new(
        name: String,
        tol: f32,
        run: impl Fn(&B) -> Vec<f32> + 'static,
        reference: impl Fn() -> Vec<f32> + 'static,
    ) -> Self {
        Self {
            name,
            tol,
            run: Box::new(run),
            reference: Box::new(reference),
        }
    }
}

/// One case's output on a backend.
pub struct OpOutput {
    pub name: String,
    pub values: Vec<f32>,
    pub tol: f32,
}

fn up<B: Backend, T: bytemuck::Pod>(b: &B, v: &[T]) -> B::Buffer {
    b.upload(bytemuck::cast_slice(v), "test").expect("upload")
}

fn zeros<B: Backend>(b: &B, n: usize) -> B::Buffer {
    b.zeros((n * 4) as u64).expect("zeros")
}

fn read<B: Backend>(b: &B, s: B::Step, buf: &B::Buffer, n: usize) -> Vec<f32> {
    let out = b.finish(s, &[(buf, (n * 4) as u64)]).expect("finish");
    bytemuck::pod_collect_to_vec(&out[0])
}

/// Row counts of the gemm cases: a decode, a small batch, and one past the
/// cuda backend's cuBLAS threshold (32).
pub const GEMM_T: [usize; 3] = [1, 3, 40];
const GEMM_N: usize = 67;
const EMBED_VOCAB: usize = 67;
const ROPE: (usize, usize, usize) = (3, 5, 16); // t, heads, head_dim

/// The input of gemm case (format, t): x (t, K) at offset 3 of rows of K + 5.
fn gemm_input(format: WeightFormat, t: usize) -> (Vec<u8>, Vec<f32>, usize) {
    let k = awkward_k(format);
    let mut r = rng(100 + t as u64 + format as u64 * 7);
    let w = rand_weight_bytes(&mut r, format, GEMM_N, k);
    let x = rand_vec(&mut r, 3 + t * (k + 5));
    (w, x, k)
}

fn gemm_case<B: Backend>(format: WeightFormat, t: usize) -> OpCase<B> {
    let run = move |b: &B| {
        let (wb, x, k) = gemm_input(format, t);
        let w = b
            .upload_weight(&quant::repack(format, &wb, GEMM_N, k).unwrap(), "w")
            .unwrap();
        b.prepare_gemm(&w).unwrap();
        let xb = up(b, &x);
        // Output rows of N + 2 starting at column 1: a fused-row write.
        let y = zeros(b, t * (GEMM_N + 2) + 1);
        let mut s = b.begin();
        let xr = Rows {
            buf: &xb,
            off: 3,
            stride: (k + 5) as u32,
        };
        let yr = Rows {
            buf: &y,
            off: 1,
            stride: (GEMM_N + 2) as u32,
        };
        b.gemm(&mut s, &w, xr, yr, t as u32).unwrap();
        let all = read(b, s, &y, t * (GEMM_N + 2) + 1);
        (0..t)
            .flat_map(|i| all[1 + i * (GEMM_N + 2)..][..GEMM_N].to_vec())
            .collect()
    };
    let reference = move || {
        let (wb, x, k) = gemm_input(format, t);
        let w = quant::dequantize(format, &wb, GEMM_N, k).unwrap();
        let mut v = Vec::new();
        for i in 0..t {
            let xr = &x[3 + i * (k + 5)..][..k];
            for n in 0..GEMM_N {
                v.push(
                    xr.iter()
                        .zip(&w[n * k..][..k])
                        .map(|(a, b)| f64::from(a * b))
                        .sum::<f64>() as f32,
                );
            }
        }
        v
    };
    OpCase::new(format!("gemm {format:?} t={t}"), 2e-4, run, reference)
}

const EMBED_IDS: [u32; 5] = [5, 0, 66, 5, 31];

fn embed_case<B: Backend>(format: WeightFormat) -> OpCase<B> {
    let k = awkward_k(format);
    let weights = move || rand_weight_bytes(&mut rng(200 + format as u64), format, EMBED_VOCAB, k);
    let run = move |b: &B| {
        let w = b
            .upload_weight(&quant::repack(format, &weights(), EMBED_VOCAB, k).unwrap(), "w")
            .unwrap();
        b.prepare_embed(&w).unwrap();
        let ids = up(b, &EMBED_IDS);
        let o = zeros(b, 5 * k);
        let mut s = b.begin();
        b.embed(&mut s, &w, &ids, 5, &o).unwrap();
        read(b, s, &o, 5 * k)
    };
    let reference = move || {
        let w = quant::dequantize(format, &weights(), EMBED_VOCAB, k).unwrap();
        EMBED_IDS
            .iter()
            .flat_map(|&id| w[id as usize * k..][..k].to_vec())
            .collect()
    };
    OpCase::new(format!("embed {format:?}"), 1e-6, run, reference)
}

const NORM: (usize, usize) = (3, 77); // t, d

fn norm_data() -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (t, d) = NORM;
    let mut r = rng(300);
    (rand_vec(&mut r, t * d), rand_vec(&mut r, d), rand_vec(&mut r, t * d))
}

/// rms_norm: mode 0 plain; 1 with residual (h = r + x, r updated); 2 also
/// gathering rows [2, 0]. With a residual, the residual rows are checked too.
fn rms_norm_case<B: Backend>(mode: usize) -> OpCase<B> {
    let (t, d) = NORM;
    let run = move |b: &B| {
        let (x, w, res) = norm_data();
        let (xb, wb, rb, rows) = (up(b, &x), up(b, &w), up(b, &res), up(b, &[2u32, 0]));
        let y = zeros(b, t * d);
        let n_out = if mode == 2 { 2 } else { t };
        let mut s = b.begin();
        let residual = (mode >= 1).then_some(&rb);
        let gather = (mode == 2).then_some(&rows);
        b.rms_norm(
            &mut s,
            Rows::new(&xb, d),
            &wb,
            residual,
            gather,
            1e-5,
            n_out as u32,
            d as u32,
            &y,
        )
        .unwrap();
        let mut v = read(b, s, &y, n_out * d);
        if mode >= 1 {
            v.extend(read(b, b.begin(), &rb, t * d));
        }
        v
    };
    let reference = move || {
        let (x, w, res) = norm_data();
        let norm = |h: &[f32]| cpu_rms_norm(h, &w, 1e-5);
        let summed: Vec<f32> = x.iter().zip(&res).map(|(a, b)| a + b).collect();
        match mode {
            0 => x.chunks(d).flat_map(norm).collect(),
            1 => {
                let mut v: Vec<f32> = summed.chunks(d).flat_map(norm).collect();
                v.extend(&summed);
                v
            }
            _ => {
                // Gathering rows [2, 0] updates only those rows of the residual stream.
                let mut v: Vec<f32> = [2, 0].iter().flat_map(|&i| norm(&summed[i * d..][..d])).collect();
                v.extend(&summed[..d]);
                v.extend(&res[d..2 * d]);
                v.extend(&summed[2 * d..]);
                v
            }
        }
    };
    OpCase::new(format!("rms_norm mode {mode}"), 1e-5, run, reference)
}

/// rope over 5 heads of rows of stride 90 at positions 0, 7, 63.
fn rope_case<B: Backend>(pairing: RopePairing) -> OpCase<B> {
    let (t, heads, hd) = ROPE;
    let input = move || rand_vec(&mut rng(400), t * 90);
    let run = move |b: &B| {
        let table = rope_table(64, hd, 10000.0);
        let (xb, pos, tb) = (up(b, &input()), up(b, &[0u32, 7, 63]), up(b, &table));
        let mut s = b.begin();
        b.rope(
            &mut s,
            &xb,
            90,
            &pos,
            &tb,
            64,
            t as u32,
            heads as u32,
            hd as u32,
            pairing,
        )
        .unwrap();
        read(b, s, &xb, t * 90)
    };
    let reference = move || {
        let mut v = input();
        for (i, &p) in [0usize, 7, 63].iter().enumerate().take(t) {
            let adjacent = pairing == RopePairing::Adjacent;
            cpu_rope(&mut v[i * 90..i * 90 + heads * hd], p, heads, hd, 10000.0, adjacent);
        }
        v
    };
    OpCase::new(format!("rope {pairing:?}"), 1e-5, run, reference)
}

fn act_mul_case<B: Backend>(act: Activation) -> OpCase<B> {
    let (t, inter) = (3usize, 77usize);
    // Gate values wide enough for gelu's tanh to saturate at both ends.
    let input = move || {
        rand_vec(&mut rng(500), t * 2 * inter)
            .iter()
            .map(|v| v * 12.0)
            .collect::<Vec<f32>>()
    };
    let run = move |b: &B| {
        let (gb, o) = (up(b, &input()), zeros(b, t * inter));
        let mut s = b.begin();
        b.act_mul(&mut s, &gb, &o, t as u32, inter as u32, act).unwrap();
        read(b, s, &o, t * inter)
    };
    let reference = move || {
        let gu = input();
        (0..t * inter)
            .map(|e| {
                let (i, j) = (e / inter, e % inter);
                let g = f64::from(gu[i * 2 * inter + j]);
                let a = match act {
                    Activation::Silu => g / (1.0 + (-g).exp()),
                    Activation::GeluTanh => {
                        0.5 * g * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g)).tanh())
                    }
                };
                (a * f64::from(gu[i * 2 * inter + inter + j])) as f32
            })
            .collect()
    };
    OpCase::new(format!("act_mul {act:?}"), 1e-5, run, reference)
}

/// add_bias on rows with an offset and a stride wider than the bias.
fn add_bias_case<B: Backend>() -> OpCase<B> {
    let (t, n, stride, off) = (5usize, 37usize, 53usize, 7usize);
    let x = move || rand_vec(&mut rng(510), off + t * stride);
    let bias = move || rand_vec(&mut rng(511), n);
    let run = move |b: &B| {
        let (xb, bb) = (up(b, &x()), up(b, &bias()));
        let mut s = b.begin();
        let rows = Rows {
            buf: &xb,
            off: off as u32,
            stride: stride as u32,
        };
        b.add_bias(&mut s, rows, &bb, n as u32, t as u32).unwrap();
        read(b, s, &xb, off + t * stride)
    };
    let reference = move || {
        let (mut v, bias) = (x(), bias());
        for r in 0..t {
            for i in 0..n {
                v[off + r * stride + i] += bias[i];
            }
        }
        v
    };
    OpCase::new("add_bias".into(), 1e-6, run, reference)
}

/// head_norm over 3 heads of an awkward head_dim (> 64 lanes, not a multiple of them).
fn head_norm_case<B: Backend>() -> OpCase<B> {
    let (t, heads, hd, stride, off) = (4usize, 3usize, 100usize, 331usize, 17usize);
    let x = move || rand_vec(&mut rng(520), off + t * stride);
    let w = move || rand_vec(&mut rng(521), hd);
    let run = move |b: &B| {
        let (xb, wb) = (up(b, &x()), up(b, &w()));
        let mut s = b.begin();
        let rows = Rows {
            buf: &xb,
            off: off as u32,
            stride: stride as u32,
        };
        b.head_norm(&mut s, rows, &wb, 1e-6, heads as u32, hd as u32, t as u32)
            .unwrap();
        read(b, s, &xb, off + t * stride)
    };
    let reference = move || {
        let (mut v, w) = (x(), w());
        for r in 0..t {
            for h in 0..heads {
                let at = off + r * stride + h * hd;
                let normed = cpu_rms_norm(&v[at..at + hd], &w, 1e-6);
                v[at..at + hd].copy_from_slice(&normed);
            }
        }
        v
    };
    OpCase::new("head_norm".into(), 1e-5, run, reference)
}

/// elementwise over more floats than one pass of the dispatch covers.
fn elementwise_case<B: Backend>(op: Elementwise) -> OpCase<B> {
    let n = 64 * 4096 * 2 + 13;
    let x = move || {
        rand_vec(&mut rng(530), n)
            .iter()
            .map(|v| v * 80.0)
            .collect::<Vec<f32>>()
    };
    let run = move |b: &B| {
        let xb = up(b, &x());
        let mut s = b.begin();
        b.elementwise(&mut s, &xb, n as u32, op).unwrap();
        read(b, s, &xb, n)
    };
    let reference = move || {
        x().iter()
            .map(|&v| {
                let v = f64::from(v);
                (match op {
                    Elementwise::Scale(a) => v * f64::from(a),
                    Elementwise::Softcap(c) => f64::from(c) * (v / f64::from(c)).tanh(),
                }) as f32
            })
            .collect()
    };
    OpCase::new(format!("elementwise {op:?}"), 1e-5, run, reference)
}

/// argmax: ties keep the lowest index; a NaN never wins.
fn argmax_case<B: Backend>() -> OpCase<B> {
    let input = || {
        let mut x = rand_vec(&mut rng(600), 3 * 1000);
        x[17] = 5.0;
        x[900] = 5.0;
        x[1000 + 4] = f32::NAN;
        x[1000 + 999] = 3.0;
        x
    };
    let run = move |b: &B| {
        let (xb, o) = (up(b, &input()), zeros(b, 3));
        let mut s = b.begin();
        b.argmax(&mut s, &xb, 1000, 3, &o).unwrap();
        let ids: Vec<u32> = bytemuck::pod_collect_to_vec(&b.finish(s, &[(&o, 12)]).unwrap()[0]);
        ids.iter().map(|&i| i as f32).collect()
    };
    let reference = move || {
        input()
            .chunks(1000)
            .map(|row| {
                let mut best = 0;
                for (i, v) in row.iter().enumerate() {
                    if !v.is_nan() && (row[best].is_nan() || *v > row[best]) {
                        best = i;
                    }
                }
                best as f32
            })
            .collect()
    };
    OpCase::new("argmax".into(), 0.0, run, reference)
}

/// masked_argmax: (logits rows of 1000, entries with a mask of 32 words each)
/// covering no allowed token, ties among allowed tokens beside a larger
/// forbidden one, an allowed NaN, only −∞ allowed, the last token alone, and
/// mask bits past the vocabulary (ignored).
fn masked_argmax_input() -> (Vec<f32>, Vec<u32>, Vec<u32>) {
    let (n, words) = (1000usize, 32usize);
    let mut x = rand_vec(&mut rng(601), 4 * n);
    let rows = vec![2u32, 0, 3, 2, 1, 1];
    let mut r = rng(602);
    let mut mask: Vec<u32> = (0..rows.len() * words)
        // About one bit in eight set.
        .map(|_| r.random::<u32>() & r.random::<u32>() & r.random::<u32>())
        .collect();
    // 0: nothing allowed (bits past token 999 only).
    mask[..words].fill(0);
    mask[words - 1] = 0xff00_0000;
    // 1 (row 0): tokens 10 and 700 tie at 7.0, 11 (forbidden) holds 9.0.
    mask[words..2 * words].fill(0);
    mask[words] = 1 << 10;
    mask[words + 700 / 32] |= 1 << (700 % 32);
    x[10] = 7.0;
    x[11] = 9.0;
    x[700] = 7.0;
    // 2 (row 3): an allowed NaN above everything.
    mask[2 * words] |= 1;
    x[3 * n] = f32::NAN;
    // 3 (row 2): only −∞ allowed (tokens 64 and 65): the lower wins.
    mask[3 * words..4 * words].fill(0);
    mask[3 * words + 2] = 0b11;
    x[2 * n + 64] = f32::NEG_INFINITY;
    x[2 * n + 65] = f32::NEG_INFINITY;
    // 4 (row 1): the last token alone, with bits past it set.
    mask[4 * words..5 * words].fill(0);
    mask[5 * words - 1] = 0xff80_0000 | (1 << (999 % 32));
    (x, mask, rows)
}

fn masked_argmax_case<B: Backend>() -> OpCase<B> {
    let run = |b: &B| {
        let (x, mask, rows) = masked_argmax_input();
        let count = rows.len();
        let (xb, mb, rb, o) = (up(b, &x), up(b, &mask), up(b, &rows), zeros(b, count));
        let mut s = b.begin();
        let a = MaskedArgmax {
            x: &xb,
            n: 1000,
            mask: &mb,
            words: 32,
            rows: &rb,
            count: count as u32,
            out: &o,
        };
        b.masked_argmax(&mut s, a).unwrap();
        let ids: Vec<u32> = bytemuck::pod_collect_to_vec(&b.finish(s, &[(&o, count as u64 * 4)]).unwrap()[0]);
        ids.iter()
            .map(|&i| if i == u32::MAX { -1.0 } else { i as f32 })
            .collect()
    };
    let reference = || {
        let (x, mask, rows) = masked_argmax_input();
        let (n, words) = (1000usize, 32usize);
        rows.iter()
            .enumerate()
            .map(|(e, &r)| {
                let row = &x[r as usize * n..(r as usize + 1) * n];
                let allowed = |k: usize| mask[e * words + k / 32] >> (k % 32) & 1 == 1;
                let mut best: Option<usize> = None;
                for (k, &v) in row.iter().enumerate() {
                    if allowed(k) && !v.is_nan() && best.is_none_or(|b| v > row[b]) {
                        best = Some(k);
                    }
                }
                best.map_or(-1.0, |b| b as f32)
            })
            .collect()
    };
    OpCase::new("masked_argmax".into(), 0.0, run, reference)
}

/// Every case, each with its run and its reference (gemm and embed in every
/// type a file may hold, and the Q8_16 layout as such).
pub fn op_cases<B: Backend>() -> Vec<OpCase<B>> {
    let mut cases = Vec::new();
    for format in WeightFormat::STORED.into_iter().chain([WeightFormat::Q8_16]) {
        for t in GEMM_T {
            cases.push(gemm_case(format, t));
        }
        cases.push(embed_case(format));
    }
    for mode in 0..3 {
        cases.push(rms_norm_case(mode));
    }
    for pairing in [RopePairing::RotateHalf, RopePairing::Adjacent] {
        cases.push(rope_case(pairing));
    }
    cases.push(act_mul_case(Activation::Silu));
    cases.push(act_mul_case(Activation::GeluTanh));
    cases.push(add_bias_case());
    cases.push(head_norm_case());
    cases.push(elementwise_case(Elementwise::Scale(25.3)));
    cases.push(elementwise_case(Elementwise::Softcap(30.0)));
    cases.push(argmax_case());
    cases.push(masked_argmax_case());
    cases.push(OpCase::new(
        "cache_write + paged_attention".into(),
        1e-4,
        run_attention::<B>,
        reference_attention,
    ));
    // A window shorter than the longer sequences (and not a multiple of any lane
    // count), with soft-capped scores.
    cases.push(OpCase::new(
        "paged_attention, sliding window 6, soft-cap 0.5".into(),
        1e-4,
        |b: &B| run_attention_with(b, 6, 0.5, KvDtype::F32, false),
        || reference_attention_with(6, 0.5, KvDtype::F32),
    ));
    // The cache of halves: the reference rounds K and V to the nearest half,
    // ties to even, as every backend does (wgpu in integer ops, half_pack.wgsl;
    // cuda with cvt.rn), so the tolerance is the f32 one.
    cases.push(OpCase::new(
        "cache_write + paged_attention, f16 cache".into(),
        1e-4,
        |b: &B| run_attention_with(b, 0, 0.0, KvDtype::F16, false),
        || reference_attention_with(0, 0.0, KvDtype::F16),
    ));
    cases.push(OpCase::new(
        "cache_write + paged_attention, f16 cache from kv_cache, window 6".into(),
        1e-4,
        |b: &B| run_attention_with(b, 6, 0.0, KvDtype::F16, true),
        || reference_attention_with(6, 0.0, KvDtype::F16),
    ));
    // q8_0: the reference quantises each block of 32 as the writers do (a K
    // block rotated first, and rotated back for the reference's q · k); a
    // value on a rounding boundary may land one step (amax / 127) away where
    // a backend's 127 / amax differs in the last bit, hence the tolerance.
    cases.push(OpCase::new(
        "cache_write + paged_attention, q8_0 cache".into(),
        2e-3,
        |b: &B| run_attention_with(b, 0, 0.0, KvDtype::Q8_0, false),
        || reference_attention_with(0, 0.0, KvDtype::Q8_0),
    ));
    cases.push(OpCase::new(
        "cache_write + paged_attention, q8_0 cache from kv_cache, window 6, soft-cap 0.5".into(),
        2e-3,
        |b: &B| run_attention_with(b, 6, 0.5, KvDtype::Q8_0, true),
        || reference_attention_with(6, 0.5, KvDtype::Q8_0),
    ));
    cases.push(OpCase::new(
        "cache_write + paged_attention, f32 cache from kv_cache".into(),
        1e-4,
        |b: &B| run_attention_with(b, 0, 0.0, KvDtype::F32, true),
        || reference_attention_with(0, 0.0, KvDtype::F32),
    ));
    cases
}

/// Runs every case on `b`.
pub fn run_ops<B: Backend>(b: &B) -> Vec<OpOutput> {
    op_cases::<B>()
        .into_iter()
        .map(|c| OpOutput {
            values: (c.run)(b),
            name: c.name,
            tol: c.tol,
        })
        .collect()
}

/// Asserts that every case on `b` is within its tolerance of its CPU reference.
pub fn check_against_cpu<B: Backend>(b: &B, what: &str) {
    let cases = op_cases::<B>();
    assert!(cases.len() >= 30, "only {} cases", cases.len());
    for c in cases {
        super::close(&(c.run)(b), &(c.reference)(), c.tol, &format!("{what}: {}", c.name));
    }
}
