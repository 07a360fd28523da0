//! cache_write and paged_attention against a CPU reference: varlen sequences,
//! shuffled physical blocks, GQA, awkward lengths; and batch invariance. Caches
//! as buffers and as the textures `Backend::kv_cache` makes on CPU adapters.

mod common;

use common::reference::*;
use common::*;
use rand::seq::SliceRandom;
use wllm::backend::wgsl::{PagedKv, Rows};
use wllm::backend::{Backend, KvDtype};
use wllm::kv_dtype::rotate_block;

struct Case {
    heads: usize,
    kv_heads: usize,
    hd: usize,
    bs: usize,
}

/// Runs cache_write for every token of every sequence, then attention for the
/// `query` tokens (sequence, position); returns (gpu, cpu) outputs.
fn run_case(c: &Case, seq_lens: &[usize], queries: &[(usize, usize)], seed: u64) -> (Vec<f32>, Vec<f32>) {
    run_case_on(kernels(), c, seq_lens, queries, seed, Pool::Buffers(3), KvDtype::F32)
}

/// The caches a case writes and reads: buffers, or what `Backend::kv_cache`
/// returns (textures on CPU adapters); with this many blocks spare in the pool.
#[derive(Clone, Copy)]
enum Pool {
    Buffers(usize),
    KvCache(usize),
}

fn run_case_on(
    ks: &wllm::backend::wgsl::Kernels,
    c: &Case,
    seq_lens: &[usize],
    queries: &[(usize, usize)],
    seed: u64,
    pool: Pool,
    dtype: KvDtype,
) -> (Vec<f32>, Vec<f32>) {
    let mut r = rng(seed);
    let (h, hk, hd, bs) = (c.heads, c.kv_heads, c.hd, c.bs);
    let kv_w = hk * hd;
    let qkv_w = (h + 2 * hk) * hd;
    let max_blocks = seq_lens.iter().map(|l| l.div_ceil(bs)).max().unwrap();
    let spare = match pool {
        Pool::Buffers(n) | Pool::KvCache(n) => n,
    };
    let total_blocks: usize = seq_lens.iter().map(|l| l.div_ceil(bs)).sum::<usize>() + spare;
    let mut phys: Vec<u32> = (0..total_blocks as u32).collect();
    phys.shuffle(&mut r);
    let mut tables = vec![0u32; seq_lens.len() * max_blocks];
    let mut next = 0;
    for (s, &l) in seq_lens.iter().enumerate() {
        for b in 0..l.div_ceil(bs) {
            tables[s * max_blocks + b] = phys[next];
            next += 1;
        }
    }
    // Every token's q|k|v row; write all K/V into the cache in one pass.
    let rows: Vec<(usize, usize)> = seq_lens
        .iter()
        .enumerate()
        .flat_map(|(s, &l)| (0..l).map(move |p| (s, p)))
        .collect();
    let qkv = rand_vec(&mut r, rows.len() * qkv_w);
    let slots: Vec<u32> = rows
        .iter()
        .map(|&(s, p)| tables[s * max_blocks + p / bs] * bs as u32 + (p % bs) as u32)
        .collect();
    let (qkv_b, slot_b) = (upload(&qkv), upload(&slots));
    let (kc, vc) = match pool {
        Pool::Buffers(_) => {
            let n = (total_blocks * bs * dtype.row_bytes(kv_w as u64) as usize).div_ceil(4);
            (zeros(n), zeros(n))
        }
        Pool::KvCache(_) => {
            let cache = || ks.kv_cache((total_blocks * bs) as u64, kv_w as u32, dtype).unwrap();
            (cache(), cache())
        }
    };
    let mut enc = encoder();
    let qkv_rows = Rows {
        buf: &qkv_b,
        off: 0,
        stride: qkv_w as u32,
    };
    ks.cache_write(
        &mut enc,
        qkv_rows,
        (h * hd) as u32,
        ((h + hk) * hd) as u32,
        kv_w as u32,
        &slot_b,
        &kc,
        &vc,
        (total_blocks * bs) as u32,
        dtype,
        rows.len() as u32,
    )
    .unwrap();
    run_read::<f32>(enc, &[]);
    // The queries of this step.
    let row_of = |s: usize, p: usize| rows.iter().position(|&x| x == (s, p)).unwrap();
    let q: Vec<f32> = queries
        .iter()
        .flat_map(|&(s, p)| qkv[row_of(s, p) * qkv_w..row_of(s, p) * qkv_w + h * hd].to_vec())
        .collect();
    let pos: Vec<u32> = queries.iter().map(|&(_, p)| p as u32).collect();
    let tseq: Vec<u32> = queries.iter().map(|&(s, _)| s as u32).collect();
    let (qb, pb, sb, tb) = (upload(&q), upload(&pos), upload(&tseq), upload(&tables));
    let out = zeros(queries.len() * h * hd);
    let kv = PagedKv {
        k_cache: &kc,
        v_cache: &vc,
        dtype,
        kv_heads: hk as u32,
        head_dim: hd as u32,
        block_size: bs as u32,
        positions: &pb,
        token_seq: &sb,
        block_tables: &tb,
        max_blocks: max_blocks as u32,
        kv_rows: (total_blocks * bs) as u32,
        max_query_len: queries.len() as u32,
        window: 0,
        scale: wllm::backend::PagedKv::<()>::default_scale(hd as u32),
        softcap: 0.0,
    };
    let mut enc = encoder();
    ks.paged_attention(&mut enc, &qb, u32::MAX, kv, h as u32, queries.len() as u32, &out)
        .unwrap();
    let got: Vec<f32> = run_read(enc, &[(&out, queries.len() * h * hd)]).remove(0);
    let mut want = Vec::new();
    for (qi, &(s, p)) in queries.iter().enumerate() {
        for head in 0..h {
            let kvh = head / (h / hk);
            let keys: Vec<Vec<f32>> = (0..=p)
                .map(|j| {
                    let o = row_of(s, j) * qkv_w + h * hd;
                    dtype.key_round_trip(&qkv[o..o + kv_w])[kvh * hd..][..hd].to_vec()
                })
                .collect();
            let vals: Vec<Vec<f32>> = (0..=p)
                .map(|j| {
                    let o = row_of(s, j) * qkv_w + (h + hk) * hd;
                    as_stored(&qkv[o..o + kv_w], dtype)[kvh * hd..][..hd].to_vec()
                })
                .collect();
            want.extend(cpu_attention(
                &q[(qi * h + head) * hd..(qi * h + head + 1) * hd],
                &keys,
                &vals,
                hd,
            ));
        }
    }
    (got, want)
}

/// The tolerance against the CPU reference, whose K and V are a KV row as
/// the cache of `dtype` holds it (`KvDtype::round_trip`: f16 rounded as
/// half_pack.wgsl rounds, q8_0 quantised as the cache writers quantise).
/// q8_0's is wider: the GPU's 127 / amax may differ from the CPU's in the last
/// bit, moving a value on a rounding boundary by one step (amax / 127).
fn tol(dtype: KvDtype) -> f32 {
    match dtype {
        KvDtype::Q8_0 => 2e-3,
        _ => 1e-4,
    }
}

/// A V row (kv_heads · head_dim values) as a cache of `dtype` holds it (a K
/// row: `KvDtype::key_round_trip`, rotated in q8_0).
fn as_stored(v: &[f32], dtype: KvDtype) -> Vec<f32> {
    dtype.round_trip(v)
}

#[test]
fn gpu_shaped_paged_attention_matches_cpu() {
    let mut ks = wllm::backend::wgsl::Kernels::new(&kernels().ctx).unwrap();
    ks.use_gpu_shapes();
    for (ci, c) in [
        Case {
            heads: 9,
            kv_heads: 3,
            hd: 64,
            bs: 16,
        },
        Case {
            heads: 8,
            kv_heads: 2,
            hd: 256,
            bs: 8,
        },
    ]
    .iter()
    .enumerate()
    {
        let queries: Vec<(usize, usize)> = (30..67).map(|p| (2, p)).chain([(0, 0), (1, 2), (3, 129)]).collect();
        let (got, want) = run_case_on(
            &ks,
            c,
            &[1, 3, 67, 130],
            &queries,
            50 + ci as u64,
            Pool::Buffers(3),
            KvDtype::F32,
        );
        close(&got, &want, 1e-5, &format!("attention case {ci}"));
    }
}

#[test]
fn paged_attention_matches_cpu() {
    let cases = [
        Case {
            heads: 9,
            kv_heads: 3,
            hd: 64,
            bs: 16,
        },
        Case {
            heads: 4,
            kv_heads: 4,
            hd: 32,
            bs: 1,
        },
        Case {
            heads: 8,
            kv_heads: 2,
            hd: 128,
            bs: 8,
        },
        Case {
            heads: 6,
            kv_heads: 1,
            hd: 16,
            bs: 32,
        },
    ];
    for (ci, c) in cases.iter().enumerate() {
        let seq_lens = [1usize, 3, 67, 130];
        // A prefill chunk of seq 2, decodes of the others, and a middle position.
        let mut queries: Vec<(usize, usize)> = (40..67).map(|p| (2, p)).collect();
        queries.extend([(0, 0), (1, 2), (3, 129), (3, 64)]);
        let (got, want) = run_case(c, &seq_lens, &queries, ci as u64);
        close(&got, &want, 1e-5, &format!("attention case {ci}"));
        // A step of 64+ tokens (CPU adapters then tile 4 tokens a workgroup):
        // two prefill chunks whose tiles straddle the boundary between them,
        // then decodes.
        let mut big: Vec<(usize, usize)> = (40..67).map(|p| (2, p)).collect();
        big.extend((0..45).map(|p| (3, p)));
        big.extend([(0, 0), (1, 2), (3, 129)]);
        let (got, want) = run_case(c, &seq_lens, &big, 10 + ci as u64);
        close(&got, &want, 1e-5, &format!("attention case {ci}, {} tokens", big.len()));
    }
}

#[test]
fn paged_attention_is_batch_invariant() {
    let c = Case {
        heads: 9,
        kv_heads: 3,
        hd: 64,
        bs: 16,
    };
    let seq_lens = [5usize, 100, 37];
    let batch: Vec<(usize, usize)> = (0..100).map(|p| (1, p)).chain([(0, 4), (2, 36)]).collect();
    // Every cache dtype, as buffers and as `Backend::kv_cache` makes them.
    for (dtype, pool) in [
        (KvDtype::F32, Pool::Buffers(3)),
        (KvDtype::F16, Pool::Buffers(3)),
        (KvDtype::F16, Pool::KvCache(3)),
        (KvDtype::Q8_0, Pool::Buffers(3)),
        (KvDtype::Q8_0, Pool::KvCache(3)),
    ] {
        let run = |q: &[(usize, usize)]| run_case_on(kernels(), &c, &seq_lens, q, 9, pool, dtype);
        let (all, want) = run(&batch);
        close(&all, &want, tol(dtype), &format!("{dtype}: against the CPU"));
        let w = c.heads * c.hd;
        for (qi, &q) in batch.iter().enumerate().filter(|(i, _)| i % 17 == 0 || *i >= 100) {
            let (one, _) = run(&[q]);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&one),
                bits(&all[qi * w..(qi + 1) * w]),
                "{dtype}: query {q:?} alone differs from the batch"
            );
        }
    }
}

/// The cache as `Backend::kv_cache` makes it (textures on CPU adapters, here
/// over a pool of several texture layers, the blocks scattered across them):
/// the same bits as buffers, for prefill chunks, decodes and both together.
#[test]
fn paged_attention_over_kv_cache_textures_equals_buffers() {
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for (ci, (c, spare)) in [
        (
            Case {
                heads: 9,
                kv_heads: 3,
                hd: 64,
                bs: 16,
            },
            150,
        ),
        (
            Case {
                heads: 6,
                kv_heads: 1,
                hd: 16,
                bs: 32,
            },
            70,
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let seq_lens = [1usize, 3, 67, 130];
        let decodes: Vec<(usize, usize)> = vec![(0, 0), (1, 2), (3, 129), (2, 66)];
        let mut big: Vec<(usize, usize)> = (40..67).map(|p| (2, p)).collect();
        big.extend((0..45).map(|p| (3, p)));
        big.extend([(0, 0), (1, 2), (3, 129)]);
        for (what, queries) in [("decodes", decodes), ("prefill and decodes", big)] {
            let seed = 30 + ci as u64;
            for dtype in [KvDtype::F32, KvDtype::F16] {
                let run = |pool| run_case_on(kernels(), &c, &seq_lens, &queries, seed, pool, dtype);
                let (tex, want) = run(Pool::KvCache(spare));
                let (buf, _) = run(Pool::Buffers(spare));
                let t = 1e-5;
                close(&tex, &want, t, &format!("case {ci}, {what}, {dtype}: textures vs CPU"));
                assert_eq!(
                    bits(&tex),
                    bits(&buf),
                    "case {ci}, {what}, {dtype}: textures differ from buffers"
                );
            }
        }
    }
}

/// cache_write into an f16 cache rounds exactly as `half` does (to nearest,
/// ties to even; subnormals, overflow to infinity, NaN kept), in a buffer and
/// in what `Backend::kv_cache` makes (textures on CPU adapters).
#[test]
fn f16_cache_rounds_to_nearest_even() {
    let ks = kernels();
    let mut vals: Vec<f32> = vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        65504.0,
        65519.0,
        65520.0,
        1e6,
        -1e6,
        6.1e-5,
        6.0e-8,
        2.9e-8,
        3.0e-8,
        1e-10,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MIN_POSITIVE,
    ];
    // Ties and near-ties between neighbouring halves, normal and subnormal.
    for h in [0x3c00u16, 0x3c01, 0x0001, 0x0002, 0x03ff, 0x0400, 0x7bfe, 0xbc03] {
        let (a, b) = (half::f16::from_bits(h).to_f32(), half::f16::from_bits(h + 1).to_f32());
        let mid = (a + b) / 2.0;
        vals.extend([
            mid,
            f32::from_bits(mid.to_bits() + 1),
            f32::from_bits(mid.to_bits() - 1),
        ]);
    }
    let mut r = rng(3);
    vals.extend(rand_vec(&mut r, 200).iter().map(|x| x * 3.7));
    let width = 8usize;
    vals.resize(vals.len().next_multiple_of(width), 0.5);
    let rows = vals.len() / width;
    // qkv rows of K then V (both the values).
    let qkv: Vec<f32> = vals
        .chunks(width)
        .flat_map(|c| c.iter().chain(c.iter()).copied())
        .collect();
    let slots: Vec<u32> = (0..rows as u32).rev().collect();
    let (qb, sb) = (upload(&qkv), upload(&slots));
    for from_backend in [false, true] {
        let cache = || match from_backend {
            true => ks.kv_cache(rows as u64, width as u32, KvDtype::F16).unwrap(),
            false => zeros((rows * width).div_ceil(2)),
        };
        let (kc, vc) = (cache(), cache());
        let mut enc = encoder();
        let qkv_rows = Rows {
            buf: &qb,
            off: 0,
            stride: 2 * width as u32,
        };
        ks.cache_write(
            &mut enc,
            qkv_rows,
            0,
            width as u32,
            width as u32,
            &sb,
            &kc,
            &vc,
            rows as u32,
            KvDtype::F16,
            rows as u32,
        )
        .unwrap();
        run_read::<f32>(enc, &[]);
        for c in [&kc, &vc] {
            let got = ks.read_kv_cache(c, rows as u32, width as u32, KvDtype::F16).unwrap();
            for (t, &s) in slots.iter().enumerate() {
                for e in 0..width {
                    let (x, g) = (vals[t * width + e], got[s as usize * width + e]);
                    let want = half::f16::from_f32(x).to_f32();
                    assert!(
                        g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                        "{x:e} ({:#x}) became {g:e}, want {want:e} (kv_cache {from_backend})",
                        x.to_bits()
                    );
                }
            }
        }
    }
}

/// A q8_0 cache holds each block of 32 values as int8 steps of amax / 127
/// (llama.cpp's q8_0; a K block rotated by the Walsh–Hadamard matrix first):
/// read back, every value is the CPU's quantisation of it
/// (`KvDtype::round_trip`, `KvDtype::stored_key`) or, where the GPU's 127 / amax differs in the last
/// bit and a value sits on a rounding boundary, one step from it; a block of
/// zeros stays zeros and a block's largest value comes back exactly ±amax
/// (to the scale's rounding).
#[test]
fn q8_0_cache_quantises_blocks_of_32() {
    let ks = kernels();
    let width = 96usize; // three blocks a row
    let rows = 37usize;
    let mut r = rng(8);
    let mut vals: Vec<f32> = rand_vec(&mut r, rows * width).iter().map(|x| x * 5.0).collect();
    vals[..32].fill(0.0); // a block of zeros
    vals[32..64]
        .iter_mut()
        .enumerate()
        .for_each(|(i, v)| *v = 1e-30 * i as f32); // tiny
    vals[64] = 1e6; // one huge value among small ones
    let qkv: Vec<f32> = vals
        .chunks(width)
        .flat_map(|c| c.iter().chain(c.iter()).copied())
        .collect();
    let slots: Vec<u32> = (0..rows as u32).map(|s| (s * 7) % rows as u32).collect();
    let (qb, sb) = (upload(&qkv), upload(&slots));
    for from_backend in [false, true] {
        let n = (rows as u64 * KvDtype::Q8_0.row_bytes(width as u64)).div_ceil(4) as usize;
        let cache = || match from_backend {
            true => ks.kv_cache(rows as u64, width as u32, KvDtype::Q8_0).unwrap(),
            false => zeros(n),
        };
        let (kc, vc) = (cache(), cache());
        let mut enc = encoder();
        let qkv_rows = Rows {
            buf: &qb,
            off: 0,
            stride: 2 * width as u32,
        };
        ks.cache_write(
            &mut enc,
            qkv_rows,
            0,
            width as u32,
            width as u32,
            &sb,
            &kc,
            &vc,
            rows as u32,
            KvDtype::Q8_0,
            rows as u32,
        )
        .unwrap();
        run_read::<f32>(enc, &[]);
        // The K cache holds each block rotated (`KvDtype::rotate_block`), then quantised.
        for (c, key) in [(&kc, true), (&vc, false)] {
            let got = ks.read_kv_cache(c, rows as u32, width as u32, KvDtype::Q8_0).unwrap();
            for (t, &s) in slots.iter().enumerate() {
                let row = &vals[t * width..(t + 1) * width];
                let (row, want) = match key {
                    true => (
                        row.chunks(32).flat_map(rotate_block).collect::<Vec<_>>(),
                        KvDtype::Q8_0.stored_key(row),
                    ),
                    false => (row.to_vec(), KvDtype::Q8_0.round_trip(row)),
                };
                let g = &got[s as usize * width..(s as usize + 1) * width];
                for (b, ((x, w), g)) in row.chunks(32).zip(want.chunks(32)).zip(g.chunks(32)).enumerate() {
                    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                    let step = amax / 127.0;
                    for e in 0..32 {
                        assert!(
                            (g[e] - w[e]).abs() <= step * 1.0001,
                            "row {t} block {b} value {e}: {} became {}, want {} (key {key}, kv_cache {from_backend})",
                            x[e],
                            g[e],
                            w[e]
                        );
                    }
                    if amax == 0.0 {
                        assert!(g.iter().all(|&v| v == 0.0), "zeros stay zeros");
                    } else {
                        let top = g.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                        assert!((top - amax).abs() <= amax * 1e-6, "block {b}: max {top} against {amax}");
                    }
                }
            }
        }
    }
}
