// head_norm.wgsl — RMSNorm of each head, in place: the head_dim floats v of
// head h of row t (at off + t·stride + h·hd) become v / sqrt(mean(v²) + eps) · w
// (Qwen 3's and Gemma 3's q/k norms, before rope).
//
// Bindings:
//   0 p: Params (uniform)
//   1 w: (hd) f32 norm weight
//   2 x: rows of f32, read and written in place
// Dispatch: (heads, T, 1) workgroups of WG = 64; one workgroup per (head, row).
// Reduction order: invocation l sums v[k]² for k = l, l+64, … in increasing k;
//   then a fixed binary tree over the 64 partials. Depends on hd only, never on T.

struct Params {
    t: u32,
    heads: u32,
    hd: u32,
    stride: u32,
    off: u32,
    eps: f32,
    _p0: u32,
    _p1: u32,
}

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read_write> x: array<f32>;

var<workgroup> part: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let h = wid.x;
    let t = wid.y;
    let l = lid.x;
    let inside = h < p.heads && t < p.t;
    let base = p.off + t * p.stride + h * p.hd;
    var acc = 0.0;
    if (inside) {
        for (var k = l; k < p.hd; k = k + WG) {
            let v = x[base + k];
            acc = fma(v, v, acc);
        }
    }
    part[l] = acc;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (l < s) { part[l] = part[l] + part[l + s]; }
        workgroupBarrier();
    }
    if (!inside) { return; }
    let scale = 1.0 / sqrt(part[0] / f32(p.hd) + p.eps);
    for (var k = l; k < p.hd; k = k + WG) {
        x[base + k] = x[base + k] * scale * w[k];
    }
}
