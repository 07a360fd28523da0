// silu_mul.cu — out[t, i] = silu(gu[t, i]) · gu[t, inter + i], silu(g) = g / (1 + e^−g).
// Launch: grid (ceil(inter / 256), T), block 256. Elementwise, no reduction.

extern "C" __global__ void silu_mul(const float* gu, float* out, u32 t, u32 inter) {
    u32 tok = blockIdx.y;
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (tok >= t || i >= inter) return;
    float g = gu[(u64)tok * 2 * inter + i];
    float u = gu[(u64)tok * 2 * inter + inter + i];
    out[(u64)tok * inter + i] = g / (1.0f + expf(-g)) * u;
}
