// fma_roof.wgsl — the adapter's f32 FMA throughput (benchmarks only): every
// invocation runs p.iters rounds of 8 independent vec4 fma chains in registers
// (64 flops a round) and writes one word so nothing is optimised away.
//
// Bindings: 0 p: Params; 1 src: (>= 1) f32 seed (read); 2 out: (invocations) f32.
// Dispatch: (groups, 1, 1) workgroups of 64.

struct Params {
    iters: u32,
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let s = src[0] + f32(gid.x) * 1e-7;
    let m = vec4<f32>(0.999999, 0.999998, 0.999997, 0.999996);
    let k = vec4<f32>(1e-7);
    var a0 = vec4<f32>(s);
    var a1 = vec4<f32>(s + 1.0);
    var a2 = vec4<f32>(s + 2.0);
    var a3 = vec4<f32>(s + 3.0);
    var a4 = vec4<f32>(s + 4.0);
    var a5 = vec4<f32>(s + 5.0);
    var a6 = vec4<f32>(s + 6.0);
    var a7 = vec4<f32>(s + 7.0);
    for (var i = 0u; i < p.iters; i = i + 1u) {
        a0 = fma(a0, m, k);
        a1 = fma(a1, m, k);
        a2 = fma(a2, m, k);
        a3 = fma(a3, m, k);
        a4 = fma(a4, m, k);
        a5 = fma(a5, m, k);
        a6 = fma(a6, m, k);
        a7 = fma(a7, m, k);
    }
    let r = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
    out[gid.x] = r.x + r.y + r.z + r.w;
}
