// attention_common.wgsl — what paged_attention.wgsl and
// paged_attention_blocked.wgsl share, included by both: the parameters, the
// bindings (described in paged_attention.wgsl's header), the shape constants
// and how a key's K and V rows are found in the paged cache. One definition,
// so the two kernels cannot disagree on a binding or a cache layout.

struct Params {
    t: u32,
    heads: u32,
    kv_heads: u32,
    q_stride: u32,
    block_size: u32,
    max_blocks: u32,
    scale: f32,
    touch_sink: u32, // always 0 (paged_attention_blocked.wgsl: touch loads)
    window: u32,     // sliding window (variants with `window`): keys lo_of(n) .. n-1
    softcap: f32,    // soft-cap (variants with `softcap`): softcap · tanh(score / softcap)
    _p0: u32,
    _p1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
{% if kv_tex %}
@group(0) @binding(2) var k_tex: texture_storage_2d_array<{{ kv_texel }}, read>;
@group(0) @binding(3) var v_tex: texture_storage_2d_array<{{ kv_texel }}, read>;
{% elif q8 %}
@group(0) @binding(2) var<storage, read> k_cache: array<u32>;
@group(0) @binding(3) var<storage, read> v_cache: array<u32>;
{% elif f16 %}
@group(0) @binding(2) var<storage, read> k_cache: array<vec2<u32>>;
@group(0) @binding(3) var<storage, read> v_cache: array<vec2<u32>>;
{% else %}
@group(0) @binding(2) var<storage, read> k_cache: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> v_cache: array<vec4<f32>>;
{% endif %}
@group(0) @binding(4) var<storage, read> positions: array<u32>;
@group(0) @binding(5) var<storage, read> token_seq: array<u32>;
@group(0) @binding(6) var<storage, read> block_tables: array<u32>;
@group(0) @binding(7) var<storage, read_write> out: array<f32>;

const NEG: f32 = -3.0e38;
const HD: u32 = {{ head_dim }}u;
const W: u32 = {{ w }}u;
const G: u32 = {{ g }}u;
const D4: u32 = {{ head_dim // 4 }}u;

// The first key a token with n keys attends to: n - window under a sliding
// window shorter than n, else 0 (variants without a window: always 0).
fn lo_of(n: u32) -> u32 {
{% if window %}
    if (n > p.window) { return n - p.window; }
{% endif %}
    return 0u;
}

// A key's score from its q·k: · scale, then, in variants with a soft-cap,
// softcap · tanh(score / softcap) (tanh through exp of a clamped argument:
// tanh(±10) is ±1 in f32).
fn score_of(dot: f32) -> f32 {
    let s = dot * p.scale;
{% if softcap %}
    let e = exp(2.0 * clamp(s / p.softcap, -10.0, 10.0));
    return p.softcap * (e - 1.0) / (e + 1.0);
{% else %}
    return s;
{% endif %}
}

// The cache slot of key j of the sequence whose block_tables row starts at `table`.
fn slot_of(table: u32, j: u32) -> u32 {
    let blk = block_tables[table + j / p.block_size];
    return blk * p.block_size + j % p.block_size;
}

// Texel i (4 floats) of KV head kvh's K / V row at `slot`.
{% if f16 %}
// Four packed halves (half_pack.wgsl's order) as floats: exact.
fn halves4(x: vec2<u32>) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(x.x), unpack2x16float(x.y));
}
{% endif %}
{% if kv_tex and f16 %}
fn k_at(slot: u32, kvh: u32, i: u32) -> vec4<f32> {
    return halves4(textureLoad(k_tex, vec2<u32>(kvh * D4 + i, slot % {{ slots_per_layer }}u), slot / {{ slots_per_layer }}u).xy);
}
fn v_at(slot: u32, kvh: u32, i: u32) -> vec4<f32> {
    return halves4(textureLoad(v_tex, vec2<u32>(kvh * D4 + i, slot % {{ slots_per_layer }}u), slot / {{ slots_per_layer }}u).xy);
}
{% elif kv_tex %}
fn k_at(slot: u32, kvh: u32, i: u32) -> vec4<f32> {
    return textureLoad(k_tex, vec2<u32>(kvh * D4 + i, slot % {{ slots_per_layer }}u), slot / {{ slots_per_layer }}u);
}
fn v_at(slot: u32, kvh: u32, i: u32) -> vec4<f32> {
    return textureLoad(v_tex, vec2<u32>(kvh * D4 + i, slot % {{ slots_per_layer }}u), slot / {{ slots_per_layer }}u);
}
{% elif q8 %}
// A q8_0 row (cache_write.wgsl): kv_width / 4 words of four int8 values, then
// an f32 scale per block of 32 (K blocks hold H·k: read with q_block's H·q / 32). Texel i of head kvh: word kvh·D4 + i, times
// its block's scale (a block never splits a texel: kv_width % 32 == 0).
fn q8x4(u: u32) -> vec4<f32> {
    return vec4<f32>(vec4<i32>(bitcast<i32>(u << 24u), bitcast<i32>(u << 16u), bitcast<i32>(u << 8u), bitcast<i32>(u)) >> vec4<u32>(24u));
}
fn q8_at(e: u32, slot: u32) -> vec2<u32> {
    let kw4 = p.kv_heads * D4;
    let row = slot * (kw4 + kw4 / 8u);
    return vec2<u32>(row + e, row + kw4 + e / 8u);
}
fn k_at(slot: u32, kvh: u32, i: u32) -> vec4<f32> {
    let a = q8_at(kvh * D4 + i, slot);
    return q8x4(k_cache[a.x]) * bitcast<f32>(k_cache[a.y]);
}
fn v_at(slot: u32, kvh: u32, i: u32) -> vec4<f32> {
    let a = q8_at(kvh * D4 + i, slot);
    return q8x4(v_cache[a.x]) * bitcast<f32>(v_cache[a.y]);
}
{% elif f16 %}
fn k_at(slot: u32, kvh: u32, i: u32) -> vec4<f32> {
    return halves4(k_cache[slot * p.kv_heads * D4 + kvh * D4 + i]);
}
fn v_at(slot: u32, kvh: u32, i: u32) -> vec4<f32> {
    return halves4(v_cache[slot * p.kv_heads * D4 + kvh * D4 + i]);
}
{% else %}
fn k_at(slot: u32, kvh: u32, i: u32) -> vec4<f32> {
    return k_cache[slot * p.kv_heads * D4 + kvh * D4 + i];
}
fn v_at(slot: u32, kvh: u32, i: u32) -> vec4<f32> {
    return v_cache[slot * p.kv_heads * D4 + kvh * D4 + i];
}
{% endif %}
// Texel i of the query head whose row starts at `base`.
fn q_at(base: u32, i: u32) -> vec4<f32> {
    return vec4<f32>(q[base + 4u * i], q[base + 4u * i + 1u], q[base + 4u * i + 2u], q[base + 4u * i + 3u]);
}
{% if q8 %}
// A q8_0 cache's K blocks hold H·k (cache_write.wgsl), H the 32×32
// Walsh–Hadamard matrix; the query is read through the same rotation, scaled
// by 1/32 (exact): (H q / 32) · (H k) = q · k, H being symmetric with
// H·H = 32·I. h4 is H's 4×4 factor within a texel; q_block the 8 texels of
// the block of 32 at `base` (H = H8 ⊗ H4: texels combined by a butterfly),
// once per query row rather than once per texel.
fn h4(v: vec4<f32>) -> vec4<f32> {
    let a = vec4<f32>(v.x + v.y, v.x - v.y, v.z + v.w, v.z - v.w);
    return vec4<f32>(a.x + a.z, a.y + a.w, a.x - a.z, a.y - a.w);
}
fn q_block(base: u32) -> array<vec4<f32>, 8> {
    var r: array<vec4<f32>, 8>;
    for (var j = 0u; j < 8u; j = j + 1u) { r[j] = h4(q_at(base, j)); }
    for (var s = 1u; s < 8u; s = s * 2u) {
        for (var j = 0u; j < 8u; j = j + 1u) {
            if ((j & s) == 0u) {
                let u = r[j];
                let w = r[j + s];
                r[j] = u + w;
                r[j + s] = u - w;
            }
        }
    }
    for (var j = 0u; j < 8u; j = j + 1u) { r[j] = r[j] * (1.0 / 32.0); }
    return r;
}
{% endif %}
{#
  kv_rows(slot, d4): the K and V rows of the key at `slot` into registers
  k0 .. k{d4-1} and v0 .. v{d4-1} (for the including template: `import` it).
#}
{% macro kv_rows(slot, d4) %}
{% for i in range(d4) %}
let k{{ i }} = k_at({{ slot }}, kvh, {{ i }}u);
{% endfor %}
{% for i in range(d4) %}
let v{{ i }} = v_at({{ slot }}, kvh, {{ i }}u);
{% endfor %}
{% endmacro %}
