// embed.wgsl — out[t, :] = W[ids[t], :] dequantised to f32 (row gather).
//
// Bindings (generated per weight format, see src/kernels/embed.rs):
//   0 p:      Params (uniform)
//   1 ids:    (T) u32 token ids
//   2 w:      (vocab, d) weights in the layout of weights.wgsl
//   3 scales: (vocab, d/32) quantised formats only
//   last out: (T, d) f32
// Dispatch: (ceil(chunks / 64), T, 1) per window of rows; one invocation per 8
//   (floats) or 32 (quantised) elements; tokens outside the window return early.
//   No reduction: each element is w·d (+ m) as on the CPU.

struct Params {
    t: u32,
    d: u32,
    chunks: u32,
    w_row: u32,
    vocab: u32,
    row0: u32,     // the window of rows bound at binding 2: row0 .. row0 + rows
    rows: u32,
    _p0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> ids: array<u32>;

fn put8(o: u32, k: u32, v: F8) {
    let e = array<f32, 8>(v.a.x, v.a.y, v.a.z, v.a.w, v.b.x, v.b.y, v.b.z, v.b.w);
    for (var i = 0u; i < 8u; i = i + 1u) {
        if (k + i < p.d) { out[o + k + i] = e[i]; }
    }
}
