// read_runs4.wgsl — read roof, CPU-friendly pattern (benchmarks only): each
// invocation reads its own contiguous run of vec4<u32>, four at a time into four
// independent accumulators (no dependency chain between loads).
//
// Bindings: 0 p: Params; 1 src: (n4) vec4<u32>; 2 out: (invocations) u32.
// Dispatch: (groups, 1, 1) workgroups of 64; invocation i reads src[i*per .. (i+1)*per].

struct Params {
    n4: u32,
    per: u32,
    _p0: u32,
    _p1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    var a = vec4<u32>(0u);
    var b = vec4<u32>(0u);
    var c = vec4<u32>(0u);
    var d = vec4<u32>(0u);
    let end = min((gid.x + 1u) * p.per, p.n4);
    var i = gid.x * p.per;
    for (; i + 4u <= end; i = i + 4u) {
        a = a ^ src[i];
        b = b ^ src[i + 1u];
        c = c ^ src[i + 2u];
        d = d ^ src[i + 3u];
    }
    for (; i < end; i = i + 1u) {
        a = a ^ src[i];
    }
    let r = a ^ b ^ c ^ d;
    out[gid.x] = r.x ^ r.y ^ r.z ^ r.w;
}
