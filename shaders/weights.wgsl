// weights.wgsl — shared helpers for kernels that read weight matrices
// (`gemm`, `embed`), included by their templates; the macros at the end are
// the template side of the same layouts.
//
// An `F8` is eight consecutive elements along K: `a` = k..k+3, `b` = k+4..k+7.
// Weight layouts (see src/quant.rs): f32 rows of Kp floats as vec4<f32>;
// f16/bf16 rows of Kp halves, eight per vec4<u32>; quantised blocks of 32 as
// the block's stored bytes (Q8_0 and Q8_16: 32 i8 in two vec4<u32>, Q4_0/Q4_1:
// 32 nibbles in one vec4<u32>); scales per block: d (Q8_0, Q4_0), vec2(d, m)
// (Q4_1), vec4(d0, m0, d1, m1) for the two halves of 16 (Q8_16).

struct F8 {
    a: vec4<f32>,
    b: vec4<f32>,
}

fn dq_f16(q: vec4<u32>) -> F8 {
    return F8(vec4<f32>(unpack2x16float(q.x), unpack2x16float(q.y)),
              vec4<f32>(unpack2x16float(q.z), unpack2x16float(q.w)));
}

fn bf2(u: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(u << 16u), bitcast<f32>(u & 0xffff0000u));
}

fn dq_bf16(q: vec4<u32>) -> F8 {
    return F8(vec4<f32>(bf2(q.x), bf2(q.y)), vec4<f32>(bf2(q.z), bf2(q.w)));
}

fn i8x4(u: u32) -> vec4<f32> {
    let s = bitcast<i32>(u);
    return vec4<f32>(f32(extractBits(s, 0u, 8u)), f32(extractBits(s, 8u, 8u)),
                     f32(extractBits(s, 16u, 8u)), f32(extractBits(s, 24u, 8u)));
}

// Q8_0: elements 8s..8s+7 of a block are bytes of words 2s and 2s+1.
fn dq_q8(w0: u32, w1: u32) -> F8 {
    return F8(i8x4(w0), i8x4(w1));
}

// The same for bytes holding `bits`-bit two's complement values (the
// narrow layouts' signed types), sign-extended as they are extracted.
fn inx4(u: u32, bits: u32) -> vec4<f32> {
    let s = bitcast<i32>(u);
    return vec4<f32>(f32(extractBits(s, 0u, bits)), f32(extractBits(s, 8u, bits)),
                     f32(extractBits(s, 16u, bits)), f32(extractBits(s, 24u, bits)));
}
fn dq_qn(w0: u32, w1: u32, bits: u32) -> F8 {
    return F8(inx4(w0, bits), inx4(w1, bits));
}

fn u4x4(u: u32, sh: u32) -> vec4<f32> {
    return vec4<f32>(f32((u >> sh) & 15u), f32((u >> (sh + 8u)) & 15u),
                     f32((u >> (sh + 16u)) & 15u), f32((u >> (sh + 24u)) & 15u));
}

// Q4_0 / Q4_1: element j < 16 is the low nibble of byte j, element j + 16 the
// high nibble. Sub-block s (elements 8s..8s+7) = words (2s mod 4, +1), shift 0
// for s < 2 and 4 for s >= 2. `off` is 8 for Q4_0 and 0 for Q4_1.
fn dq_q4(w0: u32, w1: u32, sh: u32, off: f32) -> F8 {
    return F8(u4x4(w0, sh) - off, u4x4(w1, sh) - off);
}
// Q4 with x pre-scaled (CPU adapters, where a shift is one more op per
// weight): nibble k of a word is masked in place, f32(u & (15 << 4k)) =
// n · 2^4k exactly, and x is multiplied by 2^-4k beforehand, so each
// fma(x · 2^-4k, n · 2^4k, s) equals fma(x, n, s) bit for bit (x normal).
// The top nibble is shifted down (a mask would need an unsigned convert).
// Sub-blocks 0, 1 take the low nibbles (lo), 2, 3 the high ones (hi).
const Q4_X_LO = vec4<f32>(1.0, 0.00390625, 1.52587890625e-05, 5.9604644775390625e-08);
const Q4_X_HI = vec4<f32>(0.0625, 0.000244140625, 9.5367431640625e-07, 1.0);
// Q4_0's offset 8 at the same powers of two.
const Q4_OFF_LO = vec4<f32>(8.0, 2048.0, 524288.0, 134217728.0);
const Q4_OFF_HI = vec4<f32>(128.0, 32768.0, 8388608.0, 8.0);

// Q8_0 the same way: each byte moved to the top of the word, f32 of it =
// b · 2^24 exactly, against x · 2^-24.
const Q8_X = vec4<f32>(5.9604644775390625e-08);

fn i8m(u: u32) -> vec4<f32> {
    return vec4<f32>(f32(bitcast<i32>(u << 24u)), f32(bitcast<i32>((u << 16u) & 0xff000000u)),
                     f32(bitcast<i32>((u << 8u) & 0xff000000u)), f32(bitcast<i32>(u & 0xff000000u)));
}

fn q4m_lo(u: u32) -> vec4<f32> {
    return vec4<f32>(f32(bitcast<i32>(u & 0xfu)), f32(bitcast<i32>(u & 0xf00u)),
                     f32(bitcast<i32>(u & 0xf0000u)), f32(bitcast<i32>(u & 0xf000000u)));
}

fn q4m_hi(u: u32) -> vec4<f32> {
    return vec4<f32>(f32(bitcast<i32>(u & 0xf0u)), f32(bitcast<i32>(u & 0xf000u)),
                     f32(bitcast<i32>(u & 0xf00000u)), f32(u >> 28u));
}
// The narrow layouts (src/quant/planes.rs): bit planes rebuilt into the
// wide layouts' words, four elements a word, one a byte. Nibble plane: low
// nibbles of elements 0..15, high ones of 16..31; 2-bit plane word: elements
// 4g..4g+3 at shift 2g; 1-bit plane: elements 4g..4g+3 at shift g.
fn pl_nib_lo(n: vec4<u32>) -> vec4<u32> { return n & vec4<u32>(0x0f0f0f0fu); }
fn pl_nib_hi(n: vec4<u32>) -> vec4<u32> { return (n >> vec4<u32>(4u)) & vec4<u32>(0x0f0f0f0fu); }
fn pl_b2(p: u32) -> vec4<u32> { return (vec4<u32>(p) >> vec4<u32>(0u, 2u, 4u, 6u)) & vec4<u32>(0x03030303u); }
fn pl_b1(h: u32, g0: u32) -> vec4<u32> {
    return (vec4<u32>(h) >> (vec4<u32>(0u, 1u, 2u, 3u) + vec4<u32>(g0))) & vec4<u32>(0x01010101u);
}
// The signed types' bytes (Q5_0P, Q3_KP, Q6_KP) hold their value bits
// alone; `dq_sub` with their `bits` sign-extends them (`dq_qn`).
// A half's bits (the low 16 of h) as f32, exactly, in integer ops (no
// driver's f16 conversion, which may flush subnormals): subnormals are
// m · 2^-24, normal in f32.
fn pl_h2f(h: u32) -> f32 {
    let s = (h & 0x8000u) << 16u; let e = (h >> 10u) & 31u; let m = h & 0x3ffu;
    if (e == 0u) { return bitcast<f32>(s | bitcast<u32>(f32(m) * 5.9604644775390625e-8)); }
    if (e == 31u) { return bitcast<f32>(s | 0x7f800000u | (m << 13u)); }
    return bitcast<f32>(s | ((e + 112u) << 23u) | (m << 13u));
}
{#
  Template side of the layouts above, for the kernels that include this file:
  `bindings` declares w (and scales) at `first` (and first + 1) with `load_w8`
  for float formats; `load_block` loads quantised block `blk` of column j into
  q{j} (qa{j}, qb{j} for Q8_0) and its scale into d{j}; `dq_sub` is the F8 of
  sub-block s (elements 8s..8s+7) of that block.
#}
{% macro scale_type(format) %}{{ "vec2<f32>" if format == "Q4_1" else "vec4<f32>" if format == "Q8_16" else "f32" }}{% endmacro %}
{% macro bindings(format, first) %}
{% if format == "F32" %}
@group(0) @binding({{ first }}) var<storage, read> w: array<vec4<f32>>;
fn load_w8(base: u32, c: u32) -> F8 { return F8(w[base + 2u * c], w[base + 2u * c + 1u]); }
{% elif format == "F16" or format == "Bf16" %}
@group(0) @binding({{ first }}) var<storage, read> w: array<vec4<u32>>;
fn load_w8(base: u32, c: u32) -> F8 { return dq_{{ format | lower }}(w[base + c]); }
{% elif format in ["Q4_1P", "Q5_0P", "Q5_1P", "Q2_KP", "Q3_KP", "Q4_KP", "Q5_KP", "Q6_KP"] %}
  {% if format == "Q4_KP" or format == "Q4_1P" %}
{# Four words a block: a vec4 each, as Q4_1's (one load, not four). #}
@group(0) @binding({{ first }}) var<storage, read> w: array<vec4<u32>>;
  {% else %}
@group(0) @binding({{ first }}) var<storage, read> w: array<u32>;
fn pl_w4(b: u32) -> vec4<u32> { return vec4<u32>(w[b], w[b + 1u], w[b + 2u], w[b + 3u]); }
  {% endif %}
@group(0) @binding({{ first + 1 }}) var<storage, read> scales: array<{{ "f32" if format == "Q5_0P" else "u32" }}>;
  {% if format == "Q4_1P" or format == "Q5_1P" %}
// Block blk's f16 d (low half) and m (high half).
fn pl_dm(blk: u32) -> vec2<f32> { let s = scales[blk]; return vec2<f32>(pl_h2f(s & 0xffffu), pl_h2f(s >> 16u)); }
  {% elif format != "Q5_0P" %}
// Block blk's two sub-scale bytes (halves, or scale and min) in the low 16
// bits, and its super-block's d and dmin (6 words a super-block of 8 blocks).
fn pl_super(blk: u32) -> vec2<f32> { let s = 6u * (blk / 8u); return vec2<f32>(bitcast<f32>(scales[s]), bitcast<f32>(scales[s + 1u])); }
fn pl_subs(blk: u32) -> u32 { return scales[6u * (blk / 8u) + 2u + (blk % 8u) / 2u] >> (16u * (blk % 2u)); }
  {% endif %}
  {% if format == "Q6_KP" or format == "Q3_KP" %}
// The mins are the stored dmin, 0.0 (a literal 0.0 would let the compiler
// drop the `+ m` and with it the sign of a zero the wide layout gives).
fn pl_factors(blk: u32) -> vec4<f32> {
    let dd = pl_super(blk); let s = bitcast<i32>(pl_subs(blk));
    return vec4<f32>(dd.x * f32(extractBits(s, 0u, 8u)), dd.y, dd.x * f32(extractBits(s, 8u, 8u)), dd.y);
}
  {% elif format == "Q2_KP" %}
fn pl_factors(blk: u32) -> vec4<f32> {
    let dd = pl_super(blk); let s = pl_subs(blk);
    return vec4<f32>(dd.x * f32(s & 15u), -(dd.y * f32((s >> 4u) & 15u)), dd.x * f32((s >> 8u) & 15u), -(dd.y * f32((s >> 12u) & 15u)));
}
  {% elif format == "Q5_KP" or format == "Q4_KP" %}
fn pl_factors(blk: u32) -> vec2<f32> {
    let dd = pl_super(blk); let s = pl_subs(blk);
    return vec2<f32>(dd.x * f32(s & 255u), -(dd.y * f32((s >> 8u) & 255u)));
}
  {% endif %}
{% else %}
@group(0) @binding({{ first }}) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding({{ first + 1 }}) var<storage, read> scales: array<{{ scale_type(format) }}>;
{% endif %}
{% endmacro %}
{#
  The same layouts read from read-only storage textures (CPU adapters:
  llvmpipe loads a texel for eight lanes at once, a storage element lane by
  lane, and a sampled texel through a function call), in the lane-group
  layout of src/backend/wgsl/weight.rs (`WeightTex`): texture row
  `g·units + u` holds unit u (block or chunk) of the group's rows, row
  `l·tn + j` of the group at texel `(j·wg + l)·parts + p` for the unit's texel p;
  `s_tex` the scales the same, a texel per block (rg32float for Q4_1,
  rgba32float for Q8_16, r32float for Q4_0), or for Q8_0 a texel per two blocks
  (rg32float: d0, d1). The callers give texel columns `x0` (p = 0) and `x1`
  (p = 1) and the texture row `y`: `tex_bindings` declares them (the scales'
  texel format `scale_texel` given by src/backend/wgsl/weight.rs, `scale_binding`) with
  `load_w8t(x0, x1, y)` for float formats; `load_block_tex` is `load_block`
  for the unit at row `y`, its scale at `sc` (a vec2<u32>).
#}
{% macro tex_bindings(format, first, scale_texel) %}
@group(0) @binding({{ first }}) var w_tex: texture_storage_2d<rgba32uint, read>;
{% if format == "F32" %}
fn load_w8t(x0: u32, x1: u32, y: u32) -> F8 {
    return F8(bitcast<vec4<f32>>(textureLoad(w_tex, vec2<u32>(x0, y))),
              bitcast<vec4<f32>>(textureLoad(w_tex, vec2<u32>(x1, y))));
}
{% elif format == "F16" or format == "Bf16" %}
fn load_w8t(x0: u32, x1: u32, y: u32) -> F8 { return dq_{{ format | lower }}(textureLoad(w_tex, vec2<u32>(x0, y))); }
{% else %}
@group(0) @binding({{ first + 1 }}) var s_tex: texture_storage_2d<{{ scale_texel }}, read>;
{% endif %}
{% endmacro %}
{% macro load_block_tex(format, j, x0, x1, y, sc) %}
{% if format == "Q8_0" or format == "Q8_16" %}
let qa{{ j }} = textureLoad(w_tex, vec2<u32>({{ x0 }}, {{ y }})); let qb{{ j }} = textureLoad(w_tex, vec2<u32>({{ x1 }}, {{ y }})); let d{{ j }} = textureLoad(s_tex, {{ sc }}){{ "" if format == "Q8_16" else ".x" }};
{% else %}
let q{{ j }} = textureLoad(w_tex, vec2<u32>({{ x0 }}, {{ y }})); let d{{ j }} = textureLoad(s_tex, {{ sc }}).{{ "xy" if format == "Q4_1" else "x" }};
{% endif %}
{% endmacro %}
{#
  `load_block_tex` where a scale texel holds two blocks (Q8_0):
  the block's data, and its scale from the texel `dp` already fetched, the
  first (`half` 0) or second block of the pair, or (`half` -1) the one block
  b's parity picks.
#}
{% macro load_block_tex_paired(format, j, x0, x1, y, dp, half) %}
{% set d = dp ~ "." ~ "xy"[half] if half >= 0 else "select(" ~ dp ~ ".x, " ~ dp ~ ".y, (b & 1u) == 1u)" %}
{% if format == "Q8_0" %}
let qa{{ j }} = textureLoad(w_tex, vec2<u32>({{ x0 }}, {{ y }})); let qb{{ j }} = textureLoad(w_tex, vec2<u32>({{ x1 }}, {{ y }})); let d{{ j }} = {{ d }};
{% else %}
let q{{ j }} = textureLoad(w_tex, vec2<u32>({{ x0 }}, {{ y }})); let d{{ j }} = {{ d }};
{% endif %}
{% endmacro %}
{#
  The walk over a lane's blocks in the lane-group texture layout, shared by
  gemm.wgsl (w_tex) and bench/dequant_roof.wgsl, which must read as the gemm
  does: `block_loop` opens the loop over block steps bp (with scale `pairs`
  two blocks a step, each column's pair texel dp{j} fetched once);
  `block_step(half)` opens block b = bp + half (the second of a pair guarded:
  odd block counts); `load_block_lanes` loads column j's block at b and its
  scale (`wl` the lane's texel column, `parts` texels a block). Each opening
  is closed by the caller's `}`. With pairs but not `pair_steps` (the gemm's
  batched tiles), the loop steps one block at a time and each block fetches
  its pair texel, taking x or y by parity (`half` -1 in
  `load_block_tex_paired`).
#}
{% macro block_loop(pairs, tn, wg) %}
{% if pairs %}
for (var bp = 0u; bp < p.chunks; bp = bp + 2u) {
  {% for j in range(tn) %}
let dp{{ j }} = textureLoad(s_tex, vec2<u32>(wl + {{ j * wg }}u, wid.x * ((p.chunks + 1u) / 2u) + bp / 2u));
  {% endfor %}
{% else %}
for (var bp = 0u; bp < p.chunks; bp = bp + 1u) {
{% endif %}
{% endmacro %}
{% macro block_step(half) %}
{% if half == 1 %}
if (bp + 1u < p.chunks) {
{% else %}
{
{% endif %}
let b = bp + {{ half }}u;
{% endmacro %}
{% macro load_block_lanes(format, j, wl, wg, parts, pairs, half, pair_steps=true) %}
{% if pairs and pair_steps %}
{{ load_block_tex_paired(format, j, wl ~ " + " ~ j * wg * parts ~ "u", wl ~ " + " ~ (j * wg * parts + 1) ~ "u", "wy + b", "dp" ~ j, half) -}}
{% elif pairs %}
{# One block a step over pair texels: block b's scale is its texel's x (b even) or y. #}
let dp{{ j }} = textureLoad(s_tex, vec2<u32>(wl + {{ j * wg }}u, wid.x * ((p.chunks + 1u) / 2u) + b / 2u));
{{ load_block_tex_paired(format, j, wl ~ " + " ~ j * wg * parts ~ "u", wl ~ " + " ~ (j * wg * parts + 1) ~ "u", "wy + b", "dp" ~ j, -1) -}}
{% else %}
{{ load_block_tex(format, j, wl ~ " + " ~ j * wg * parts ~ "u", wl ~ " + " ~ (j * wg * parts + 1) ~ "u", "wy + b", "vec2<u32>(wl + " ~ j * wg ~ "u, wy + b)") -}}
{% endif %}
{% endmacro %}
{% macro load_block(format, j, blk) %}
{% if format == "Q5_0P" %}
let nb{{ j }} = 5u * ({{ blk }}); let n{{ j }} = pl_w4(nb{{ j }}); let h{{ j }} = w[nb{{ j }} + 4u];
let qa{{ j }} = pl_nib_lo(n{{ j }}) | (pl_b1(h{{ j }}, 0u) << vec4<u32>(4u));
let qb{{ j }} = pl_nib_hi(n{{ j }}) | (pl_b1(h{{ j }}, 4u) << vec4<u32>(4u));
let d{{ j }} = scales[{{ blk }}];
{% elif format == "Q4_KP" %}
let q{{ j }} = w[{{ blk }}]; let d{{ j }} = pl_factors({{ blk }});
{% elif format == "Q4_1P" %}
let q{{ j }} = w[{{ blk }}]; let d{{ j }} = pl_dm({{ blk }});
{% elif format == "Q5_1P" %}
let nb{{ j }} = 5u * ({{ blk }}); let n{{ j }} = pl_w4(nb{{ j }}); let h{{ j }} = w[nb{{ j }} + 4u];
let qa{{ j }} = pl_nib_lo(n{{ j }}) | (pl_b1(h{{ j }}, 0u) << vec4<u32>(4u));
let qb{{ j }} = pl_nib_hi(n{{ j }}) | (pl_b1(h{{ j }}, 4u) << vec4<u32>(4u));
let f{{ j }} = pl_dm({{ blk }}); let d{{ j }} = vec4<f32>(f{{ j }}, f{{ j }});
{% elif format == "Q5_KP" %}
let nb{{ j }} = 5u * ({{ blk }}); let n{{ j }} = pl_w4(nb{{ j }}); let h{{ j }} = w[nb{{ j }} + 4u];
let qa{{ j }} = pl_nib_lo(n{{ j }}) | (pl_b1(h{{ j }}, 0u) << vec4<u32>(4u));
let qb{{ j }} = pl_nib_hi(n{{ j }}) | (pl_b1(h{{ j }}, 4u) << vec4<u32>(4u));
let f{{ j }} = pl_factors({{ blk }}); let d{{ j }} = vec4<f32>(f{{ j }}, f{{ j }});
{% elif format == "Q6_KP" %}
let nb{{ j }} = 6u * ({{ blk }}); let n{{ j }} = pl_w4(nb{{ j }});
let qa{{ j }} = pl_nib_lo(n{{ j }}) | (pl_b2(w[nb{{ j }} + 4u]) << vec4<u32>(4u));
let qb{{ j }} = pl_nib_hi(n{{ j }}) | (pl_b2(w[nb{{ j }} + 5u]) << vec4<u32>(4u));
let d{{ j }} = pl_factors({{ blk }});
{% elif format == "Q3_KP" %}
let nb{{ j }} = 3u * ({{ blk }}); let h{{ j }} = w[nb{{ j }} + 2u];
let qa{{ j }} = pl_b2(w[nb{{ j }}]) | (pl_b1(h{{ j }}, 0u) << vec4<u32>(2u));
let qb{{ j }} = pl_b2(w[nb{{ j }} + 1u]) | (pl_b1(h{{ j }}, 4u) << vec4<u32>(2u));
let d{{ j }} = pl_factors({{ blk }});
{% elif format == "Q2_KP" %}
let nb{{ j }} = 2u * ({{ blk }});
let qa{{ j }} = pl_b2(w[nb{{ j }}]); let qb{{ j }} = pl_b2(w[nb{{ j }} + 1u]);
let d{{ j }} = pl_factors({{ blk }});
{% elif format == "Q8_0" or format == "Q8_16" %}
let qa{{ j }} = w[2u * ({{ blk }})]; let qb{{ j }} = w[2u * ({{ blk }}) + 1u]; let d{{ j }} = scales[{{ blk }}];
{% else %}
let q{{ j }} = w[{{ blk }}]; let d{{ j }} = scales[{{ blk }}];
{% endif %}
{% endmacro %}
{% macro dq_sub(format, j, s, bits=8) %}
{% set l = ["x", "y", "z", "w"] %}
{% if (format == "Q8_0" or format == "Q8_16") and bits != 8 %}
{% set v = ("qa" if s < 2 else "qb") ~ j %}
dq_qn({{ v }}.{{ l[2 * s % 4] }}, {{ v }}.{{ l[2 * s % 4 + 1] }}, {{ bits }}u)
{%- elif format == "Q8_0" or format == "Q8_16" %}
{% set v = ("qa" if s < 2 else "qb") ~ j %}
dq_q8({{ v }}.{{ l[2 * s % 4] }}, {{ v }}.{{ l[2 * s % 4 + 1] }})
{%- else %}
dq_q4(q{{ j }}.{{ l[2 * s % 4] }}, q{{ j }}.{{ l[2 * s % 4 + 1] }}, {{ 0 if s < 2 else 4 }}u, {{ "8.0" if format == "Q4_0" else "0.0" }})
{%- endif %}
{% endmacro %}
{#
  `dq_sub` for x pre-scaled by `x_scale(format, s)` (Q4_0, Q4_1, Q8_0; see q4m_lo, i8m).
#}
{% macro x_scale(format, s) %}{{ "Q8_X" if format == "Q8_0" else "Q4_X_LO" if s < 2 else "Q4_X_HI" }}{% endmacro %}
{% macro dq_sub_scaled(format, j, s) %}
{% set l = ["x", "y", "z", "w"] %}
{% set half = "lo" if s < 2 else "hi" %}
{% if format == "Q8_0" %}
{% set v = ("qa" if s < 2 else "qb") ~ j %}
F8(i8m({{ v }}.{{ l[2 * s % 4] }}), i8m({{ v }}.{{ l[2 * s % 4 + 1] }}))
{%- elif format == "Q4_0" %}
F8(q4m_{{ half }}(q{{ j }}.{{ l[2 * s % 4] }}) - Q4_OFF_{{ half | upper }}, q4m_{{ half }}(q{{ j }}.{{ l[2 * s % 4 + 1] }}) - Q4_OFF_{{ half | upper }})
{%- else %}
F8(q4m_{{ half }}(q{{ j }}.{{ l[2 * s % 4] }}), q4m_{{ half }}(q{{ j }}.{{ l[2 * s % 4 + 1] }}))
{%- endif %}
{% endmacro %}
