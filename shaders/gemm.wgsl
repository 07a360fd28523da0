// gemm.wgsl — Y[T,N] = X[T,K] · W[N,K]ᵀ  (weights as stored: one row per output)
//
// A template (rendered by src/backend/wgsl/gemm.rs) per weight format, register
// tile TM x TN, workgroup size WG, x layout and epilogue; template loops unroll
// the tile.
//
// Epilogue `silu` (gate and up in one launch): W's rows interleave gate and up
// (gate i at row 2i, up i at row 2i+1; TN is even, so both are in one
// invocation) and the kernel writes y[t, i] = silu(Y[t, 2i]) · Y[t, 2i+1],
// exactly as silu_mul.wgsl, instead of Y; p.n counts W's rows, y_off and
// y_stride are in y's (halved) columns.
//
// Epilogue `rope` (qkv, rope and the cache write in one launch): W is q, k, v
// stacked, its q and k rows ordered so that each rotated pair is two adjacent
// rows (rotate-half checkpoints: rows i and i + head_dim/2 of a head moved to
// 2i, 2i+1); the kernel rotates each q and k pair exactly as rope.wgsl, writes
// every column back to its place in the qkv row, and K and V also to the paged
// cache at slot_mapping[t] (as rope_cache_write.wgsl). Extra bindings: 5 pos,
// 6 table, 7 slot_mapping, 8 k_cache, 9 v_cache (one less each without
// scales). With `kv_tex` the caches are textures (src/backend/wgsl/kv_tex.rs)
// written a texel at a time: TN, W's row count and each window's first row are
// multiples of 8 there.
//
// Prologue `norm` (the rms_norm before the qkv and gate/up gemms): each x row
// is normalised as it is read, x̂ = x · g · inv with inv = 1 / sqrt(mean(x²) +
// eps) and g the norm weight (the last binding: a one-row texture where x is
// a texture, CPU adapters; a vec4 buffer where x is one, GPUs): the loop
// multiplies x by g as it loads it (the min term's Σ x·g an fma chain in lane order; pre-scaled x as x · (g · 2^-k))
// and sums x² from the same loads (one fma chain a row, in increasing k: the
// same for every tile), and inv scales each accumulator after it.
// Epilogue `residual` (the o and down gemms): y += Y.
// `x_lanes` (x a texture; CPU adapters): each lane fetches one of a block's
// eight x texels (texel 8b + lane & 7, float formats four chunks of 8 at a
// time with K a multiple of 32; the norm weight the same) and the lanes share them with subgroupBroadcast, one fetch where each
// lane made eight. Every lane runs every block (no early return: columns and
// rows are clamped and stores guarded), and the workgroup's lanes fill
// subgroups of at least 8 (Kernels::x_lanes). The values, and so the bits,
// are those of load_x8.
//
// Bindings:
//   0 p:      Params (uniform)
//   1 x:      (T, x_stride) f32, row t at x_off + t*x_stride; vec4<f32> when K % 8 == 0;
//             x_tex: the rows copied into a texture (rgba32float, a row per row)
//   2 w:      (N, K) weights in the layout of weights.wgsl; w_tex: the same as a
//             texture, a texel row per weight row (then 3 is the scales' texture)
//   3 scales: (N, K/32) f32 d, or vec2(d, m) for Q4_1 — quantised formats only;
//             as a texture, Q8_0 holds two blocks' d a texel (the loop
//             then steps two blocks, the second guarded for odd K/32)
//   4 y:      (T, y_stride) f32, row t at y_off + t*y_stride (read_write)
// Weights larger than one storage binding are bound window by window (rows
//   row0.., y_off advanced by row0), one dispatch each.
// Dispatch: workgroups (ceil(N / (TN*WG)), ceil((T - r0) / TM), 1); invocation
//   (gid.x, gid.y) computes the TM x TN output tile at rows r0 + gid.y*TM, columns
//   gid.x*TN (r0 > 0: the rows left after a pass of larger tiles).
// Reduction order (batch invariance): every output element is one f32
//   accumulator updated with fma in increasing k — floats: acc = fma(x_k, w_k, acc)
//   for k = 0..Kp (zero padding past K); quantised: per block b in order, the
//   four sub-blocks' sums c_s = fma(x_j, q_j, c_s) for j = 8s..8s+7 from
//   c_s = 0, s = (c_0 + c_1) + (c_2 + c_3), then acc = fma(d, s, acc)
//   (Q4_1 then acc = fma(m, Σx_j, acc), Σx_j summed left to right); Q8_16 does
//   the same per half of 16 (s = c_0 + c_1 and d0, m0, then Σx from 0 again,
//   s = c_2 + c_3 and d1, m1). Four chains, where one chain over 32 held a
//   lane's adds in line on CPU adapters (kernel bench, lavapipe, decode: Q4_1
//   576→49152 16.7-16.9 -> 19.6-19.8 G weights/s, 576→3072 9.7-10.4 ->
//   11.1-11.6; Q8_0 576→49152 15.1 -> 16.0). The order is
//   the same for every tile shape, so the decode (TM = 1) and prefill (TM > 1)
//   variants give the same bits for a row whatever T and the other rows are.

struct Params {
    t: u32,
    n: u32,
    k: u32,
    chunks: u32,   // floats: Kp / 8; quantised: K / 32
    x_stride: u32,
    y_stride: u32,
    x_off: u32,
    y_off: u32,
    w_row: u32,    // w array elements per weight row
    col0: u32,     // rope epilogue: W's first row in this dispatch (y_off excludes it)
    q_w: u32,      // rope epilogue: q columns (heads · head_dim), then kv_w K, kv_w V
    kv_w: u32,
    hd: u32,       // rope epilogue: head_dim, pairing (0 rotate-half, 1 adjacent), table rows
    pairing: u32,
    max_pos: u32,
    eps: f32,      // norm prologue: the rms_norm's epsilon
    r0: u32,       // the first row of this dispatch (rows r0 .. t)
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
{% include "weights.wgsl" %}
{% import "weights.wgsl" as weights %}
{% set lanes = ["a.x", "a.y", "a.z", "a.w", "b.x", "b.y", "b.z", "b.w"] %}
{% set with_min = format == "Q4_1" or format == "Q8_16" %}
{# Q4 and Q8_0 from textures (CPU adapters): x pre-scaled, nibbles and bytes masked in place (weights.wgsl). #}
{% set scaled = w_tex and format in ["Q4_0", "Q4_1", "Q8_0"] %}
{# `pairs` (from gemm.rs, weight::scale_pairs): scale textures of two blocks a texel. #}
{# Texels a weight unit takes (Q8 blocks and f32 chunks two, side by side in the lane-group layout). #}
{% set parts = 2 if format in ["Q8_0", "Q8_16", "F32"] else 1 %}
{% set wl = "wl * 2u" if parts == 2 else "wl" %}
{# x_lanes: the F8 of chunk 4b + sub from the texels the lanes fetched (lane l holds texel 8b + l). #}
{% macro bc8(v, sub) %}F8(subgroupBroadcast({{ v }}, {{ 2 * sub }}u), subgroupBroadcast({{ v }}, {{ 2 * sub + 1 }}u)){% endmacro %}
{# x_lanes: this lane's texel of the eight from texel `first` on, of the norm weight (gt) and each x row (xt{i}). #}
{% macro lane_texels(first, tm, norm) %}
  {% if norm %}
let gt = textureLoad(g_tex, vec2<u32>({{ first }} + (lane & 7u), 0u));
  {% endif %}
  {% for i in range(tm) %}
let xt{{ i }} = textureLoad(x_tex, vec2<u32>({{ first }} + (lane & 7u), r{{ i }}));
  {% endfor %}
{% endmacro %}
{% if x_tex %}
{# x copied into a texture (CPU adapters): r is the row, a texel holds 4 floats. #}
@group(0) @binding(1) var x_tex: texture_storage_2d<rgba32float, read>;
fn load_x8(r: u32, c: u32) -> F8 {
return F8(textureLoad(x_tex, vec2<u32>(2u * c, r)), textureLoad(x_tex, vec2<u32>(2u * c + 1u, r))); }
{% elif x_vec %}
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
fn load_x8(r: u32, c: u32) -> F8 { let i = (r >> 2u) + 2u * c; return F8(x[i], x[i + 1u]); }
{% else %}
@group(0) @binding(1) var<storage, read> x: array<f32>;
fn xs(r: u32, k: u32) -> f32 { return select(0.0, x[r + k], k < p.k); }
fn load_x8(r: u32, c: u32) -> F8 { let k = 8u * c;
return F8(vec4<f32>(xs(r, k), xs(r, k + 1u), xs(r, k + 2u), xs(r, k + 3u)),
vec4<f32>(xs(r, k + 4u), xs(r, k + 5u), xs(r, k + 6u), xs(r, k + 7u))); }
{% endif %}
{% if w_tex %}
{{ weights.tex_bindings(format, 2, scale_texel) -}}
{% else %}
{{ weights.bindings(load, 2) -}}
{% endif %}
@group(0) @binding({{ 4 if quantized else 3 }}) var<storage, read_write> y: array<f32>;
{% if rope %}
{% set b0 = 5 if quantized else 4 %}
@group(0) @binding({{ b0 }}) var<storage, read> pos: array<u32>;
@group(0) @binding({{ b0 + 1 }}) var<storage, read> table: array<vec2<f32>>;
@group(0) @binding({{ b0 + 2 }}) var<storage, read> slot_mapping: array<u32>;
{% if kv_tex %}
@group(0) @binding({{ b0 + 3 }}) var k_tex: texture_storage_2d_array<{{ kv_texel }}, write>;
@group(0) @binding({{ b0 + 4 }}) var v_tex: texture_storage_2d_array<{{ kv_texel }}, write>;
{% if kv_f16 %}
{% include "half_pack.wgsl" %}
// Four values as one texel of packed halves.
fn kv_texel(v: vec4<f32>) -> vec4<u32> {
    return vec4<u32>(pack_halves(v.x, v.y), pack_halves(v.z, v.w), 0u, 0u);
}
{% else %}
fn kv_texel(v: vec4<f32>) -> vec4<f32> { return v; }
{% endif %}
{% elif kv_f16 %}
// A buffer of packed halves: the epilogue writes the rotated row to y only and
// the host runs cache_write after it (a rotate-half pair's two values land in
// different words), so the caches are bound but not touched here.
@group(0) @binding({{ b0 + 3 }}) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding({{ b0 + 4 }}) var<storage, read_write> v_cache: array<u32>;
{% else %}
@group(0) @binding({{ b0 + 3 }}) var<storage, read_write> k_cache: array<f32>;
@group(0) @binding({{ b0 + 4 }}) var<storage, read_write> v_cache: array<f32>;
{% endif %}
// A rotated pair: its values and the qkv columns they belong at.
struct Pair {
    ca: u32,
    cb: u32,
    y0: f32,
    y1: f32,
}
// Rotates pair i of head h (W rows c, c + 1) from the row's cos/sin entries at
// table[tr..] (`tr`: min(pos[t], max_pos - 1) · head_dim/2). Callers find h
// and i: store_group once for its four pairs (on CPU adapters a vector integer
// division is eight scalar ones), rot_pair for its one.
fn rot_in_head(h: u32, i: u32, c: u32, tr: u32, a: f32, b: f32) -> Pair {
    var r = Pair(c, c + 1u, a, b);
    if (p.pairing == 0u) {
        r.ca = h * p.hd + i;
        r.cb = r.ca + p.hd / 2u;
    }
    let cs = table[tr + i];
    r.y0 = a * cs.x - b * cs.y;
    r.y1 = a * cs.y + b * cs.x;
    return r;
}
{% if kv_tex %}
// The four pairs at W rows c .. c + 7 (c a multiple of 8, all in one head) of
// row t (`tr` as rot_in_head takes it and `slot` = slot_mapping[t], both
// loaded once a row): rotated (q and k, the head
// and first pair index found once for the four) and stored in y as rot_pair
// does, and K and V also to the cache textures as two texels (four
// consecutive columns each: adjacent pairs in order, or, rotate-half, the
// four first halves and the four second halves).
fn store_group(t: u32, c: u32, tr: u32, slot: u32, a0: f32, a1: f32, a2: f32, a3: f32, a4: f32, a5: f32, a6: f32, a7: f32) {
    let qk = p.q_w + p.kv_w;
    var r0 = Pair(c, c + 1u, a0, a1);
    var r1 = Pair(c + 2u, c + 3u, a2, a3);
    var r2 = Pair(c + 4u, c + 5u, a4, a5);
    var r3 = Pair(c + 6u, c + 7u, a6, a7);
    if (c < qk) {
        let h = c / p.hd;
        let i = (c % p.hd) / 2u;
        r0 = rot_in_head(h, i, c, tr, a0, a1);
        r1 = rot_in_head(h, i + 1u, c + 2u, tr, a2, a3);
        r2 = rot_in_head(h, i + 2u, c + 4u, tr, a4, a5);
        r3 = rot_in_head(h, i + 3u, c + 6u, tr, a6, a7);
    }
    let o = p.y_off + t * p.y_stride;
    y[o + r0.ca] = r0.y0;
    y[o + r0.cb] = r0.y1;
    y[o + r1.ca] = r1.y0;
    y[o + r1.cb] = r1.y1;
    y[o + r2.ca] = r2.y0;
    y[o + r2.cb] = r2.y1;
    y[o + r3.ca] = r3.y0;
    y[o + r3.cb] = r3.y1;
    if (c < p.q_w) { return; }
    var lo = vec4<f32>(r0.y0, r1.y0, r2.y0, r3.y0);
    var hi = vec4<f32>(r0.y1, r1.y1, r2.y1, r3.y1);
    var c_hi = r0.cb;
    if (p.pairing == 1u || c >= qk) {
        lo = vec4<f32>(r0.y0, r0.y1, r1.y0, r1.y1);
        hi = vec4<f32>(r2.y0, r2.y1, r3.y0, r3.y1);
        c_hi = r0.ca + 4u;
    }
    let row = slot % {{ slots_per_layer }}u;
    let layer = slot / {{ slots_per_layer }}u;
    if (c >= qk) {
        textureStore(v_tex, vec2<u32>((r0.ca - qk) / 4u, row), layer, kv_texel(lo));
        textureStore(v_tex, vec2<u32>((c_hi - qk) / 4u, row), layer, kv_texel(hi));
    } else {
        textureStore(k_tex, vec2<u32>((r0.ca - p.q_w) / 4u, row), layer, kv_texel(lo));
        textureStore(k_tex, vec2<u32>((c_hi - p.q_w) / 4u, row), layer, kv_texel(hi));
    }
}
{% else %}
// Rotates (q and k columns) the pair at W rows c, c + 1 of row t and stores it in y.
fn rot_pair(t: u32, c: u32, a: f32, b: f32) -> Pair {
    var r = Pair(c, c + 1u, a, b);
    if (c < p.q_w + p.kv_w) {
        let tr = min(pos[t], p.max_pos - 1u) * (p.hd / 2u);
        r = rot_in_head(c / p.hd, (c % p.hd) / 2u, c, tr, a, b);
    }
    let o = p.y_off + t * p.y_stride;
    y[o + r.ca] = r.y0;
    y[o + r.cb] = r.y1;
    return r;
}
// rot_pair, and K and V also to the paged cache at slot_mapping[t] (f32
// caches; with `kv_f16` the host's cache_write copies them from y).
fn store_pair(t: u32, c: u32, a: f32, b: f32) {
    let r = rot_pair(t, c, a, b);
{% if kv_f16 %}
{% else %}
    let qk = p.q_w + p.kv_w;
    let slot = slot_mapping[t] * p.kv_w;
    if (c >= qk) {
        v_cache[slot + r.ca - qk] = r.y0;
        v_cache[slot + r.cb - qk] = r.y1;
    } else if (c >= p.q_w) {
        k_cache[slot + r.ca - p.q_w] = r.y0;
        k_cache[slot + r.cb - p.q_w] = r.y1;
    }
{% endif %}
}
{% endif %}
{% endif %}
{% if norm %}
{% if x_tex %}
@group(0) @binding({{ (4 if quantized else 3) + (6 if rope else 1) }}) var g_tex: texture_storage_2d<rgba32float, read>;
fn load_g8(c: u32) -> F8 {
return F8(textureLoad(g_tex, vec2<u32>(2u * c, 0u)), textureLoad(g_tex, vec2<u32>(2u * c + 1u, 0u))); }
{% else %}
{# x a buffer of vec4 rows (GPU shapes): the norm weight a buffer beside it. #}
@group(0) @binding({{ (4 if quantized else 3) + (6 if rope else 1) }}) var<storage, read> norm_w: array<vec4<f32>>;
fn load_g8(c: u32) -> F8 { return F8(norm_w[2u * c], norm_w[2u * c + 1u]); }
{% endif %}
fn mul8(x: F8, g: F8) -> F8 { return F8(x.a * g.a, x.b * g.b); }
// Σ x·g over the eight lanes, an fma chain in lane order.
fn dot8(x: F8, g: F8) -> f32 {
    var s = x.a.x * g.a.x;
    s = fma(x.a.y, g.a.y, s); s = fma(x.a.z, g.a.z, s); s = fma(x.a.w, g.a.w, s);
    s = fma(x.b.x, g.b.x, s); s = fma(x.b.y, g.b.y, s); s = fma(x.b.z, g.b.z, s);
    return fma(x.b.w, g.b.w, s);
}
// ss + Σ x² over the eight lanes, an fma chain in lane order.
fn sq8(x: F8, ss: f32) -> f32 {
    var s = fma(x.a.x, x.a.x, ss);
    s = fma(x.a.y, x.a.y, s); s = fma(x.a.z, x.a.z, s); s = fma(x.a.w, x.a.w, s);
    s = fma(x.b.x, x.b.x, s); s = fma(x.b.y, x.b.y, s); s = fma(x.b.z, x.b.z, s);
    return fma(x.b.w, x.b.w, s);
}
// 1 / sqrt(mean(x²) + eps) of a row from its Σx².
fn row_inv(ss: f32) -> f32 {
    return 1.0 / sqrt(ss / f32(p.k) + p.eps);
}
{% endif %}
@compute @workgroup_size({{ wg }})
fn main(@builtin(global_invocation_id) gid: vec3<u32>{% if x_lanes %}, @builtin(subgroup_invocation_id) lane: u32{% endif %}{% if w_tex %}, @builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>{% endif %}) {
let n0 = gid.x * {{ tn }}u; let t0 = p.r0 + gid.y * {{ tm }}u;
{% if not x_lanes %}
if (n0 >= p.n || t0 >= p.t) { return; }
{% endif %}
{% if w_tex %}
{# The lane-group layout (weights.wgsl): this lane's texel columns, its group's first texture row. #}
let wl = lid.x; let wy = wid.x * p.chunks;
{% endif %}
{% for i in range(tm) %}
  {% if x_tex %}
let r{{ i }} = min(t0 + {{ i }}u, p.t - 1u);
  {% else %}
let r{{ i }} = p.x_off + min(t0 + {{ i }}u, p.t - 1u) * p.x_stride;
  {% endif %}
{% endfor %}
{% if norm %}
  {% for i in range(tm) %}
var ss{{ i }} = 0.0;
  {% endfor %}
{% endif %}
{% for j in range(tn) %}
let c{{ j }} = min(n0 + {{ j }}u, p.n - 1u);
  {% for i in range(tm) %}
var a{{ i }}_{{ j }} = 0.0;
  {% endfor %}
{% endfor %}
{% if quantized %}
{# Quantised: per block b, s = Σ x·q from 0, then acc = fma(d, s, acc) (+ m·Σx for Q4_1).
   A block's x values (all four sub-blocks of every row) are made first, then the
   columns one at a time, each column's block loaded, reduced and folded into its
   accumulators before the next: only one column's block and sums are live at once
   (llvmpipe keeps every value of a lane in a vector register, and a tile's blocks
   all live at once spilled). Each accumulator sees the same operations in the
   same order as before, so the bits are those of the reduction order above. #}
{% set xname = "xq" if scaled else "x" %}
{# Scale pairs: in a decode tile one scale fetch a column serves blocks bp and bp + 1 (the second guarded:
   odd block counts); batched tiles step one block at a time, each fetching its pair texel: their
   unrolled body, TM rows of every column, twice over and split by the guard, ran 17-22 % slower
   (kernel bench, Q8_0 prefill, interleaved twice: 576→49152 59.6/60.5 -> 72.3/69.1 GFLOP/s, 576→960
   55.9/57.6 -> 68.5/69.4), while the decode lost 5-10 % without the pair step (576→49152). #}
{% set pair_steps = pairs and tm == 1 %}
{{ weights.block_loop(pair_steps, tn, wg) -}}
{% for half in range(2 if pair_steps else 1) %}
{{ weights.block_step(half) -}}
  {% if with_min %}
    {% for i in range(tm) %}
var xs{{ i }} = 0.0;
    {% endfor %}
  {% endif %}
  {% if x_lanes %}
{{ lane_texels("8u * b", tm, norm) -}}
  {% endif %}
  {% for sub in range(4) %}
    {% if norm %}
let g_{{ sub }} = {{ bc8("gt", sub) if x_lanes else "load_g8(4u * b + " ~ sub ~ "u)" }};
      {% if scaled %}
let gq_{{ sub }} = F8(g_{{ sub }}.a * {{ weights.x_scale(format, sub) }}, g_{{ sub }}.b * {{ weights.x_scale(format, sub) }});
      {% endif %}
    {% endif %}
    {% for i in range(tm) %}
      {% if norm %}
{# Normalised x: x·g (Σ of it for the min term: dot8), pre-scaled as x·(g·2^-k). #}
let xr{{ i }}_{{ sub }} = {{ bc8("xt" ~ i, sub) if x_lanes else "load_x8(r" ~ i ~ ", 4u * b + " ~ sub ~ "u)" }};
ss{{ i }} = sq8(xr{{ i }}_{{ sub }}, ss{{ i }});
        {% if with_min %}
xs{{ i }} = xs{{ i }} + dot8(xr{{ i }}_{{ sub }}, g_{{ sub }});
        {% endif %}
let {{ xname }}{{ i }}_{{ sub }} = mul8(xr{{ i }}_{{ sub }}, {{ "gq_" if scaled else "g_" }}{{ sub }});
      {% else %}
let x{{ i }}_{{ sub }} = {{ bc8("xt" ~ i, sub) if x_lanes else "load_x8(r" ~ i ~ ", 4u * b + " ~ sub ~ "u)" }};
        {% if with_min %}
xs{{ i }} = xs{{ i }} + {% for l in lanes %}x{{ i }}_{{ sub }}.{{ l }}{{ " + " if not loop.last }}{% endfor %};
        {% endif %}
        {% if scaled %}
let xq{{ i }}_{{ sub }} = F8(x{{ i }}_{{ sub }}.a * {{ weights.x_scale(format, sub) }}, x{{ i }}_{{ sub }}.b * {{ weights.x_scale(format, sub) }});
        {% endif %}
      {% endif %}
    {% endfor %}
    {% if format == "Q8_16" and sub == 1 %}
{# The first half's Σx, for its min; Σx restarts for the second. #}
      {% for i in range(tm) %}
let xs_lo{{ i }} = xs{{ i }};
xs{{ i }} = 0.0;
      {% endfor %}
    {% endif %}
  {% endfor %}
  {% for j in range(tn) %}
{
    {% if w_tex %}
{{ weights.load_block_lanes(format, j, wl, wg, parts, pairs, half, pair_steps) -}}
    {% else %}
{{ weights.load_block(load, j, "c" ~ j ~ " * p.chunks + b") -}}
    {% endif %}
    {% for i in range(tm) %}
var s{{ i }} = 0.0;
    {% endfor %}
    {% for sub in range(4) %}
let w_{{ sub }} = {{ weights.dq_sub_scaled(format, j, sub) if scaled else weights.dq_sub(format, j, sub, qbits) }};
      {% for i in range(tm) %}
var c{{ i }}_{{ sub }} = 0.0;
        {% for l in lanes %}
c{{ i }}_{{ sub }} = fma({{ xname }}{{ i }}_{{ sub }}.{{ l }}, w_{{ sub }}.{{ l }}, c{{ i }}_{{ sub }});
        {% endfor %}
        {% if sub == 1 or (sub == 3 and format == "Q8_16") %}
s{{ i }} = c{{ i }}_{{ sub - 1 }} + c{{ i }}_{{ sub }};
        {% elif sub == 3 %}
s{{ i }} = s{{ i }} + (c{{ i }}_2 + c{{ i }}_3);
        {% endif %}
      {% endfor %}
      {% if format == "Q8_16" and sub == 1 %}
{# First half: its scale and min (s is set anew from the second half's chains). #}
        {% for i in range(tm) %}
a{{ i }}_{{ j }} = fma(d{{ j }}.x, s{{ i }}, a{{ i }}_{{ j }}); a{{ i }}_{{ j }} = fma(d{{ j }}.y, xs_lo{{ i }}, a{{ i }}_{{ j }});
        {% endfor %}
      {% endif %}
    {% endfor %}
    {% for i in range(tm) %}
      {% if format == "Q8_16" %}
a{{ i }}_{{ j }} = fma(d{{ j }}.z, s{{ i }}, a{{ i }}_{{ j }}); a{{ i }}_{{ j }} = fma(d{{ j }}.w, xs{{ i }}, a{{ i }}_{{ j }});
      {% elif format == "Q4_1" %}
a{{ i }}_{{ j }} = fma(d{{ j }}.x, s{{ i }}, a{{ i }}_{{ j }}); a{{ i }}_{{ j }} = fma(d{{ j }}.y, xs{{ i }}, a{{ i }}_{{ j }});
      {% else %}
a{{ i }}_{{ j }} = fma(d{{ j }}, s{{ i }}, a{{ i }}_{{ j }});
      {% endif %}
    {% endfor %}
}
  {% endfor %}
}
{% endfor %}
}
{% else %}
{# Floats: acc = fma(x_k, w_k, acc) for k in increasing order, 8 at a time
   (x_lanes: four chunks a step, their x texels one a lane; K a multiple of 32). #}
{% set fsubs = 4 if x_lanes else 1 %}
for (var cb = 0u; cb < p.chunks; cb = cb + {{ fsubs }}u) {
  {% if x_lanes %}
{{ lane_texels("2u * cb", tm, norm) -}}
  {% endif %}
{% for sub in range(fsubs) %}
{
let c = cb + {{ sub }}u;
  {% if norm %}
let g = {{ bc8("gt", sub) if x_lanes else "load_g8(c)" }};
  {% endif %}
  {% for i in range(tm) %}
    {% if norm %}
let xr{{ i }} = {{ bc8("xt" ~ i, sub) if x_lanes else "load_x8(r" ~ i ~ ", c)" }};
ss{{ i }} = sq8(xr{{ i }}, ss{{ i }});
let x{{ i }} = mul8(xr{{ i }}, g);
    {% else %}
let x{{ i }} = {{ bc8("xt" ~ i, sub) if x_lanes else "load_x8(r" ~ i ~ ", c)" }};
    {% endif %}
  {% endfor %}
  {% for j in range(tn) %}
let w{{ j }} = {{ "load_w8t(" ~ wl ~ " + " ~ j * wg * parts ~ "u, " ~ wl ~ " + " ~ (j * wg * parts + 1) ~ "u, wy + c)" if w_tex else "load_w8(c" ~ j ~ " * p.w_row, c)" }};
    {% for i in range(tm) %}
      {% for l in lanes %}
a{{ i }}_{{ j }} = fma(x{{ i }}.{{ l }}, w{{ j }}.{{ l }}, a{{ i }}_{{ j }});
      {% endfor %}
    {% endfor %}
  {% endfor %}
}
{% endfor %}
}
{% endif %}
{% if norm %}
  {% for i in range(tm) %}
let inv{{ i }} = row_inv(ss{{ i }});
    {% for j in range(tn) %}
a{{ i }}_{{ j }} = a{{ i }}_{{ j }} * inv{{ i }};
    {% endfor %}
  {% endfor %}
{% endif %}
{% for i in range(tm) %}
  {% if rope and kv_tex %}
if (t0 + {{ i }}u < p.t) {
let tr{{ i }} = min(pos[t0 + {{ i }}u], p.max_pos - 1u) * (p.hd / 2u);
let slot{{ i }} = slot_mapping[t0 + {{ i }}u];
    {% for j in range(0, tn, 8) %}
if (n0 + {{ j }}u < p.n) { store_group(t0 + {{ i }}u, p.col0 + n0 + {{ j }}u, tr{{ i }}, slot{{ i }}{% for m in range(8) %}, a{{ i }}_{{ j + m }}{% endfor %}); }
    {% endfor %}
}
  {% elif rope %}
if (t0 + {{ i }}u < p.t) {
    {% for j in range(0, tn, 2) %}
if (n0 + {{ j }}u < p.n) { store_pair(t0 + {{ i }}u, p.col0 + n0 + {{ j }}u, a{{ i }}_{{ j }}, a{{ i }}_{{ j + 1 }}); }
    {% endfor %}
}
  {% elif silu %}
if (t0 + {{ i }}u < p.t) { let o{{ i }} = p.y_off + (t0 + {{ i }}u) * p.y_stride + n0 / 2u;
    {% for j in range(0, tn, 2) %}
if (n0 + {{ j }}u < p.n) { let g = a{{ i }}_{{ j }}; y[o{{ i }} + {{ j // 2 }}u] = g / (1.0 + exp(-g)) * a{{ i }}_{{ j + 1 }}; }
    {% endfor %}
}
  {% else %}
if (t0 + {{ i }}u < p.t) { let o{{ i }} = p.y_off + (t0 + {{ i }}u) * p.y_stride + n0;
    {% for j in range(tn) %}
if (n0 + {{ j }}u < p.n) { y[o{{ i }} + {{ j }}u] = {{ "y[o" ~ i ~ " + " ~ j ~ "u] + " if residual }}a{{ i }}_{{ j }}; }
    {% endfor %}
}
  {% endif %}
{% endfor %}
}
