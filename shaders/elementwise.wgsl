// elementwise.wgsl — an op over the first n floats of x, in place:
// p.op 0: x = x · a (Gemma's embedding scale); p.op 1: x = a · tanh(x / a)
// (Gemma 2's final logit soft-capping).
//
// Bindings:
//   0 p: Params (uniform)
//   1 x: (n) f32, read and written in place
// Dispatch: (min(ceil(n / 64), 4096), 1, 1); each invocation steps over x by
//   the dispatch's width. Elementwise, no reduction.

struct Params {
    n: u32,
    op: u32,
    a: f32,
    _p0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;

fn tanh_safe(v: f32) -> f32 {
    let e = exp(2.0 * clamp(v, -10.0, 10.0));
    return (e - 1.0) / (e + 1.0);
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let width = nwg.x * 64u;
    for (var i = gid.x; i < p.n; i = i + width) {
        if (p.op == 1u) {
            x[i] = p.a * tanh_safe(x[i] / p.a);
        } else {
            x[i] = x[i] * p.a;
        }
    }
}
