// masked_argmax.wgsl — greedy sampling under a structured-output mask, on the
// GPU, so that a constrained greedy request never reads a logits row back:
// out[i] = the lowest index of the largest value of logits row rows[i] among the
// tokens whose bit is set in mask row i; 0xffffffff when no token is allowed.
// NaN never wins; an allowed −∞ still does (the CPU path's argmax over a masked
// row picks the same token).
//
// Bindings:
//   0 p:    Params (uniform)
//   1 x:    (.., n) f32 logits
//   2 mask: (count, words) u32; bit k % 32 of word k / 32 allows token k
//   3 rows: (count) u32 logits row of each entry
//   4 out:  (count) u32
// Dispatch: (count, 1, 1) workgroups of 64; one workgroup per entry.
// Reduction: as argmax.wgsl (first maximum per invocation, then a fixed tree
//   keeping the larger value, the lower index on ties). Exact, so order-free.

struct Params {
    count: u32,
    n: u32,
    words: u32,
    _p0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> mask: array<u32>;
@group(0) @binding(3) var<storage, read> rows: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<u32>;

var<workgroup> best_v: array<f32, 64>;
var<workgroup> best_i: array<u32, 64>;

const NONE: u32 = 0xffffffffu;

fn better(v: f32, i: u32, bv: f32, bi: u32) -> bool {
    return v > bv || (v == bv && i < bi);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let e = wid.x;
    if (e >= p.count) { return; }
    let l = lid.x;
    let base = rows[e] * p.n;
    let mbase = e * p.words;
    var bv = bitcast<f32>(0xff800000u);
    var bi = NONE;
    for (var k = l; k < p.n; k = k + 64u) {
        let allowed = ((mask[mbase + k / 32u] >> (k % 32u)) & 1u) != 0u;
        let v = x[base + k];
        // `v == v` is false for NaN.
        if (allowed && v == v && better(v, k, bv, bi)) { bv = v; bi = k; }
    }
    best_v[l] = bv;
    best_i[l] = bi;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s = s >> 1u) {
        if (l < s && better(best_v[l + s], best_i[l + s], best_v[l], best_i[l])) {
            best_v[l] = best_v[l + s];
            best_i[l] = best_i[l + s];
        }
        workgroupBarrier();
    }
    if (l == 0u) { out[e] = best_i[0]; }
}
