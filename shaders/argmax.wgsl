// argmax.wgsl — out[r] = the lowest index of the largest value of row r (NaN never wins).
//
// Bindings:
//   0 p:   Params (uniform)
//   1 x:   (rows, n) f32 logits
//   2 out: (rows) u32
// A template: the workgroup size WG (a power of two) is the adapter's — 64 on
// CPU adapters (a lane's loop is a vector op there), 256 on GPUs, where a
// row of 49,152 logits is otherwise 768 dependent loads a lane.
// Dispatch: (rows, 1, 1) workgroups of WG; one workgroup per row.
// Reduction: invocation l scans k = l, l+WG, … keeping the first maximum; a fixed
//   tree then keeps the larger value, the lower index on ties. Exact, so order-free.

struct Params {
    rows: u32,
    n: u32,
    _p0: u32,
    _p1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

var<workgroup> best_v: array<f32, {{ wg }}>;
var<workgroup> best_i: array<u32, {{ wg }}>;

fn better(v: f32, i: u32, bv: f32, bi: u32) -> bool {
    return v > bv || (v == bv && i < bi);
}

@compute @workgroup_size({{ wg }})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let r = wid.x;
    if (r >= p.rows) { return; }
    let l = lid.x;
    var bv = -3.4028235e38;
    var bi = 0xffffffffu;
    for (var k = l; k < p.n; k = k + {{ wg }}u) {
        let v = x[r * p.n + k];
        // `v == v` is false for NaN.
        if (v == v && better(v, k, bv, bi)) { bv = v; bi = k; }
    }
    best_v[l] = bv;
    best_i[l] = bi;
    workgroupBarrier();
    for (var s = {{ wg // 2 }}u; s > 0u; s = s >> 1u) {
        if (l < s && better(best_v[l + s], best_i[l + s], best_v[l], best_i[l])) {
            best_v[l] = best_v[l + s];
            best_i[l] = best_i[l + s];
        }
        workgroupBarrier();
    }
    if (l == 0u) { out[r] = select(best_i[0], 0u, best_i[0] == 0xffffffffu); }
}
