// act_mul.wgsl — out[t, i] = act(gu[t, i]) · gu[t, inter + i]: a gated MLP's
// activation, act = silu (p.act 0: g / (1 + e^-g)) or gelu with the tanh
// approximation (p.act 1: 0.5·g·(1 + tanh(√(2/π)·(g + 0.044715·g³)))).
//
// Bindings:
//   0 p:   Params (uniform)
//   1 gu:  (T, 2·inter) f32, the fused gate|up projection
//   2 out: (T, inter) f32
// Dispatch: (ceil(inter / 64), T, 1). Elementwise, no reduction.

struct Params {
    t: u32,
    inter: u32,
    act: u32,
    _p1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> gu: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

// tanh through exp of a clamped argument: no inf/inf at large |x| on any driver
// (tanh(±10) is ±1 in f32).
fn tanh_safe(x: f32) -> f32 {
    let e = exp(2.0 * clamp(x, -10.0, 10.0));
    return (e - 1.0) / (e + 1.0);
}

fn act(g: f32) -> f32 {
    if (p.act == 1u) {
        return 0.5 * g * (1.0 + tanh_safe(0.7978845608028654 * (g + 0.044715 * g * g * g)));
    }
    return g / (1.0 + exp(-g));
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.y;
    let i = gid.x;
    if (t >= p.t || i >= p.inter) { return; }
    let g = gu[t * 2u * p.inter + i];
    let u = gu[t * 2u * p.inter + p.inter + i];
    out[t * p.inter + i] = act(g) * u;
}
