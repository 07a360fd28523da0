// paged_attention.wgsl — varlen causal attention over the paged KV cache. One
// launch serves prefill chunks and decodes of many sequences together.
// A template (rendered by src/backend/wgsl/attention.rs) for a head_dim HD, W lanes,
// G query heads and QT query tokens per workgroup, with q and the accumulators in
// vec4 registers (template loops unroll over head_dim / 4, G and the tokens).
//
// Bindings:
//   0 p:            Params (uniform)
//   1 q:            (T, q_stride) f32; query head h of token t at t*q_stride + h*HD (rope applied)
//   2 k_cache:      (num_blocks * block_size, kv_heads * HD) f32, read as vec4;
//                   k_tex where the cache is a texture (kv_tex.rs: slot s is texel
//                   row s % SLOTS_PER_LAYER of layer s / SLOTS_PER_LAYER)
//   3 v_cache:      the same for V
//   4 positions:    (T) u32; token t attends to positions 0..=positions[t] of its sequence
//   5 token_seq:    (T) u32 row of block_tables that holds token t's sequence
//   6 block_tables: (S, max_blocks) u32 logical block -> physical block
//   7 out:          (T, heads * HD) f32
// GQA: query head h reads KV head h / (heads / kv_heads); a workgroup serves G
//   consecutive query heads of one KV head (G divides heads / kv_heads), so each
//   K/V row it loads serves G heads.
// Dispatch: (heads / G, ceil(T / QT), 1) workgroups of W lanes; one workgroup per
//   (head group, QT consecutive tokens). Tokens of one sequence share each K/V
//   row the workgroup loads (prefill chunks load them 1/QT as often); tokens of
//   different sequences are attended one after the other.
// Sliding window (variants with `window`): a token with n keys attends to keys
//   lo = n - window .. n - 1 only (lo_of); variants with `softcap` soft-cap the scores.
// Reduction order (batch invariance): lane l visits keys j ≡ l (mod W) from lo in
//   increasing j with an online softmax (running max m, sum s, acc[HD]); scores are
//   fma-dot products over d in increasing order. Lanes are then merged in lane
//   order 0..W-1. The order depends only on the key count, never on T, on the
//   other sequences, on chunking, on QT, or on which blocks hold the keys (a
//   token sharing a key loop with a longer one skips the keys past its own).
//   With `subgroups` (the W lanes one subgroup, CPU adapters) the lanes merge
//   with subgroupMax / subgroupAdd instead: the same for every T and QT too.

{% include "attention_common.wgsl" %}
{% import "attention_common.wgsl" as common %}
{% if not subgroups %}
var<workgroup> lane_m: array<f32, W * G>;
var<workgroup> lane_s: array<f32, W * G>;
var<workgroup> lane_acc: array<vec4<f32>, W * G * HD / 4u>;
{% endif %}
{#
  attend(n): one pass over the keys for tokens t0 .. t{n-1} (all of one sequence,
  the row of block_tables in `table`), then the lane merge and output of each.
#}
{% set d4 = head_dim // 4 %}
{% macro attend(n) %}
{
{% for ti in range(n) %}
let n{{ ti }} = positions[t{{ ti }}] + 1u;
let lo{{ ti }} = lo_of(n{{ ti }});
  {% for gi in range(g) %}
let qb{{ ti }}_{{ gi }} = t{{ ti }} * p.q_stride + (h0 + {{ gi }}u) * HD;
    {% for i in range(d4) %}
      {% if q8 %}
        {% if i % 8 == 0 %}
let qr{{ ti }}_{{ gi }}_{{ i // 8 }} = q_block(qb{{ ti }}_{{ gi }} + {{ 4 * i }}u);
        {% endif %}
let q{{ ti }}_{{ gi }}_{{ i }} = qr{{ ti }}_{{ gi }}_{{ i // 8 }}[{{ i % 8 }}];
      {% else %}
let q{{ ti }}_{{ gi }}_{{ i }} = q_at(qb{{ ti }}_{{ gi }}, {{ i }}u);
      {% endif %}
var a{{ ti }}_{{ gi }}_{{ i }} = vec4<f32>(0.0);
    {% endfor %}
var m{{ ti }}_{{ gi }} = NEG;
var s{{ ti }}_{{ gi }} = 0.0;
  {% endfor %}
{% endfor %}
let table = token_seq[t0] * p.max_blocks;
let n_max = {% for ti in range(n) %}{{ "max(" if not loop.last }}n{{ ti }}{{ ", " if not loop.last }}{% endfor %}{% for ti in range(n - 1) %}){% endfor %};
let lo_min = {% for ti in range(n) %}{{ "min(" if not loop.last }}lo{{ ti }}{{ ", " if not loop.last }}{% endfor %}{% for ti in range(n - 1) %}){% endfor %};
// Lane l keeps keys j ≡ l (mod W) whatever the window: from the window's start rounded down to W.
for (var j = (lo_min / W) * W + l; j < n_max; j = j + W) {
let slot = slot_of(table, j);
{{ common.kv_rows("slot", d4) -}}
{% for ti in range(n) %}
if (j < n{{ ti }} && j >= lo{{ ti }}) {
  {% for gi in range(g) %}
var dot{{ gi }} = 0.0;
    {% for i in range(d4) %}
      {% for c in ["x", "y", "z", "w"] %}
dot{{ gi }} = fma(q{{ ti }}_{{ gi }}_{{ i }}.{{ c }}, k{{ i }}.{{ c }}, dot{{ gi }});
      {% endfor %}
    {% endfor %}
let sc{{ gi }} = score_of(dot{{ gi }});
let mn{{ gi }} = max(m{{ ti }}_{{ gi }}, sc{{ gi }});
let corr{{ gi }} = exp(m{{ ti }}_{{ gi }} - mn{{ gi }});
let e{{ gi }} = exp(sc{{ gi }} - mn{{ gi }});
s{{ ti }}_{{ gi }} = fma(s{{ ti }}_{{ gi }}, corr{{ gi }}, e{{ gi }});
m{{ ti }}_{{ gi }} = mn{{ gi }};
    {% for i in range(d4) %}
a{{ ti }}_{{ gi }}_{{ i }} = fma(a{{ ti }}_{{ gi }}_{{ i }}, vec4<f32>(corr{{ gi }}), e{{ gi }} * v{{ i }});
    {% endfor %}
  {% endfor %}
}
{% endfor %}
}
{% if subgroups %}
{# The W lanes are one subgroup: merge in registers, no workgroup memory. #}
  {% for ti in range(n) %}
    {% for gi in range(g) %}
{
let mx = subgroupMax(m{{ ti }}_{{ gi }});
let wl = exp(m{{ ti }}_{{ gi }} - mx);
let total = subgroupAdd(s{{ ti }}_{{ gi }} * wl);
let ob = t{{ ti }} * p.heads * HD + (h0 + {{ gi }}u) * HD;
      {% for i in range(d4) %}
let o{{ i }} = subgroupAdd(a{{ ti }}_{{ gi }}_{{ i }} * wl);
if (l == {{ i % w }}u) { let r = o{{ i }} / total; out[ob + {{ 4 * i }}u] = r.x; out[ob + {{ 4 * i + 1 }}u] = r.y; out[ob + {{ 4 * i + 2 }}u] = r.z; out[ob + {{ 4 * i + 3 }}u] = r.w; }
      {% endfor %}
}
    {% endfor %}
  {% endfor %}
{% else %}
{% for ti in range(n) %}
  {% for gi in range(g) %}
lane_m[l * G + {{ gi }}u] = m{{ ti }}_{{ gi }};
lane_s[l * G + {{ gi }}u] = s{{ ti }}_{{ gi }};
    {% for i in range(d4) %}
lane_acc[(l * G + {{ gi }}u) * (HD / 4u) + {{ i }}u] = a{{ ti }}_{{ gi }}_{{ i }};
    {% endfor %}
  {% endfor %}
merge(t{{ ti }}, h0, l);
{% endfor %}
{% endif %}
}
{% endmacro %}
{% if not subgroups %}
// Merges the W lanes' partial softmax of token t (in workgroup memory) in lane
// order and writes its G heads.
fn merge(t: u32, h0: u32, l: u32) {
workgroupBarrier();
for (var gi = 0u; gi < G; gi = gi + 1u) {
var mx = NEG;
for (var i = 0u; i < W; i = i + 1u) { mx = max(mx, lane_m[i * G + gi]); }
var total = 0.0;
for (var i = 0u; i < W; i = i + 1u) { total = fma(lane_s[i * G + gi], exp(lane_m[i * G + gi] - mx), total); }
for (var d = l; d < HD / 4u; d = d + W) {
var o = vec4<f32>(0.0);
for (var i = 0u; i < W; i = i + 1u) {
o = fma(lane_acc[(i * G + gi) * (HD / 4u) + d], vec4<f32>(exp(lane_m[i * G + gi] - mx)), o);
}
let ob = t * p.heads * HD + (h0 + gi) * HD + 4u * d;
let r = o / total;
out[ob] = r.x; out[ob + 1u] = r.y; out[ob + 2u] = r.z; out[ob + 3u] = r.w;
}
}
workgroupBarrier();
}
{% endif %}
@compute @workgroup_size(W)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
let h0 = wid.x * G;
let l = lid.x;
let kvh = h0 / (p.heads / p.kv_heads);
let first = wid.y * {{ qt }}u;
{% if qt > 1 %}
// Whole tile of one sequence: one pass over the keys for all of it.
let last = min(first + {{ qt - 1 }}u, p.t - 1u);
if (last == first + {{ qt - 1 }}u && token_seq[first] == token_seq[last]) {
  {% for ti in range(qt) %}
let t{{ ti }} = first + {{ ti }}u;
  {% endfor %}
{{ attend(qt) }}
  return;
}
{% endif %}
{% if qt == 1 %}
// One token (the dispatch has exactly T rows of workgroups). No loop or early
// return around it: llvmpipe loads uniform addresses (q, positions) once for
// all lanes only outside control flow.
let t0 = first;
{{ attend(1) }}
{% else %}
for (var t = first; t < min(first + {{ qt }}u, p.t); t = t + 1u) {
let t0 = t;
{{ attend(1) }}
}
{% endif %}
}
