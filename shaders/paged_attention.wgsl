// paged_attention.wgsl — varlen causal attention over the paged KV cache. One
// launch serves prefill chunks and decodes of many sequences together.
// Prefixed by the host with `const HD: u32` (head_dim) and `const W: u32` (lanes).
//
// Bindings:
//   0 p:            Params (uniform)
//   1 q:            (T, q_stride) f32; query head h of token t at t*q_stride + h*HD (rope applied)
//   2 k_cache:      (num_blocks * block_size, kv_heads * HD) f32
//   3 v_cache:      (num_blocks * block_size, kv_heads * HD) f32
//   4 positions:    (T) u32; token t attends to positions 0..=positions[t] of its sequence
//   5 token_seq:    (T) u32 row of block_tables that holds token t's sequence
//   6 block_tables: (S, max_blocks) u32 logical block -> physical block
//   7 out:          (T, heads * HD) f32
// GQA: query head h reads KV head h / (heads / kv_heads).
// Dispatch: (heads, T, 1) workgroups of W lanes; one workgroup per (head, token).
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
@group(0) @binding(2) var<storage, read> k_cache: array<f32>;
@group(0) @binding(3) var<storage, read> v_cache: array<f32>;
@group(0) @binding(4) var<storage, read> positions: array<u32>;
@group(0) @binding(5) var<storage, read> token_seq: array<u32>;
@group(0) @binding(6) var<storage, read> block_tables: array<u32>;
@group(0) @binding(7) var<storage, read_write> out: array<f32>;

const NEG: f32 = -3.0e38;

var<workgroup> lane_m: array<f32, W>;
var<workgroup> lane_s: array<f32, W>;
var<workgroup> lane_acc: array<f32, W * HD>;

@compute @workgroup_size(W)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let h = wid.x;
    let t = wid.y;
    let l = lid.x;
    let kvh = h / (p.heads / p.kv_heads);
    let kv_width = p.kv_heads * HD;
    let n_keys = positions[t] + 1u;
    let table = token_seq[t] * p.max_blocks;

    var qv: array<f32, HD>;
    for (var d = 0u; d < HD; d = d + 1u) {
        qv[d] = q[t * p.q_stride + h * HD + d];
    }
    var acc: array<f32, HD>;
    var m = NEG;
    var s = 0.0;
    for (var j = l; j < n_keys; j = j + W) {
        let blk = block_tables[table + j / p.block_size];
        let base = (blk * p.block_size + j % p.block_size) * kv_width + kvh * HD;
        var dot = 0.0;
        for (var d = 0u; d < HD; d = d + 1u) {
            dot = fma(qv[d], k_cache[base + d], dot);
        }
        let score = dot * p.scale;
        let m_new = max(m, score);
        let corr = exp(m - m_new);
        let e = exp(score - m_new);
        s = fma(s, corr, e);
        for (var d = 0u; d < HD; d = d + 1u) {
            acc[d] = fma(acc[d], corr, e * v_cache[base + d]);
        }
        m = m_new;
    }
    lane_m[l] = m;
    lane_s[l] = s;
    for (var d = 0u; d < HD; d = d + 1u) {
        lane_acc[l * HD + d] = acc[d];
    }
    workgroupBarrier();
    var mx = NEG;
    for (var i = 0u; i < W; i = i + 1u) {
        mx = max(mx, lane_m[i]);
    }
    var total = 0.0;
    for (var i = 0u; i < W; i = i + 1u) {
        total = fma(lane_s[i], exp(lane_m[i] - mx), total);
    }
    for (var d = l; d < HD; d = d + W) {
        var o = 0.0;
        for (var i = 0u; i < W; i = i + 1u) {
            o = fma(lane_acc[i * HD + d], exp(lane_m[i] - mx), o);
        }
        out[t * p.heads * HD + h * HD + d] = o / total;
    }
}
