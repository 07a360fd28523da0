// embed.wgsl — out[t, :] = W[ids[t], :] dequantised to f32 (row gather).
//
// A template (rendered by src/backend/wgsl/embed.rs) per weight format, and
// per source: storage buffers, or (`tex`) the weight textures of CPU adapters
// in the lane-group layout of src/backend/wgsl/weight.rs (`WeightTex`).
//
// Bindings:
//   0 p:      Params (uniform)
//   1 ids:    (T) u32 token ids
//   2 w:      (vocab, d) weights in the layout of weights.wgsl (or w_tex)
//   3 scales: (vocab, d/32) quantised formats only (or s_tex)
//   last out: (T, d) f32
// Dispatch: (ceil(chunks / 64), T, 1) per window of rows; one invocation per 8
//   (floats) or 32 (quantised) elements; tokens outside the window return early.
//   No reduction: each element is w·d (+ m) as on the CPU.

struct Params {
    t: u32,
    d: u32,
    chunks: u32,
    w_row: u32,
    vocab: u32,
    row0: u32,     // the window of rows bound at binding 2: row0 .. row0 + rows
    rows: u32,
    // The texture layout (tex only): columns a lane takes, lanes a group,
    // texels a unit, scale texture rows a group.
    tn: u32,
    wg: u32,
    parts: u32,
    scale_units: u32,
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> ids: array<u32>;

fn put8(o: u32, k: u32, v: F8) {
    let e = array<f32, 8>(v.a.x, v.a.y, v.a.z, v.a.w, v.b.x, v.b.y, v.b.z, v.b.w);
    for (var i = 0u; i < 8u; i = i + 1u) {
        if (k + i < p.d) { out[o + k + i] = e[i]; }
    }
}
{% include "weights.wgsl" %}
{% import "weights.wgsl" as weights %}
{% if tex %}
{{ weights.tex_bindings(format, 2, scale_texel) -}}
{% else %}
{{ weights.bindings(load, 2) -}}
{% endif %}
@group(0) @binding({{ 4 if quantized else 3 }}) var<storage, read_write> out: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
let t = gid.y; let c = gid.x;
if (t >= p.t || c >= p.chunks) { return; }
let id = min(ids[t], p.vocab - 1u);
if (id < p.row0 || id >= p.row0 + p.rows) { return; }
let row = id - p.row0;
let o = t * p.d;
{% if tex %}
// Row `row` of the window: group g, lane l, column j; its unit c on texture
// row g·chunks + c at texel (j·wg + l)·parts (+ 1).
let gw = p.tn * p.wg;
let g = row / gw;
let lane = (row % gw) / p.tn;
let col = (row % p.tn) * p.wg + lane;
let x0 = col * p.parts;
let x1 = x0 + 1u;
let y = g * p.chunks + c;
{% endif %}
{% if quantized %}
{% if tex and pairs %}
let b = c;
let dp = textureLoad(s_tex, vec2<u32>(col, g * p.scale_units + c / 2u));
{{ weights.load_block_tex_paired(format, 0, "x0", "x1", "y", "dp", -1) -}}
{% elif tex %}
{{ weights.load_block_tex(format, 0, "x0", "x1", "y", "vec2<u32>(col, g * p.scale_units + c)") -}}
{% else %}
{{ weights.load_block(load, 0, "row * p.chunks + c") -}}
{% endif %}
  {% for sub in range(4) %}
    {% if format == "Q8_16" %}
{ let v = {{ weights.dq_sub(format, 0, sub, qbits) }}; let h = d0.{{ "xy" if sub < 2 else "zw" }}; put8(o, 32u * c + {{ 8 * sub }}u, F8(v.a * h.x + h.y, v.b * h.x + h.y)); }
    {% elif format == "Q4_1" %}
{ let v = {{ weights.dq_sub(format, 0, sub, qbits) }}; put8(o, 32u * c + {{ 8 * sub }}u, F8(v.a * d0.x + d0.y, v.b * d0.x + d0.y)); }
    {% else %}
{ let v = {{ weights.dq_sub(format, 0, sub, qbits) }}; put8(o, 32u * c + {{ 8 * sub }}u, F8(v.a * d0, v.b * d0)); }
    {% endif %}
  {% endfor %}
{% elif tex %}
put8(o, 8u * c, load_w8t(x0, x1, y));
{% else %}
put8(o, 8u * c, load_w8(row * p.w_row, c));
{% endif %}
}
