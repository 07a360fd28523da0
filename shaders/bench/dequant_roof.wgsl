// dequant_roof.wgsl — a weight format's dequant roof (benchmarks only): how
// fast this adapter reads a weight in the gemm's texture layout and widens it
// into f32 multiply-adds when nothing else is asked of the kernel.
//
// The loop walks the weight's texels exactly as the decode GEMV does (the
// same weights.wgsl macros as gemm.wgsl with w_tex, one row: workgroup g,
// lane l, block by block, TN columns a lane, in the lane-group layout of
// src/backend/wgsl/weight.rs) and
// dequantises with the same helpers (weights.wgsl, x pre-scaled where the
// GEMV pre-scales it). What it leaves out is all the GEMV does besides: x is
// four F8 loaded once into registers (no x texel fetch or broadcast a block),
// and a block's four sub-block chains (the gemm's, gemm.wgsl) are summed in
// no set order. So it is what a decode GEMV of f32 math on the format
// can reach at best on this adapter; the bench prints each GEMV's share of it.
//
// Bindings: 0 p: Params; 1 w_tex (2 s_tex: quantised formats) as the gemm's;
//           then xv: 8 vec4<f32> (x of a block's four F8); then out:
//           (invocations) f32, a lane's sum so that nothing is optimised away.
// Dispatch: (ceil(rows / (TN·WG)), 1, 1) workgroups of WG, as the GEMV's.
// Floats take K a multiple of 32 (four chunks of 8 a step).

struct Params {
    chunks: u32,   // floats: Kp / 8; quantised: K / 32 (the gemm's p.chunks)
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
{% include "weights.wgsl" %}
{% import "weights.wgsl" as weights %}
{% set lanes = ["a.x", "a.y", "a.z", "a.w", "b.x", "b.y", "b.z", "b.w"] %}
{% set scaled = format in ["Q4_0", "Q4_1", "Q8_0"] %}
{# `pairs` (from dequant_roof.rs, weight::scale_pairs), as the gemm's. #}
{% set parts = 2 if format in ["Q8_0", "Q8_16", "F32"] else 1 %}
{% set wl = "wl * 2u" if parts == 2 else "wl" %}
{% set first = 3 if quantized else 2 %}
{{ weights.tex_bindings(format, 1, scale_texel) -}}
@group(0) @binding({{ first }}) var<storage, read> xv: array<vec4<f32>>;
@group(0) @binding({{ first + 1 }}) var<storage, read_write> out: array<f32>;

@compute @workgroup_size({{ wg }})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
let wl = lid.x; let wy = wid.x * p.chunks;
{% for sub in range(4) %}
let x_{{ sub }} = F8(xv[{{ 2 * sub }}u], xv[{{ 2 * sub + 1 }}u]);
  {% if scaled %}
let xq_{{ sub }} = F8(x_{{ sub }}.a * {{ weights.x_scale(format, sub) }}, x_{{ sub }}.b * {{ weights.x_scale(format, sub) }});
  {% endif %}
{% endfor %}
{% set xname = "xq_" if scaled else "x_" %}
// Σx of the block, and of its halves (Q8_16's two mins).
let xlo = dot(x_0.a + x_1.a + x_0.b + x_1.b, vec4<f32>(1.0));
let xhi = dot(x_2.a + x_3.a + x_2.b + x_3.b, vec4<f32>(1.0));
let xsum = xlo + xhi;
{% for j in range(tn) %}
var a{{ j }} = 0.0;
{% endfor %}
{% if quantized %}
{{ weights.block_loop(pairs, tn, wg) -}}
{% for half in range(2 if pairs else 1) %}
{{ weights.block_step(half) -}}
  {% for j in range(tn) %}
{
{{ weights.load_block_lanes(format, j, wl, wg, parts, pairs, half) -}}
    {% for sub in range(4) %}
let w_{{ sub }} = {{ weights.dq_sub_scaled(format, j, sub) if scaled else weights.dq_sub(format, j, sub) }};
var s_{{ sub }} = {{ xname }}{{ sub }}.a.x * w_{{ sub }}.a.x;
      {% for l in lanes[1:] %}
s_{{ sub }} = fma({{ xname }}{{ sub }}.{{ l }}, w_{{ sub }}.{{ l }}, s_{{ sub }});
      {% endfor %}
    {% endfor %}
    {% if format == "Q8_16" %}
a{{ j }} = fma(d{{ j }}.x, s_0 + s_1, a{{ j }}); a{{ j }} = fma(d{{ j }}.z, s_2 + s_3, a{{ j }});
a{{ j }} = fma(d{{ j }}.y, xlo, a{{ j }}); a{{ j }} = fma(d{{ j }}.w, xhi, a{{ j }});
    {% elif format == "Q4_1" %}
a{{ j }} = fma(d{{ j }}.x, (s_0 + s_1) + (s_2 + s_3), a{{ j }}); a{{ j }} = fma(d{{ j }}.y, xsum, a{{ j }});
    {% else %}
a{{ j }} = fma(d{{ j }}, (s_0 + s_1) + (s_2 + s_3), a{{ j }});
    {% endif %}
}
  {% endfor %}
}
{% endfor %}
}
{% else %}
for (var cb = 0u; cb < p.chunks; cb = cb + 4u) {
  {% for sub in range(4) %}
{
let c = cb + {{ sub }}u;
    {% for j in range(tn) %}
let w{{ j }} = load_w8t({{ wl }} + {{ j * wg * parts }}u, {{ wl }} + {{ j * wg * parts + 1 }}u, wy + c);
var sa{{ j }} = x_{{ sub }}.a.x * w{{ j }}.a.x;
var sb{{ j }} = x_{{ sub }}.b.x * w{{ j }}.b.x;
      {% for l in ["y", "z", "w"] %}
sa{{ j }} = fma(x_{{ sub }}.a.{{ l }}, w{{ j }}.a.{{ l }}, sa{{ j }});
sb{{ j }} = fma(x_{{ sub }}.b.{{ l }}, w{{ j }}.b.{{ l }}, sb{{ j }});
      {% endfor %}
a{{ j }} = a{{ j }} + (sa{{ j }} + sb{{ j }});
    {% endfor %}
}
  {% endfor %}
}
{% endif %}
out[gid.x] = {% for j in range(tn) %}a{{ j }}{{ " + " if not loop.last }}{% endfor %};
}
