// dispatch.wgsl — the cost of launching a kernel (benchmarks only): one
// workgroup of 8 lanes adds one word to each of its own, so a run of these
// back to back in one submission (each reads what the one before wrote, as
// the layers of a step do) costs what the adapter's launches cost.
//
// Bindings: 0 p: Params; 1 src: (>= 8) u32 (read); 2 out: (>= 8) u32.
// Dispatch: (1, 1, 1).

struct Params {
    add: u32,
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

@compute @workgroup_size(8)
fn main(@builtin(local_invocation_id) lid: vec3<u32>) {
    out[lid.x] = out[lid.x] + src[lid.x] + p.add;
}
