// silu_mul.wgsl — out[t, i] = silu(gu[t, i]) · gu[t, inter + i], silu(g) = g / (1 + e^-g).
//
// Bindings:
//   0 p:   Params (uniform)
//   1 gu:  (T, 2·inter) f32, the fused gate|up projection
//   2 out: (T, inter) f32
// Dispatch: (ceil(inter / 64), T, 1). Elementwise, no reduction.

struct Params {
    t: u32,
    inter: u32,
    _p0: u32,
    _p1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> gu: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.y;
    let i = gid.x;
    if (t >= p.t || i >= p.inter) { return; }
    let g = gu[t * 2u * p.inter + i];
    let u = gu[t * 2u * p.inter + p.inter + i];
    out[t * p.inter + i] = g / (1.0 + exp(-g)) * u;
}
