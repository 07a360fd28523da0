// act_mul.cu — out[t, i] = act(gu[t, i]) · gu[t, inter + i]: a gated MLP's
// activation, act = silu (act 0: g / (1 + e^−g)) or gelu with the tanh
// approximation (act 1: 0.5·g·(1 + tanh(√(2/π)·(g + 0.044715·g³)))).
// Launch: grid (ceil(inter / 256), T), block 256. Elementwise, no reduction.

extern "C" __global__ void act_mul(const float* gu, float* out, u32 t, u32 inter, u32 act) {
    u32 tok = blockIdx.y;
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (tok >= t || i >= inter) return;
    float g = gu[(u64)tok * 2 * inter + i];
    float u = gu[(u64)tok * 2 * inter + inter + i];
    float a = act == 1 ? 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)))
                       : g / (1.0f + expf(-g));
    out[(u64)tok * inter + i] = a * u;
}
