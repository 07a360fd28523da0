// rms_norm.cu — y[i] = h / sqrt(mean(h²) + eps) · w over rows of d, where h is
// input row src(i) and, when `residual` is set, h = r[src] + x[src] is also
// written back to r (the fused residual add). src(i) = rows[i] when `gather`, else i.
//
// Launch: grid (T), block 256; one block per output row.
// Reduction order: thread l sums h[k]² for k = l, l+256, … in increasing k, then
//   a fixed binary tree in shared memory. Depends on d only, never on T.

extern "C" __global__ void __launch_bounds__(256) rms_norm(const float* x, const float* w, float* r, const u32* rows,
                                                          float* y, u32 t, u32 d, float eps, u32 residual,
                                                          u32 gather) {
    __shared__ float part[256];
    u32 i = blockIdx.x;
    if (i >= t) return;
    u32 src = gather ? rows[i] : i;
    u64 base = (u64)src * d;
    u32 l = threadIdx.x;
    float acc = 0.0f;
    for (u32 k = l; k < d; k += 256) {
        float h = residual ? r[base + k] + x[base + k] : x[base + k];
        acc = fmaf(h, h, acc);
    }
    part[l] = acc;
    __syncthreads();
    for (u32 s = 128; s > 0; s >>= 1) {
        if (l < s) part[l] += part[l + s];
        __syncthreads();
    }
    float scale = 1.0f / sqrtf(part[0] / (float)d + eps);
    for (u32 k = l; k < d; k += 256) {
        float h = residual ? r[base + k] + x[base + k] : x[base + k];
        if (residual) r[base + k] = h;
        y[(u64)i * d + k] = h * scale * w[k];
    }
}
