// cache_write_tex.wgsl — cache_write.wgsl for a paged cache held as textures
// (a template: `f16` writes rg32uint texels of four packed halves, half_pack.wgsl)
// (src/backend/wgsl/kv_tex.rs): copies the K and V of T new tokens, a texel
// (4 floats) per invocation, to slot slot_mapping[t] (texel row
// slot % SLOTS_PER_LAYER of layer slot / SLOTS_PER_LAYER).
//
// Bindings:
//   0 p:            Params (uniform)
//   1 qkv:          (T, qkv_stride) f32; K of token t at t*qkv_stride + k_off, V at + v_off
//   2 slot_mapping: (T) u32 physical slot = block * block_size + offset
//   3 k_tex:        rgba32float (f16: rg32uint) array texture, kv_width / 4 texels a slot (written)
//   4 v_tex:        the same for V
// kv_width = kv_heads * head_dim (a multiple of 8). Dispatch: (ceil(kv_width / 4 / 64), T, 1).
// A copy, no reduction.

struct Params {
    t: u32,
    kv_width: u32,
    qkv_stride: u32,
    k_off: u32,
    v_off: u32,
    slots_per_layer: u32,
    _p1: u32,
    _p2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(2) var<storage, read> slot_mapping: array<u32>;
@group(0) @binding(3) var k_tex: texture_storage_2d_array<{{ kv_texel }}, write>;
@group(0) @binding(4) var v_tex: texture_storage_2d_array<{{ kv_texel }}, write>;

{% if f16 %}
{% include "half_pack.wgsl" %}
// Four values as one texel of packed halves.
fn row4(at: u32) -> vec4<u32> {
    return vec4<u32>(pack_halves(qkv[at], qkv[at + 1u]), pack_halves(qkv[at + 2u], qkv[at + 3u]), 0u, 0u);
}
{% else %}
fn row4(at: u32) -> vec4<f32> {
    return vec4<f32>(qkv[at], qkv[at + 1u], qkv[at + 2u], qkv[at + 3u]);
}
{% endif %}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.y;
    let e = gid.x;
    if (t >= p.t || e >= p.kv_width / 4u) { return; }
    let slot = slot_mapping[t];
    let at = vec2<u32>(e, slot % p.slots_per_layer);
    let layer = slot / p.slots_per_layer;
    textureStore(k_tex, at, layer, row4(t * p.qkv_stride + p.k_off + 4u * e));
    textureStore(v_tex, at, layer, row4(t * p.qkv_stride + p.v_off + 4u * e));
}
