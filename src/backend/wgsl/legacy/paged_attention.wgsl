// paged_attention.wgsl — varlen causal attention over the paged KV cache. One
// launch serves prefill chunks and decodes of many sequences together.
// The entry point is generated (src/kernels/attention.rs) for a head_dim HD, W lanes
// and G query heads per workgroup, with q and the accumulators in vec4 registers.
//
// Bindings:
//   0 p:            Params (uniform)
//   1 q:            (T, q_stride) f32; query head h of token t at t*q_stride + h*HD (rope applied)
//   2 k_cache:      (num_blocks * block_size, kv_heads * HD) f32, read as vec4
//   3 v_cache:      (num_blocks * block_size, kv_heads * HD) f32, read as vec4
//   4 positions:    (T) u32; token t attends to positions 0..=positions[t] of its sequence
//   5 token_seq:    (T) u32 row of block_tables that holds token t's sequence
//   6 block_tables: (S, max_blocks) u32 logical block -> physical block
//   7 out:          (T, heads * HD) f32
// GQA: query head h reads KV head h / (heads / kv_heads); a workgroup serves G
//   consecutive query heads of one KV head (G divides heads / kv_heads), so each
//   K/V row it loads serves G heads.
// Dispatch: (heads / G, T, 1) workgroups of W lanes; one workgroup per (head group, token).
// Reduction order (batch invariance): lane l visits keys j = l, l+W, l+2W, … in
//   increasing j with an online softmax (running max m, sum s, acc[HD]); scores are
//   fma-dot products over d in increasing order. Lanes are then merged in lane
//   order 0..W-1. The order depends only on the key count, never on T, on the
//   other sequences, on chunking, or on which blocks hold the keys.

struct Params {
    t: u32,
    heads: u32,
    kv_heads: u32,
    q_stride: u32,
    block_size: u32,
    max_blocks: u32,
    scale: f32,
    _p0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k_cache: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> v_cache: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> positions: array<u32>;
@group(0) @binding(5) var<storage, read> token_seq: array<u32>;
@group(0) @binding(6) var<storage, read> block_tables: array<u32>;
@group(0) @binding(7) var<storage, read_write> out: array<f32>;

const NEG: f32 = -3.0e38;
