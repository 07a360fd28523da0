// cache_write.wgsl — copies the K and V of T new tokens into the paged cache
// (a template: `f16` renders the cache of packed halves).
//
// Bindings:
//   0 p:            Params (uniform)
//   1 qkv:          (T, qkv_stride) f32; K of token t at t*qkv_stride + k_off, V at + v_off
//   2 slot_mapping: (T) u32 physical slot = block * block_size + offset
//   3 k_cache:      (num_blocks * block_size, kv_width) f32 (read_write); with `f16`
//                   (num_blocks * block_size, kv_width / 2) u32, each two halves
//                   (element 2i in the low half, rounded to nearest even: half_pack.wgsl)
//   4 v_cache:      the same for V
// kv_width = kv_heads * head_dim (even with `f16`). Dispatch: (ceil(kv_width / 64), T, 1),
// with `f16` (ceil(kv_width / 2 / 64), T, 1). A copy (f16: each value rounded to
// a half), no reduction.

struct Params {
    t: u32,
    kv_width: u32,
    qkv_stride: u32,
    k_off: u32,
    v_off: u32,
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(2) var<storage, read> slot_mapping: array<u32>;
{% if f16 %}
{% include "half_pack.wgsl" %}
@group(0) @binding(3) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(4) var<storage, read_write> v_cache: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.y;
    let e = gid.x;
    if (t >= p.t || e >= p.kv_width / 2u) { return; }
    let dst = slot_mapping[t] * (p.kv_width / 2u) + e;
    let k = t * p.qkv_stride + p.k_off + 2u * e;
    let v = t * p.qkv_stride + p.v_off + 2u * e;
    k_cache[dst] = pack_halves(qkv[k], qkv[k + 1u]);
    v_cache[dst] = pack_halves(qkv[v], qkv[v + 1u]);
}
{% else %}
@group(0) @binding(3) var<storage, read_write> k_cache: array<f32>;
@group(0) @binding(4) var<storage, read_write> v_cache: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.y;
    let e = gid.x;
    if (t >= p.t || e >= p.kv_width) { return; }
    let dst = slot_mapping[t] * p.kv_width + e;
    k_cache[dst] = qkv[t * p.qkv_stride + p.k_off + e];
    v_cache[dst] = qkv[t * p.qkv_stride + p.v_off + e];
}
{% endif %}
