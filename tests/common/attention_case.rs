//! The attention case of `backend_ops`: sequences of awkward lengths in
//! scrambled blocks, written by cache_write from a fused qkv, then every key
//! position of every sequence queries through paged_attention (GQA).

use wllm::backend::{Backend, KvDtype, PagedKv, Rows};

use super::reference::cpu_attention_capped;
use super::{rand_vec, rng};

const ATT_SEQS: [usize; 3] = [1, 9, 23]; // keys per sequence
const ATT: (usize, usize, usize, usize) = (4, 2, 64, 4); // heads, kv_heads, head_dim, block_size

fn up<B: Backend, T: bytemuck::Pod>(b: &B, v: &[T]) -> B::Buffer {
    b.upload(bytemuck::cast_slice(v), "test").expect("upload")
}

fn zeros<B: Backend>(b: &B, n: usize) -> B::Buffer {
    b.zeros((n * 4) as u64).expect("zeros")
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

pub fn run_attention<B: Backend>(b: &B) -> Vec<f32> {
    run_attention_with(b, 0, 0.0, KvDtype::F32, false)
}

pub fn reference_attention() -> Vec<f32> {
    reference_attention_with(0, 0.0, KvDtype::F32)
}

/// The attention case under a sliding `window` (0: none) with scores
/// soft-capped at `softcap` (0: none), the caches of `dtype`: plain zeroed
/// buffers, or made by `Backend::kv_cache` where `from_backend` (on wgpu's CPU
/// adapters: textures).
pub fn run_attention_with<B: Backend>(
    b: &B,
    window: u32,
    softcap: f32,
    dtype: KvDtype,
    from_backend: bool,
) -> Vec<f32> {
    let (heads, kvh, hd, bs) = ATT;
    let (qkv, pos, seq, slots, tables, max_blocks) = attention_data();
    let width = (heads + 2 * kvh) * hd;
    let t = pos.len();
    let (qb, pb, sb, slb, tb) = (up(b, &qkv), up(b, &pos), up(b, &seq), up(b, &slots), up(b, &tables));
    // The blocks in use are 0..16 of a pool of 40: the ops see only that prefix.
    let kv_rows = (16 * bs) as u32;
    let cache = || match from_backend {
        true => b
            .kv_cache((40 * bs) as u64, (kvh * hd) as u32, dtype)
            .expect("kv_cache"),
        false => b
            .zeros(40 * bs as u64 * dtype.row_bytes((kvh * hd) as u64))
            .expect("zeros"),
    };
    let (kc, vc, o) = (cache(), cache(), zeros(b, t * heads * hd));
    let mut s = b.begin();
    let kw = (kvh * hd) as u32;
    let qkv_rows = Rows::new(&qb, width);
    let (k_off, v_off) = ((heads * hd) as u32, ((heads + kvh) * hd) as u32);
    b.cache_write(
        &mut s, qkv_rows, k_off, v_off, kw, &slb, &kc, &vc, kv_rows, dtype, t as u32,
    )
    .unwrap();
    let kv = PagedKv {
        k_cache: &kc,
        v_cache: &vc,
        dtype,
        kv_heads: kvh as u32,
        head_dim: hd as u32,
        block_size: bs as u32,
        positions: &pb,
        token_seq: &sb,
        block_tables: &tb,
        max_blocks: max_blocks as u32,
        kv_rows,
        max_query_len: t as u32,
        window,
        scale: PagedKv::<()>::default_scale(hd as u32),
        softcap,
    };
    b.paged_attention(&mut s, &qb, width as u32, kv, heads as u32, t as u32, &o)
        .unwrap();
    let out = b.finish(s, &[(&o, (t * heads * hd * 4) as u64)]).expect("finish");
    bytemuck::pod_collect_to_vec(&out[0])
}

/// The reference of `run_attention_with`: K and V as the cache of `dtype`
/// holds them (`KvDtype::key_round_trip` and `round_trip`).
pub fn reference_attention_with(window: usize, softcap: f32, dtype: KvDtype) -> Vec<f32> {
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
            let row = |j: usize, off: usize| -> Vec<f32> {
                let r = &qkv[(starts[s as usize] + j) * width + off + g * hd..][..hd];
                // (head_dim 64: a head's row is whole q8_0 blocks; q8_0 keys
                // are rotated before they are quantised.)
                match off == heads * hd {
                    true => dtype.key_round_trip(r),
                    false => dtype.round_trip(r),
                }
            };
            let lo = if window > 0 {
                (p as usize + 1).saturating_sub(window)
            } else {
                0
            };
            let keys: Vec<Vec<f32>> = (lo..=p as usize).map(|j| row(j, heads * hd)).collect();
            let vals: Vec<Vec<f32>> = (lo..=p as usize).map(|j| row(j, (heads + kvh) * hd)).collect();
            out.extend(cpu_attention_capped(q, &keys, &vals, hd, softcap));
        }
    }
    out
}
