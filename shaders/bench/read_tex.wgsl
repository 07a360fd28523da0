// read_tex.wgsl — read roof through a texture (benchmarks only), the way the
// gemm reads weights on CPU adapters: an rgba32uint texture of p.width texels a
// row; workgroup g reads rows g, g + groups, …, its lanes consecutive texels of
// each row (lane l: texels l, l + 64, …), XORing into four independent
// accumulators. The texture is bound as a read-only storage texture, as the
// gemm binds it (on llvmpipe an image load is inline code where a sampled
// texel fetch calls a generic function); the read roof is the best of the read
// kernels.
//
// Bindings: 0 p: Params; 1 src: texture_storage_2d<rgba32uint, read> (width x rows texels);
//           2 out: (invocations) u32.
// Dispatch: (groups, 1, 1) workgroups of 64; p.groups = groups. p.width is a
// multiple of 256.

struct Params {
    width: u32,
    rows: u32,
    groups: u32,
    _p0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var src: texture_storage_2d<rgba32uint, read>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    var a = vec4<u32>(0u);
    var b = vec4<u32>(0u);
    var c = vec4<u32>(0u);
    var d = vec4<u32>(0u);
    for (var r = wid.x; r < p.rows; r = r + p.groups) {
        for (var x = lid.x; x < p.width; x = x + 256u) {
            a = a ^ textureLoad(src, vec2<u32>(x, r));
            b = b ^ textureLoad(src, vec2<u32>(x + 64u, r));
            c = c ^ textureLoad(src, vec2<u32>(x + 128u, r));
            d = d ^ textureLoad(src, vec2<u32>(x + 192u, r));
        }
    }
    let v = a ^ b ^ c ^ d;
    out[wid.x * 64u + lid.x] = v.x ^ v.y ^ v.z ^ v.w;
}
