// rope_cache_write.wgsl — rope and cache_write in one launch: rotates, in place,
// the q heads and k heads of each fused qkv row (exactly as rope.wgsl), and
// copies the rotated K and the row's V to the paged cache at slot_mapping[t]
// (as cache_write.wgsl).
//
// Bindings:
//   0 p:            Params (uniform)
//   1 pos:          (T) u32 position of each token
//   2 table:        (max_pos, head_dim/2) vec2<f32> (cos, sin), as rope.wgsl
//   3 slot_mapping: (T) u32 physical slot = block * block_size + offset
//   4 qkv:          (T, stride) f32: q_heads heads, kv_heads K heads, kv_heads V heads (read_write)
//   5 k_cache:      (num_blocks * block_size, kv_heads * head_dim) f32 (read_write)
//   6 v_cache:      (num_blocks * block_size, kv_heads * head_dim) f32 (read_write)
// Pairing p.pairing as rope.wgsl: 0 = rotate-half (i, i + head_dim/2), 1 = adjacent (2i, 2i+1).
// Dispatch: (ceil((q_heads + kv_heads) · head_dim/2 / 64), T, 1); one invocation per
//   rotated pair; invocation e < kv_heads · head_dim / 2 also copies V elements 2e, 2e+1.
// No reduction: every element depends only on its own pair and position.

struct Params {
    t: u32,
    q_heads: u32,
    kv_heads: u32,
    head_dim: u32,
    stride: u32,
    pairing: u32,
    max_pos: u32,
    _p0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> pos: array<u32>;
@group(0) @binding(2) var<storage, read> table: array<vec2<f32>>;
@group(0) @binding(3) var<storage, read> slot_mapping: array<u32>;
@group(0) @binding(4) var<storage, read_write> qkv: array<f32>;
@group(0) @binding(5) var<storage, read_write> k_cache: array<f32>;
@group(0) @binding(6) var<storage, read_write> v_cache: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let half_d = p.head_dim / 2u;
    let t = gid.y;
    let heads = p.q_heads + p.kv_heads;
    if (t >= p.t || gid.x >= heads * half_d) { return; }
    let h = gid.x / half_d;
    let i = gid.x % half_d;
    let cs = table[min(pos[t], p.max_pos - 1u) * half_d + i];
    let row = t * p.stride;
    var a = h * p.head_dim + i;
    var b = a + half_d;
    if (p.pairing == 1u) {
        a = h * p.head_dim + 2u * i;
        b = a + 1u;
    }
    let x0 = qkv[row + a];
    let x1 = qkv[row + b];
    let y0 = x0 * cs.x - x1 * cs.y;
    let y1 = x0 * cs.y + x1 * cs.x;
    qkv[row + a] = y0;
    qkv[row + b] = y1;
    let kv_width = p.kv_heads * p.head_dim;
    let slot = slot_mapping[t] * kv_width;
    if (h >= p.q_heads) {
        let k0 = p.q_heads * p.head_dim;
        k_cache[slot + a - k0] = y0;
        k_cache[slot + b - k0] = y1;
    }
    if (gid.x < kv_width / 2u) {
        let v = row + heads * p.head_dim + 2u * gid.x;
        v_cache[slot + 2u * gid.x] = qkv[v];
        v_cache[slot + 2u * gid.x + 1u] = qkv[v + 1u];
    }
}
