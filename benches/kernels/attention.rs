//! The kernel bench's attention rows: `paged_attention` with the default
//! model's heads (9 query heads, 3 KV heads of 64) over a paged cache of
//! 16-token blocks as `Backend::kv_cache` makes it (textures on CPU
//! adapters), for a one-row decode at several context lengths and a
//! 512-token prefill chunk of one sequence. As in a step, the dispatches
//! walk 30 layers' caches in turn (the default model's layers: at 1024
//! tokens 47 MB of K and V, more than a CPU's last-level cache; one layer's
//! cache replayed alone stays in it and ran 2x faster on lavapipe). Each is
//! timed in three rounds, the fastest kept, as the gemm rows are. GB/s
//! counts the K and V rows each workgroup reads once (a decode reads every
//! key once a KV head; a prefill tile of 8 tokens its last token's keys);
//! GFLOP/s counts q·k and p·v, 4 · head_dim a (query head, key).

use wllm::backend::wgsl::{Kernels, PagedKv, roofs};
use wllm::backend::{Backend, KvDtype};

const HEADS: u32 = 9;
const KV_HEADS: u32 = 3;
const HEAD_DIM: u32 = 64;
const BLOCK: u32 = 16;
/// The default model's layers: each dispatch of a measurement reads the next one's cache.
const LAYERS: u32 = 30;

/// One attention row: what ran, seconds, bytes read, flops.
pub struct AttentionRow {
    pub what: String,
    pub secs: f64,
    pub bytes: f64,
    pub flops: f64,
}

/// `queries` tokens of one sequence at positions `first ..`, over the keys
/// up to each one's position; the cache (zeros: the speed does not depend
/// on the values) holds `first + queries` keys.
fn run(ks: &Kernels, what: String, first: u32, queries: u32) -> AttentionRow {
    let ctx = &ks.ctx;
    let keys = first + queries;
    let blocks = keys.div_ceil(BLOCK);
    let kv_w = KV_HEADS * HEAD_DIM;
    let rows = u64::from(LAYERS * blocks * BLOCK);
    let (kc, vc) = (
        ks.kv_cache(rows, kv_w, KvDtype::default()).expect("kv cache"),
        ks.kv_cache(rows, kv_w, KvDtype::default()).expect("kv cache"),
    );
    let u32s = |v: &[u32]| ctx.storage_buffer(bytemuck::cast_slice(v), "attention bench");
    // Layer l's blocks, in reverse order as a pool hands them out after churn.
    let tables: Vec<wgpu::Buffer> = (0..LAYERS)
        .map(|l| u32s(&(l * blocks..(l + 1) * blocks).rev().collect::<Vec<u32>>()))
        .collect();
    let pos: Vec<u32> = (first..keys).collect();
    let (pb, sb) = (u32s(&pos), u32s(&vec![0; queries as usize]));
    let q: Vec<f32> = (0..queries * HEADS * HEAD_DIM)
        .map(|i| ((i % 97) as f32 - 48.0) / 64.0)
        .collect();
    let qb = ctx.storage_buffer(bytemuck::cast_slice(&q), "attention bench q");
    let out = ks.scratch(u64::from(queries * HEADS * HEAD_DIM) * 4);
    let kv = |tb| PagedKv {
        k_cache: &kc,
        v_cache: &vc,
        dtype: KvDtype::default(),
        kv_heads: KV_HEADS,
        head_dim: HEAD_DIM,
        block_size: BLOCK,
        positions: &pb,
        token_seq: &sb,
        block_tables: tb,
        max_blocks: blocks,
        kv_rows: LAYERS * blocks * BLOCK,
        max_query_len: queries,
        window: 0,
        scale: wllm::backend::PagedKv::<()>::default_scale(HEAD_DIM),
        softcap: 0.0,
    };
    let (mut secs, mut layer) = (f64::INFINITY, 0);
    for _ in 0..3 {
        let s = roofs::time_reps(ctx, LAYERS as usize, |enc| {
            layer = (layer + 1) % tables.len();
            ks.paged_attention(enc, &qb, u32::MAX, kv(&tables[layer]), HEADS, queries, &out)
        })
        .expect("paged attention");
        secs = secs.min(s);
    }
    // Keys each query attends: its position + 1.
    let attended: f64 = (first..keys).map(|p| f64::from(p + 1)).sum();
    let row_bytes = f64::from(2 * kv_w * 4);
    // A decode's workgroups read every key once; a prefill tile of W tokens
    // shares each block's rows, so count the cache once a query tile (W = 8).
    let reads = if queries == 1 {
        attended
    } else {
        (first..keys).step_by(8).map(|p| f64::from(p + 8)).sum()
    };
    AttentionRow {
        what,
        secs,
        bytes: reads * row_bytes,
        flops: 4.0 * attended * f64::from(HEADS * HEAD_DIM),
    }
}

/// The rows: one-row decodes at 128, 1024 and 4096 tokens of context, and a
/// 512-token prefill chunk from position 0.
pub fn measure(ks: &Kernels) -> Vec<AttentionRow> {
    let mut rows: Vec<AttentionRow> = [128u32, 1024, 4096]
        .iter()
        .map(|&n| run(ks, format!("decode, 1 row, {n} tokens of context"), n - 1, 1))
        .collect();
    rows.push(run(ks, "prefill chunk of 512 tokens from position 0".into(), 0, 512));
    rows
}
