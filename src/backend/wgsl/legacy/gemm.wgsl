// gemm.wgsl — Y[T,N] = X[T,K] · W[N,K]ᵀ  (weights as stored: one row per output)
//
// Bindings (generated per weight format, see src/kernels/gemm.rs):
//   0 p:      Params (uniform)
//   1 x:      (T, x_stride) f32, row t at x_off + t*x_stride; vec4<f32> when K % 8 == 0
//   2 w:      (N, K) weights in the layout of weights.wgsl
//   3 scales: (N, K/32) f32 d, or vec2(d, m) for Q4_1 — quantised formats only
//   4 y:      (T, y_stride) f32, row t at y_off + t*y_stride (read_write)
// Weights larger than one storage binding are bound window by window (rows
//   row0.., y_off advanced by row0), one dispatch each.
// Dispatch: workgroups (ceil(N / (TN*WG)), ceil(T / TM), 1); invocation
//   (gid.x, gid.y) computes the TM x TN output tile at rows gid.y*TM, columns gid.x*TN.
// Reduction order (batch invariance): every output element is one f32
//   accumulator updated with fma in increasing k — floats: acc = fma(x_k, w_k, acc)
//   for k = 0..Kp (zero padding past K); quantised: per block b in order,
//   s = fma(x_j, q_j, s) for j = 0..31 from s = 0, then acc = fma(d, s, acc)
//   (Q4_1 then acc = fma(m, Σx_j, acc), Σx_j summed left to right). The order is
//   the same for every tile shape, so the decode (TM = 1) and prefill (TM > 1)
//   variants give the same bits for a row whatever T and the other rows are.

struct Params {
    t: u32,
    n: u32,
    k: u32,
    chunks: u32,   // floats: Kp / 8; quantised: K / 32
    x_stride: u32,
    y_stride: u32,
    x_off: u32,
    y_off: u32,
    w_row: u32,    // w array elements per weight row
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
