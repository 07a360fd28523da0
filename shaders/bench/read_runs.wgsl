// read_runs.wgsl — read roof, plain pattern (benchmarks only):
// every invocation XORs its own contiguous run of vec4<u32> and writes one word.
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
    var acc = vec4<u32>(0u);
    let end = min((gid.x + 1u) * p.per, p.n4);
    for (var i = gid.x * p.per; i < end; i = i + 1u) {
        acc = acc ^ src[i];
    }
    out[gid.x] = acc.x ^ acc.y ^ acc.z ^ acc.w;
}
