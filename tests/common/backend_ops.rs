//! Every op of the `Backend` interface on fixed random data with awkward sizes,
//! run through the trait (so the same cases run on wgpu and on cuda), with a
//! plain CPU reference for each. `run_ops(b)` gives each case's output;
//! `reference_ops()` the CPU's, with the tolerance that case allows.

use wllm::backend::{Backend, PagedKv, RopePairing, Rows};
use wllm::model::rope::rope_table;
use wllm::quant::{self, WeightFormat};

use super::reference::{cpu_attention, cpu_rms_norm, cpu_rope};
use super::{awkward_k, rand_vec, rand_weight_bytes, rng};

/// One case's output.
pub struct OpOutput {
    pub name: String,
    pub values: Vec<f32>,
    /// Relative + absolute tolerance against the CPU reference.
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
const ATT_SEQS: [usize; 3] = [1, 9, 23]; // keys per sequence
const ATT: (usize, usize, usize, usize) = (4, 2, 64, 4); // heads, kv_heads, head_dim, block_size

/// The input of gemm case (format, t): x (t, K) at offset 3 of rows of K + 5.
fn gemm_input(format: WeightFormat, t: usize) -> (Vec<u8>, Vec<f32>, usize) {
    let k = awkward_k(format);
    let mut r = rng(100 + t as u64 + format as u64 * 7);
    let w = rand_weight_bytes(&mut r, format, GEMM_N, k);
    let x = rand_vec(&mut r, 3 + t * (k + 5));
    (w, x, k)
}

/// Runs every case on `b`.
pub fn run_ops<B: Backend>(b: &B) -> Vec<OpOutput> {
    let mut out = Vec::new();
    let mut push = |name: String, values: Vec<f32>, tol: f32| out.push(OpOutput { name, values, tol });
    for format in WeightFormat::ALL {
        for t in GEMM_T {
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
            let v = (0..t)
                .flat_map(|i| all[1 + i * (GEMM_N + 2)..][..GEMM_N].to_vec())
                .collect();
            push(format!("gemm {format:?} t={t}"), v, 2e-4);
        }
        let k = awkward_k(format);
        let mut r = rng(200 + format as u64);
        let wb = rand_weight_bytes(&mut r, format, EMBED_VOCAB, k);
        let w = b
            .upload_weight(&quant::repack(format, &wb, EMBED_VOCAB, k).unwrap(), "w")
            .unwrap();
        b.prepare_embed(&w).unwrap();
        let ids = up(b, &[5u32, 0, 66, 5, 31]);
        let o = zeros(b, 5 * k);
        let mut s = b.begin();
        b.embed(&mut s, &w, &ids, 5, &o).unwrap();
        push(format!("embed {format:?}"), read(b, s, &o, 5 * k), 1e-6);
    }
    // rms_norm: plain; with residual (h = r + x, r updated); gathering rows [2, 0].
    let (t, d) = (3usize, 77usize);
    let mut r = rng(300);
    let (x, w, res) = (rand_vec(&mut r, t * d), rand_vec(&mut r, d), rand_vec(&mut r, t * d));
    for mode in 0..3 {
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
        push(format!("rms_norm mode {mode}"), v, 1e-5);
    }
    // rope over 5 heads of rows of stride 90, both pairings.
    let (t, heads, hd) = ROPE;
    let mut r = rng(400);
    let x = rand_vec(&mut r, t * 90);
    let table = rope_table(64, hd, 10000.0);
    for pairing in [RopePairing::RotateHalf, RopePairing::Adjacent] {
        let (xb, pos, tb) = (up(b, &x), up(b, &[0u32, 7, 63]), up(b, &table));
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
        push(format!("rope {pairing:?}"), read(b, s, &xb, t * 90), 1e-5);
    }
    // silu_mul
    let (t, inter) = (3usize, 77usize);
    let gu = rand_vec(&mut rng(500), t * 2 * inter);
    let (gb, o) = (up(b, &gu), zeros(b, t * inter));
    let mut s = b.begin();
    b.silu_mul(&mut s, &gb, &o, t as u32, inter as u32).unwrap();
    push("silu_mul".into(), read(b, s, &o, t * inter), 1e-5);
    // argmax: ties keep the lowest index; a NaN never wins.
    let mut x = rand_vec(&mut rng(600), 3 * 1000);
    x[17] = 5.0;
    x[900] = 5.0;
    x[1000 + 4] = f32::NAN;
    x[1000 + 999] = 3.0;
    let (xb, o) = (up(b, &x), zeros(b, 3));
    let mut s = b.begin();
    b.argmax(&mut s, &xb, 1000, 3, &o).unwrap();
    let ids: Vec<u32> = bytemuck::pod_collect_to_vec(&b.finish(s, &[(&o, 12)]).unwrap()[0]);
    push("argmax".into(), ids.iter().map(|&i| i as f32).collect(), 0.0);
    let (name, v) = run_attention(b);
    push(name, v, 1e-4);
    out
}

/// The attention case: fused qkv rows, positions, token_seq, slot_mapping,
/// block_tables, max_blocks.
type AttentionData = (Vec<f32>, Vec<u32>, Vec<u32>, Vec<u32>, Vec<u32>, usize);

/// Sequences of ATT_SEQS keys in shuffled blocks; the cache is filled by
/// cache_write from a fused qkv, then every key position of every sequence queries.
fn attention_data() -> AttentionData {
    let (heads, kvh, hd, bs) = ATT;
    let max_blocks = 8;
    let width = (heads + 2 * kvh) * hd;
    let tokens: usize = ATT_SEQS.iter().sum();
    let qkv = rand_vec(&mut rng(700), tokens * width);
    let mut next_block = 0u32;
    let (mut pos, mut seq, mut slots, mut tables) = (vec![], vec![], vec![], vec![0u32; 3 * max_blocks]);
    for (s, &n) in ATT_SEQS.iter().enumerate() {
        for blk in 0..n.div_ceil(bs) {
            // Blocks handed out in a scrambled order (as after frees).
            tables[s * max_blocks + blk] = (next_block * 5) % 16;
            next_block += 1;
        }
        for p in 0..n {
            pos.push(p as u32);
            seq.push(s as u32);
            slots.push(tables[s * max_blocks + p / bs] * bs as u32 + (p % bs) as u32);
        }
    }
    (qkv, pos, seq, slots, tables, max_blocks)
}

fn run_attention<B: Backend>(b: &B) -> (String, Vec<f32>) {
    let (heads, kvh, hd, bs) = ATT;
    let (qkv, pos, seq, slots, tables, max_blocks) = attention_data();
    let width = (heads + 2 * kvh) * hd;
    let t = pos.len();
    let (qb, pb, sb, slb, tb) = (up(b, &qkv), up(b, &pos), up(b, &seq), up(b, &slots), up(b, &tables));
    let (kc, vc, o) = (
        zeros(b, 16 * bs * kvh * hd),
        zeros(b, 16 * bs * kvh * hd),
        zeros(b, t * heads * hd),
    );
    let mut s = b.begin();
    let kw = (kvh * hd) as u32;
    let qkv_rows = Rows::new(&qb, width);
    let (k_off, v_off) = ((heads * hd) as u32, ((heads + kvh) * hd) as u32);
    b.cache_write(&mut s, qkv_rows, k_off, v_off, kw, &slb, &kc, &vc, t as u32)
        .unwrap();
    let kv = PagedKv {
        k_cache: &kc,
        v_cache: &vc,
        kv_heads: kvh as u32,
        head_dim: hd as u32,
        block_size: bs as u32,
        positions: &pb,
        token_seq: &sb,
        block_tables: &tb,
        max_blocks: max_blocks as u32,
    };
    b.paged_attention(&mut s, &qb, width as u32, kv, heads as u32, t as u32, &o)
        .unwrap();
    ("cache_write + paged_attention".into(), read(b, s, &o, t * heads * hd))
}

/// The CPU's answer for every case of `run_ops`, in the same order.
pub fn reference_ops() -> Vec<Vec<f32>> {
    let mut out = Vec::new();
    for format in WeightFormat::ALL {
        for t in GEMM_T {
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
            out.push(v);
        }
        let k = awkward_k(format);
        let wb = rand_weight_bytes(&mut rng(200 + format as u64), format, EMBED_VOCAB, k);
        let w = quant::dequantize(format, &wb, EMBED_VOCAB, k).unwrap();
        out.push(
            [5usize, 0, 66, 5, 31]
                .iter()
                .flat_map(|&id| w[id * k..][..k].to_vec())
                .collect(),
        );
    }
    let (t, d) = (3usize, 77usize);
    let mut r = rng(300);
    let (x, w, res) = (rand_vec(&mut r, t * d), rand_vec(&mut r, d), rand_vec(&mut r, t * d));
    let norm = |h: &[f32]| cpu_rms_norm(h, &w, 1e-5);
    let summed: Vec<f32> = x.iter().zip(&res).map(|(a, b)| a + b).collect();
    out.push(x.chunks(d).flat_map(norm).collect());
    let mut v: Vec<f32> = summed.chunks(d).flat_map(norm).collect();
    v.extend(&summed);
    out.push(v);
    // Gathering rows [2, 0] updates only those rows of the residual stream.
    let mut v: Vec<f32> = [2, 0].iter().flat_map(|&i| norm(&summed[i * d..][..d])).collect();
    v.extend(&summed[..d]);
    v.extend(&res[d..2 * d]);
    v.extend(&summed[2 * d..]);
    out.push(v);
    let (t, heads, hd) = ROPE;
    let x = rand_vec(&mut rng(400), t * 90);
    for adjacent in [false, true] {
        let mut v = x.clone();
        for (i, &p) in [0usize, 7, 63].iter().enumerate().take(t) {
            cpu_rope(&mut v[i * 90..i * 90 + heads * hd], p, heads, hd, 10000.0, adjacent);
        }
        out.push(v);
    }
    let (t, inter) = (3usize, 77usize);
    let gu = rand_vec(&mut rng(500), t * 2 * inter);
    out.push(
        (0..t * inter)
            .map(|e| {
                let (i, j) = (e / inter, e % inter);
                let g = gu[i * 2 * inter + j];
                g / (1.0 + (-g).exp()) * gu[i * 2 * inter + inter + j]
            })
            .collect(),
    );
    let mut x = rand_vec(&mut rng(600), 3 * 1000);
    x[17] = 5.0;
    x[900] = 5.0;
    x[1000 + 4] = f32::NAN;
    x[1000 + 999] = 3.0;
    out.push(
        x.chunks(1000)
            .map(|row| {
                let mut best = 0;
                for (i, v) in row.iter().enumerate() {
                    if !v.is_nan() && (row[best].is_nan() || *v > row[best]) {
                        best = i;
                    }
                }
                best as f32
            })
            .collect(),
    );
    out.push(reference_attention());
    out
}

fn reference_attention() -> Vec<f32> {
    let (heads, kvh, hd, _) = ATT;
    let (qkv, pos, seq, _, _, _) = attention_data();
    let width = (heads + 2 * kvh) * hd;
    let mut out = Vec::new();
    let starts: Vec<usize> = ATT_SEQS
        .iter()
        .scan(0, |acc, &n| {
            let s = *acc;
            *acc += n;
            Some(s)
        })
        .collect();
    for (tok, (&p, &s)) in pos.iter().zip(&seq).enumerate() {
        for h in 0..heads {
            let g = h / (heads / kvh);
            let q = &qkv[tok * width + h * hd..][..hd];
            let row = |j: usize, off: usize| &qkv[(starts[s as usize] + j) * width + off + g * hd..][..hd];
            let keys: Vec<Vec<f32>> = (0..=p as usize).map(|j| row(j, heads * hd).to_vec()).collect();
            let vals: Vec<Vec<f32>> = (0..=p as usize).map(|j| row(j, (heads + kvh) * hd).to_vec()).collect();
            out.extend(cpu_attention(q, &keys, &vals, hd));
        }
    }
    out
}

/// Asserts that every output is within its tolerance of `want` (relative + absolute).
pub fn check_against(got: &[OpOutput], want: &[Vec<f32>], what: &str) {
    assert_eq!(got.len(), want.len(), "case count");
    for (g, w) in got.iter().zip(want) {
        super::close(&g.values, w, g.tol, &format!("{what}: {}", g.name));
    }
}
