// gemm.cu — Y[t, :N] = X[t, :K] · Wᵀ for small T (decodes and small batches);
// larger T goes to cuBLAS (src/backend/cuda/gemm.rs decides).
//
// Arguments: x (f32, row t at x_off + t·x_stride), w, scales (quantised only),
//   y (f32, row t at y_off + t·y_stride), t, n, k, kp, x_stride, y_stride, x_off, y_off.
// Launch: grid (ceil(N / 8), ceil(T / TM)), block 256 = 8 warps; warp w computes
//   column n = blockIdx.x·8 + w for the TM rows blockIdx.y·TM ...
// Reduction order (batch invariance): lane l takes chunks c = l, l+32, … in
//   increasing c (8 elements for floats, one 32-element block for quantised) and
//   keeps one fma chain per row; then the fixed butterfly of warp_sum. The order
//   depends on K only, never on T or on the other rows. Quantised blocks: s =
//   Σ x·(q - off) and Σx from 0, then acc = fma(d, s, acc) (+ fma(m, Σx, acc));
//   Q8_16 does this per half of 16 with its own d and m.

#define GEMM_TM 4

template <int FMT>
__device__ void gemm_impl(const float* x, const void* w, const float* scales, float* y, u32 t, u32 n, u32 k, u32 kp,
                          u32 x_stride, u32 y_stride, u32 x_off, u32 y_off) {
    u32 warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    u32 col = blockIdx.x * 8 + warp;
    u32 t0 = blockIdx.y * GEMM_TM;
    if (col >= n) return;
    float acc[GEMM_TM];
#pragma unroll
    for (int r = 0; r < GEMM_TM; r++) acc[r] = 0.0f;
    const float* xr[GEMM_TM];
#pragma unroll
    for (int r = 0; r < GEMM_TM; r++) xr[r] = x + x_off + (u64)(t0 + r) * x_stride;
    if (FMT == FMT_F32 || FMT == FMT_F16 || FMT == FMT_BF16) {
        u32 chunks = kp / 8;
        for (u32 c = lane; c < chunks; c += 32) {
            float wv[8];
            if (FMT == FMT_F32) {
                const float4* p = (const float4*)((const float*)w + (u64)col * kp + c * 8);
                float4 a = p[0], b = p[1];
                wv[0] = a.x; wv[1] = a.y; wv[2] = a.z; wv[3] = a.w;
                wv[4] = b.x; wv[5] = b.y; wv[6] = b.z; wv[7] = b.w;
            } else {
                uint4 q = *(const uint4*)((const u16*)w + (u64)col * kp + c * 8);
                u32 qs[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    if (FMT == FMT_F16) {
                        wv[2 * i] = h2f((u16)(qs[i] & 0xffffu));
                        wv[2 * i + 1] = h2f((u16)(qs[i] >> 16));
                    } else {
                        wv[2 * i] = bf2f((u16)(qs[i] & 0xffffu));
                        wv[2 * i + 1] = bf2f((u16)(qs[i] >> 16));
                    }
                }
            }
#pragma unroll
            for (int r = 0; r < GEMM_TM; r++) {
                if (t0 + r < t) {
#pragma unroll
                    for (int i = 0; i < 8; i++) {
                        u32 e = c * 8 + i;
                        float xv = e < k ? xr[r][e] : 0.0f;
                        acc[r] = fmaf(xv, wv[i], acc[r]);
                    }
                }
            }
        }
    } else {
        u32 nb = k / 32;
        for (u32 b = lane; b < nb; b += 32) {
            u64 blk = (u64)col * nb + b;
            float wq[32];
            if (FMT == FMT_Q8_0 || FMT == FMT_Q8_16) {
                const uint4* p = (const uint4*)((const u8*)w + blk * 32);
                uint4 a = p[0], c2 = p[1];
                u32 ws[8] = {a.x, a.y, a.z, a.w, c2.x, c2.y, c2.z, c2.w};
#pragma unroll
                for (int i = 0; i < 32; i++) wq[i] = (float)(signed char)((ws[i / 4] >> (8 * (i % 4))) & 0xffu);
            } else {
                uint4 a = *(const uint4*)((const u8*)w + blk * 16);
                u32 ws[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
                for (int i = 0; i < 16; i++) {
                    u32 byte = (ws[i / 4] >> (8 * (i % 4))) & 0xffu;
                    wq[i] = (float)(byte & 15u);
                    wq[i + 16] = (float)(byte >> 4);
                }
            }
            const int halves = FMT == FMT_Q8_16 ? 2 : 1;
            float off = FMT == FMT_Q4_0 ? 8.0f : 0.0f;
#pragma unroll
            for (int r = 0; r < GEMM_TM; r++) {
                if (t0 + r < t) {
#pragma unroll
                    for (int h = 0; h < halves; h++) {
                        float d, m;
                        if (FMT == FMT_Q8_16) {
                            d = scales[4 * blk + 2 * h];
                            m = scales[4 * blk + 2 * h + 1];
                        } else {
                            d = FMT == FMT_Q4_1 ? scales[2 * blk] : scales[blk];
                            m = FMT == FMT_Q4_1 ? scales[2 * blk + 1] : 0.0f;
                        }
                        float s = 0.0f, sx = 0.0f;
#pragma unroll
                        for (int i = h * 32 / halves; i < (h + 1) * 32 / halves; i++) {
                            float xv = xr[r][b * 32 + i];
                            s = fmaf(xv, wq[i] - off, s);
                            sx += xv;
                        }
                        acc[r] = fmaf(d, s, acc[r]);
                        if (FMT == FMT_Q4_1 || FMT == FMT_Q8_16) acc[r] = fmaf(m, sx, acc[r]);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < GEMM_TM; r++) {
        float v = warp_sum(acc[r]);
        if (lane == 0 && t0 + r < t) y[y_off + (u64)(t0 + r) * y_stride + col] = v;
    }
}

#define GEMM_ENTRY(NAME, FMT)                                                                                       \
    extern "C" __global__ void __launch_bounds__(256) NAME(const float* x, const void* w, const float* scales,       \
                                                           float* y, u32 t, u32 n, u32 k, u32 kp, u32 x_stride,     \
                                                           u32 y_stride, u32 x_off, u32 y_off) {                    \
        gemm_impl<FMT>(x, w, scales, y, t, n, k, kp, x_stride, y_stride, x_off, y_off);                             \
    }

GEMM_ENTRY(gemm_f32, FMT_F32)
GEMM_ENTRY(gemm_f16, FMT_F16)
GEMM_ENTRY(gemm_bf16, FMT_BF16)
GEMM_ENTRY(gemm_q8_0, FMT_Q8_0)
GEMM_ENTRY(gemm_q4_0, FMT_Q4_0)
GEMM_ENTRY(gemm_q4_1, FMT_Q4_1)
GEMM_ENTRY(gemm_q8_16, FMT_Q8_16)
