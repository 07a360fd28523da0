// read_strided.wgsl — read roof, GPU-friendly pattern (benchmarks only): in each
// round the invocations of the dispatch read consecutive vec4<u32> (invocation i
// reads src[i], src[i + T], src[i + 2T], … with T invocations), XORing into four
// independent accumulators.
//
// Bindings: 0 p: Params; 1 src: (n4) vec4<u32>; 2 out: (invocations) u32.
// Dispatch: (groups, 1, 1) workgroups of 64; T = groups * 64 = p.threads.

struct Params {
    n4: u32,
    threads: u32,
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
    let t = p.threads;
    var i = gid.x;
    for (; i + 3u * t < p.n4; i = i + 4u * t) {
        a = a ^ src[i];
        b = b ^ src[i + t];
        c = c ^ src[i + 2u * t];
        d = d ^ src[i + 3u * t];
    }
    for (; i < p.n4; i = i + t) {
        a = a ^ src[i];
    }
    let r = a ^ b ^ c ^ d;
    out[gid.x] = r.x ^ r.y ^ r.z ^ r.w;
}
