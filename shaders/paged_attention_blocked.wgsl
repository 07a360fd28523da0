// paged_attention_blocked.wgsl — varlen causal attention over the paged KV
// cache for CPU adapters (the W lanes of a workgroup one subgroup): the keys
// in blocks of W with one online softmax per (token, head), as FlashAttention
// orders them. Same bindings, params and output as paged_attention.wgsl.
// A template (rendered by src/backend/wgsl/attention.rs) for a head_dim HD,
// W lanes, G query heads of one KV head, and a tile of W query tokens (`tile`).
//
// Two ways to run a token, one reduction order (below), so the same bits:
// - decode (one token a workgroup): lane l scores key bW + l of each block for
//   the G heads, then owns the output texels i ≡ l (mod W) of every head and
//   folds the block's W values into them; nothing is merged across lanes.
// - tile (`tile`, the W tokens of a workgroup consecutive positions of one
//   sequence, as in a prefill chunk): lane l is token first + l. Each block's
//   K and V rows are fetched once, a row a lane, and shared with
//   subgroupBroadcast; every lane scores the W keys and folds the W values
//   into its own q's accumulators (GEMM-like: three FMAs a broadcast). Tiles
//   of mixed sequences run their tokens one after the other as decodes.
//
// Touch loads (decode): a block's keys are rows scattered over the cache, and
// its loop is long enough (thousands of instructions a block on llvmpipe)
// that a CPU's out-of-order window sees only a few of its rows' lines miss at
// once. So each block first loads one texel of every cache line (64 bytes,
// four texels) of the next block's K and V rows, whose misses then overlap
// the block's work, and the block after finds its rows in cache: 0.49 ->
// 0.31 ms a layer at 1024 tokens of context (kernel bench, lavapipe). The
// touched values sum into `sink`, stored only where p.touch_sink is 1 (it is
// always 0), so the compiler keeps the loads; results are unchanged.
//
// Reduction order (batch invariance) of a token with n keys, per head: blocks
// b = lo / W .. ceil(n / W) - 1 in order (lo = 0, or n - window under a sliding
// window: lo_of); in block b key j = bW + jj (jj = 0..W-1) has score sc_j =
// score_of(fma chain of q·k over d in increasing order), or NEG outside lo..n-1
// (a block with no key inside leaves the state as it was); mn = max(m, max_j sc_j); corr = exp(m - mn); p_j = exp(sc_j - mn)
// (0 past n); s = s·corr, then s = s + p_j for jj in order; acc = acc·corr,
// then acc = fma(p_j, v_j, acc) for jj in order (v_j = 0 past n); m = mn.
// out = acc / s. Nothing depends on T, the other tokens, chunking or tiling.

{% include "attention_common.wgsl" %}
{% import "attention_common.wgsl" as common %}
{% set d4 = head_dim // 4 %}
{# Output texels a lane owns in the decode: i = c·W + l. #}
{% set dl = (d4 + w - 1) // w %}

{#
  load_q(t): token t's query heads h0 .. h0 + G - 1 into registers q{gi}_{i}
  (texel i of head gi), for the decode and the tile path alike.
#}
{% macro load_q(t) %}
{% for gi in range(g) %}
let qb{{ gi }} = {{ t }} * p.q_stride + (h0 + {{ gi }}u) * HD;
  {% for i in range(d4) %}
    {% if q8 %}
      {% if i % 8 == 0 %}
let qr{{ gi }}_{{ i // 8 }} = q_block(qb{{ gi }} + {{ 4 * i }}u);
      {% endif %}
let q{{ gi }}_{{ i }} = qr{{ gi }}_{{ i // 8 }}[{{ i % 8 }}];
    {% else %}
let q{{ gi }}_{{ i }} = q_at(qb{{ gi }}, {{ i }}u);
    {% endif %}
  {% endfor %}
{% endfor %}
{% endmacro %}
{#
  decode(): token t0 (a subgroup-uniform value) alone, lanes over keys for the
  scores and over output texels for the values.
#}
{% macro decode() %}
{
let n = positions[t0] + 1u;
let table = token_seq[t0] * p.max_blocks;
{{ load_q("t0") -}}
{% for gi in range(g) %}
var m{{ gi }} = NEG;
var s{{ gi }} = 0.0;
  {% for c in range(dl) %}
var a{{ gi }}_{{ c }} = vec4<f32>(0.0);
  {% endfor %}
{% endfor %}
{% for c in range(dl) %}
let ti{{ c }} = min({{ c * w }}u + l, D4 - 1u);
{% endfor %}
let nb = (n + W - 1u) / W;
let lo = lo_of(n);
// Touch loads: the next block's lines, a texel each (header).
var sink = vec4<f32>(0.0);
var slot_next = slot_of(table, min((lo / W) * W + l, n - 1u));
for (var b = lo / W; b < nb; b = b + 1u) {
let j = b * W + l;
let live = j < n && j >= lo;
let slot = slot_next;
slot_next = slot_of(table, min(j + W, n - 1u));
{% for i in range(0, d4, 4) %}
sink = sink + k_at(slot_next, kvh, {{ i }}u) + v_at(slot_next, kvh, {{ i }}u);
{% endfor %}
{% for i in range(d4) %}
let k{{ i }} = k_at(slot, kvh, {{ i }}u);
{% endfor %}
{# The heads' chains interleaved (each in its own order): independent adds side by side. #}
{% for gi in range(g) %}
var dot{{ gi }} = 0.0;
{% endfor %}
{% for i in range(d4) %}
  {% for cc in ["x", "y", "z", "w"] %}
    {% for gi in range(g) %}
dot{{ gi }} = fma(q{{ gi }}_{{ i }}.{{ cc }}, k{{ i }}.{{ cc }}, dot{{ gi }});
    {% endfor %}
  {% endfor %}
{% endfor %}
{% for gi in range(g) %}
let sc{{ gi }} = select(NEG, score_of(dot{{ gi }}), live);
let mn{{ gi }} = max(m{{ gi }}, subgroupMax(sc{{ gi }}));
let corr{{ gi }} = exp(m{{ gi }} - mn{{ gi }});
let pe{{ gi }} = select(0.0, exp(sc{{ gi }} - mn{{ gi }}), live);
m{{ gi }} = mn{{ gi }};
s{{ gi }} = s{{ gi }} * corr{{ gi }};
  {% for c in range(dl) %}
a{{ gi }}_{{ c }} = a{{ gi }}_{{ c }} * corr{{ gi }};
  {% endfor %}
{% endfor %}
{% for jj in range(w) %}
{
let vslot = subgroupBroadcast(slot, {{ jj }}u);
let vlive = b * W + {{ jj }}u < n && b * W + {{ jj }}u >= lo;
  {% for c in range(dl) %}
let v{{ c }} = select(vec4<f32>(0.0), v_at(vslot, kvh, ti{{ c }}), vlive);
  {% endfor %}
  {% for gi in range(g) %}
let p{{ gi }} = subgroupBroadcast(pe{{ gi }}, {{ jj }}u);
s{{ gi }} = s{{ gi }} + p{{ gi }};
    {% for c in range(dl) %}
a{{ gi }}_{{ c }} = fma(vec4<f32>(p{{ gi }}), v{{ c }}, a{{ gi }}_{{ c }});
    {% endfor %}
  {% endfor %}
}
{% endfor %}
}
if (p.touch_sink == 1u) { out[0] = sink.x + sink.y + sink.z + sink.w; }
{% for gi in range(g) %}
  {% for c in range(dl) %}
if ({{ c * w }}u + l < D4) {
let ob = t0 * p.heads * HD + (h0 + {{ gi }}u) * HD + 4u * ({{ c * w }}u + l);
let r = a{{ gi }}_{{ c }} / s{{ gi }};
out[ob] = r.x; out[ob + 1u] = r.y; out[ob + 2u] = r.z; out[ob + 3u] = r.w;
}
  {% endfor %}
{% endfor %}
}
{% endmacro %}
{#
  tile_block(masked): block b of the tile's key loop. Unmasked: every key of
  the block is within every lane's token; masked: lane tokens end inside or
  before it (keys past n masked, a block wholly past n leaves the state as it was).
#}
{% macro tile_block(masked) %}
{
let j = b * W + l;
let slot = slot_of(table, min(j, n_max - 1u));
{{ common.kv_rows("slot", d4) -}}
{% if masked %}
let live = b * W < n && b * W + W > lo;
{% endif %}
{# kg keys' q·k chains at a time, interleaved, each in its own order (so the same bits): a
   key's chain alone left a CPU lane's adds waiting on each other (kernel bench, 512-token
   prefill chunk: 8.3-8.6 ms a layer one key at a time, 8.1 two, 7.2-7.4 four, 7.1-7.3 eight). #}
{% set kg = 4 if w % 4 == 0 else 1 %}
{% for jj in range(w) %}
  {% for gi in range(g) %}
var sc{{ gi }}_{{ jj }}: f32;
  {% endfor %}
{% endfor %}
{% for j0 in range(0, w, kg) %}
{
  {% for jj in range(j0, j0 + kg) %}
    {% for gi in range(g) %}
var dot{{ gi }}_{{ jj }} = 0.0;
    {% endfor %}
  {% endfor %}
  {% for i in range(d4) %}
    {% for jj in range(j0, j0 + kg) %}
let kb{{ i }}_{{ jj }} = subgroupBroadcast(k{{ i }}, {{ jj }}u);
    {% endfor %}
    {% for gi in range(g) %}
      {% for cc in ["x", "y", "z", "w"] %}
        {% for jj in range(j0, j0 + kg) %}
dot{{ gi }}_{{ jj }} = fma(q{{ gi }}_{{ i }}.{{ cc }}, kb{{ i }}_{{ jj }}.{{ cc }}, dot{{ gi }}_{{ jj }});
        {% endfor %}
      {% endfor %}
    {% endfor %}
  {% endfor %}
  {% for jj in range(j0, j0 + kg) %}
    {% for gi in range(g) %}
      {% if masked %}
sc{{ gi }}_{{ jj }} = select(NEG, score_of(dot{{ gi }}_{{ jj }}), b * W + {{ jj }}u < n && b * W + {{ jj }}u >= lo);
      {% else %}
sc{{ gi }}_{{ jj }} = score_of(dot{{ gi }}_{{ jj }});
      {% endif %}
    {% endfor %}
  {% endfor %}
}
{% endfor %}
{% for gi in range(g) %}
let mn{{ gi }} = max(m{{ gi }}, {% for jj in range(w - 1) %}max(sc{{ gi }}_{{ jj }}, {% endfor %}sc{{ gi }}_{{ w - 1 }}{% for jj in range(w - 1) %}){% endfor %});
let corr{{ gi }} = exp(m{{ gi }} - mn{{ gi }});
  {% for jj in range(w) %}
    {% if masked %}
let p{{ gi }}_{{ jj }} = select(0.0, exp(sc{{ gi }}_{{ jj }} - mn{{ gi }}), b * W + {{ jj }}u < n && b * W + {{ jj }}u >= lo);
    {% else %}
let p{{ gi }}_{{ jj }} = exp(sc{{ gi }}_{{ jj }} - mn{{ gi }});
    {% endif %}
  {% endfor %}
var ns{{ gi }} = s{{ gi }} * corr{{ gi }};
  {% for jj in range(w) %}
ns{{ gi }} = ns{{ gi }} + p{{ gi }}_{{ jj }};
  {% endfor %}
  {% if masked %}
s{{ gi }} = select(s{{ gi }}, ns{{ gi }}, live);
m{{ gi }} = select(m{{ gi }}, mn{{ gi }}, live);
  {% else %}
s{{ gi }} = ns{{ gi }};
m{{ gi }} = mn{{ gi }};
  {% endif %}
{% endfor %}
{% for i in range(d4) %}
{
  {% for gi in range(g) %}
var na{{ gi }} = a{{ gi }}_{{ i }} * corr{{ gi }};
  {% endfor %}
  {% for jj in range(w) %}
    {% if masked %}
let vb{{ jj }} = select(vec4<f32>(0.0), subgroupBroadcast(v{{ i }}, {{ jj }}u), b * W + {{ jj }}u < n && b * W + {{ jj }}u >= lo);
    {% else %}
let vb{{ jj }} = subgroupBroadcast(v{{ i }}, {{ jj }}u);
    {% endif %}
    {% for gi in range(g) %}
na{{ gi }} = fma(vec4<f32>(p{{ gi }}_{{ jj }}), vb{{ jj }}, na{{ gi }});
    {% endfor %}
  {% endfor %}
  {% for gi in range(g) %}
    {% if masked %}
a{{ gi }}_{{ i }} = select(a{{ gi }}_{{ i }}, na{{ gi }}, live);
    {% else %}
a{{ gi }}_{{ i }} = na{{ gi }};
    {% endif %}
  {% endfor %}
}
{% endfor %}
}
{% endmacro %}
@compute @workgroup_size(W)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
let h0 = wid.x * G;
let l = lid.x;
let kvh = h0 / (p.heads / p.kv_heads);
{% if tile %}
let first = wid.y * W;
let last = first + W - 1u;
// The tile path: W consecutive positions of one sequence.
if (last < p.t && token_seq[first] == token_seq[last] && positions[last] == positions[first] + W - 1u) {
let t = first + l;
let n = positions[t] + 1u;
let lo = lo_of(n);
let n_min = positions[first] + 1u;
let n_max = positions[last] + 1u;
let table = token_seq[first] * p.max_blocks;
{{ load_q("t") -}}
  {% for gi in range(g) %}
    {% for i in range(d4) %}
var a{{ gi }}_{{ i }} = vec4<f32>(0.0);
    {% endfor %}
var m{{ gi }} = NEG;
var s{{ gi }} = 0.0;
  {% endfor %}
// Blocks within every lane's keys unmasked, those at either end masked: from
// the first lane's window start (lanes whose window starts later skip a block
// wholly before it), blocks wholly inside every lane's window, then the last ones.
let full = n_min / W;
{% if window %}
let b0 = lo_of(n_min) / W;
let u0 = max(b0, (lo_of(n_max) + W - 1u) / W);
let u1 = max(u0, full);
for (var b = b0; b < u0; b = b + 1u) {{ tile_block(true) }}
{% else %}
let u0 = 0u;
let u1 = full;
{% endif %}
for (var b = u0; b < u1; b = b + 1u) {{ tile_block(false) }}
for (var b = u1; b < (n_max + W - 1u) / W; b = b + 1u) {{ tile_block(true) }}
  {% for gi in range(g) %}
let ob{{ gi }} = t * p.heads * HD + (h0 + {{ gi }}u) * HD;
    {% for i in range(d4) %}
{ let r = a{{ gi }}_{{ i }} / s{{ gi }}; out[ob{{ gi }} + {{ 4 * i }}u] = r.x; out[ob{{ gi }} + {{ 4 * i + 1 }}u] = r.y; out[ob{{ gi }} + {{ 4 * i + 2 }}u] = r.z; out[ob{{ gi }} + {{ 4 * i + 3 }}u] = r.w; }
    {% endfor %}
  {% endfor %}
return;
}
for (var t = first; t < min(first + W, p.t); t = t + 1u) {
let t0 = t;
{{ decode() }}
}
{% else %}
// One token (the dispatch has exactly T rows of workgroups), outside control
// flow: llvmpipe loads uniform addresses (q, positions) once for all lanes.
let t0 = wid.y;
{{ decode() }}
{% endif %}
}
