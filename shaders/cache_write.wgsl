// cache_write.wgsl — copies the K and V of T new tokens into the paged cache
// (a template: `f16` renders the cache of packed halves, `q8` the q8_0 cache).
//
// Bindings:
//   0 p:            Params (uniform)
//   1 qkv:          (T, qkv_stride) f32; K of token t at t*qkv_stride + k_off, V at + v_off
//   2 slot_mapping: (T) u32 physical slot = block * block_size + offset
//   3 k_cache:      (num_blocks * block_size, kv_width) f32 (read_write); with `f16`
//                   (num_blocks * block_size, kv_width / 2) u32, each two halves
//                   (element 2i in the low half, rounded to nearest even: half_pack.wgsl)
//                   With `q8`: rows of kv_width / 4 + kv_width / 32 u32: first
//                   the values as int8, four a word (element 4w + j in byte j),
//                   then each block of 32 values' scale d (f32 bits).
//   4 v_cache:      the same for V
// kv_width = kv_heads * head_dim (even with `f16`, a multiple of 32 with `q8`).
// Dispatch: (ceil(kv_width / 64), T, 1), with `f16` (ceil(kv_width / 2 / 64), T, 1),
// with `q8` (ceil(kv_width / 32 / 64), T, 1): an invocation a block of 32. A copy
// (f16: each value rounded to a half), no reduction; q8: d = amax / 127 over
// the block, each value round(x · 127 / amax) (half away from zero), as
// llama.cpp's q8_0 and `KvDtype::round_trip`. A K block is first rotated by
// the 32×32 Walsh–Hadamard matrix H (y_i = Σ_m (−1)^popcount(i & m) x_m, m
// ascending: `KvDtype::rotate_block`): a channel far larger than the others
// (keys have them) spreads over the block instead of widening the step of the
// 31 small values, and attention reads the keys through H·q / 32
// (attention_common.wgsl's q_block), so q · k is unchanged. The engine allows
// q8_0 only where head_dim is a multiple of 32 (a block never spans two heads).

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
{% if q8 %}
@group(0) @binding(3) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(4) var<storage, read_write> v_cache: array<u32>;

// The sign of the Walsh–Hadamard matrix's entry (i, m): (−1)^popcount(i & m).
fn hsign(im: u32) -> f32 { return 1.0 - 2.0 * f32(countOneBits(im) & 1u); }

// Block b of token t's row at `off` in qkv, quantised into `cache` row `row`.
{% macro q8_block(cache, off, rotate) %}
    {
        let src = t * p.qkv_stride + {{ off }} + 32u * b;
        var x: array<f32, 32>;
        for (var i = 0u; i < 32u; i = i + 1u) {
{% if rotate %}
            var y = 0.0;
            for (var m = 0u; m < 32u; m = m + 1u) { y = y + hsign(i & m) * qkv[src + m]; }
            x[i] = y;
{% else %}
            x[i] = qkv[src + i];
{% endif %}
        }
        var amax = 0.0;
        for (var i = 0u; i < 32u; i = i + 1u) { amax = max(amax, abs(x[i])); }
        let id = select(0.0, 127.0 / amax, amax > 0.0);
        for (var w = 0u; w < 8u; w = w + 1u) {
            var word = 0u;
            for (var j = 0u; j < 4u; j = j + 1u) {
                let v = x[4u * w + j] * id;
                let q = i32(clamp(sign(v) * floor(abs(v) + 0.5), -127.0, 127.0));
                word = word | ((bitcast<u32>(q) & 0xffu) << (8u * j));
            }
            {{ cache }}[row + 8u * b + w] = word;
        }
        {{ cache }}[row + p.kv_width / 4u + b] = bitcast<u32>(amax / 127.0);
    }
{% endmacro %}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.y;
    let b = gid.x;
    if (t >= p.t || b >= p.kv_width / 32u) { return; }
    let row = slot_mapping[t] * (p.kv_width / 4u + p.kv_width / 32u);
{{ q8_block("k_cache", "p.k_off", true) }}
{{ q8_block("v_cache", "p.v_off", false) }}
}
{% elif f16 %}
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
