// bias_add.wgsl — x[off + t·stride + i] += bias[i] for i < n: the q/k/v biases
// (Qwen 2) added to the fused qkv rows before rope.
//
// Bindings:
//   0 p:    Params (uniform)
//   1 bias: (n) f32
//   2 x:    rows of f32, read and written in place
// Dispatch: (ceil(n / 64), T, 1). Elementwise, no reduction.

struct Params {
    t: u32,
    n: u32,
    stride: u32,
    off: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> bias: array<f32>;
@group(0) @binding(2) var<storage, read_write> x: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.y;
    let i = gid.x;
    if (t >= p.t || i >= p.n) { return; }
    let at = p.off + t * p.stride + i;
    x[at] = x[at] + bias[i];
}
