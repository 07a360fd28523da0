// rope.wgsl — rotary position embedding, in place, for the first p.heads heads of
// each row (q heads then k heads of a fused qkv row).
//
// Bindings:
//   0 p:     Params (uniform)
//   1 pos:   (T) u32 position of each token
//   2 table: (max_pos, head_dim/2) vec2<f32> (cos, sin) of pos · θ_i, built on the host in f64
//   3 x:     (T, stride) f32; head h of row t starts at t*stride + h*head_dim (read_write)
// Pairing p.pairing: 0 = rotate-half (i, i + head_dim/2; HF checkpoints),
//   1 = adjacent (2i, 2i+1; GGUF llama, whose q/k rows the converter permuted).
// Dispatch: (ceil(heads·head_dim/2 / 64), T, 1); one invocation per rotated pair.
// No reduction: every element depends only on its own pair and position.

struct Params {
    t: u32,
    heads: u32,
    head_dim: u32,
    stride: u32,
    pairing: u32,
    max_pos: u32,
    _p0: u32,
    _p1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> pos: array<u32>;
@group(0) @binding(2) var<storage, read> table: array<vec2<f32>>;
@group(0) @binding(3) var<storage, read_write> x: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let half_d = p.head_dim / 2u;
    let t = gid.y;
    if (t >= p.t || gid.x >= p.heads * half_d) { return; }
    let h = gid.x / half_d;
    let i = gid.x % half_d;
    let cs = table[min(pos[t], p.max_pos - 1u) * half_d + i];
    let base = t * p.stride + h * p.head_dim;
    var a = base + i;
    var b = base + i + half_d;
    if (p.pairing == 1u) {
        a = base + 2u * i;
        b = a + 1u;
    }
    let x0 = x[a];
    let x1 = x[b];
    x[a] = x0 * cs.x - x1 * cs.y;
    x[b] = x0 * cs.y + x1 * cs.x;
}
