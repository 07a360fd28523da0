// rms_norm.wgsl — y[i] = h / sqrt(mean(h²) + eps) · w, where h is input row src(i)
// and, when p.residual == 1, h = r[src(i)] + x[src(i)] is also written back to r
// (the fused residual add). src(i) = rows[i] when p.gather == 1, else i.
//
// Bindings:
//   0 p:    Params (uniform)
//   1 x:    (T_in, d) f32
//   2 w:    (d) f32 norm weight
//   3 r:    (T_in, d) f32 residual stream (read_write; unused when p.residual == 0)
//   4 rows: (T) u32 source rows (unused when p.gather == 0)
//   5 y:    (T, d) f32 output
// Dispatch: (T, 1, 1) workgroups of WG = 64; one workgroup per output row.
// Reduction order: invocation l sums h[k]² for k = l, l+64, … in increasing k;
//   then a fixed binary tree over the 64 partials. Depends on d only, never on T.

struct Params {
    t: u32,
    d: u32,
    eps: f32,
    residual: u32,
    gather: u32,
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> r: array<f32>;
@group(0) @binding(4) var<storage, read> rows: array<u32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;

var<workgroup> part: array<f32, 64>;

fn h_at(base: u32, k: u32) -> f32 {
    if (p.residual == 1u) {
        return r[base + k] + x[base + k];
    }
    return x[base + k];
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = wid.x;
    if (i >= p.t) { return; }
    var src = i;
    if (p.gather == 1u) { src = rows[i]; }
    let base = src * p.d;
    let l = lid.x;
    var acc = 0.0;
    for (var k = l; k < p.d; k = k + WG) {
        let h = h_at(base, k);
        acc = fma(h, h, acc);
    }
    part[l] = acc;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (l < s) { part[l] = part[l] + part[l + s]; }
        workgroupBarrier();
    }
    let scale = 1.0 / sqrt(part[0] / f32(p.d) + p.eps);
    for (var k = l; k < p.d; k = k + WG) {
        let h = h_at(base, k);
        if (p.residual == 1u) { r[base + k] = h; }
        y[i * p.d + k] = h * scale * w[k];
    }
}
