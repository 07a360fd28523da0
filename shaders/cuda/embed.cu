// embed.cu — out[t, :] = W[ids[t], :] dequantised to f32 (row gather), and
// dequant: W as f32 rows of Kp (zero padding) for the cuBLAS prefill GEMM.
//
// embed:   grid (T), block 256; thread i writes elements i, i+256, … of row t.
//          Ids at or past `vocab` give a zero row (the host validates ids first).
// dequant: grid (ceil(Kp / 256), rows), block 256; rows row0.. of W into out[r][Kp].
// No reduction: each element is computed as on the CPU.

template <int FMT>
__device__ void embed_impl(const u32* ids, const void* w, const float* scales, float* out, u32 t, u32 d, u32 kp,
                           u32 vocab) {
    u32 tok = blockIdx.x;
    if (tok >= t) return;
    u32 id = ids[tok];
    for (u32 e = threadIdx.x; e < d; e += blockDim.x) {
        out[(u64)tok * d + e] = id < vocab ? w_at<FMT>(w, scales, id, e, kp, d / 32) : 0.0f;
    }
}

template <int FMT>
__device__ void dequant_impl(const void* w, const float* scales, float* out, u32 row0, u32 rows, u32 k, u32 kp) {
    u32 r = blockIdx.y;
    u32 e = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows || e >= kp) return;
    out[(u64)r * kp + e] = e < k ? w_at<FMT>(w, scales, (u64)row0 + r, e, kp, k / 32) : 0.0f;
}

#define EMBED_ENTRY(NAME, DQ, FMT)                                                                               \
    extern "C" __global__ void NAME(const u32* ids, const void* w, const float* scales, float* out, u32 t, u32 d, \
                                    u32 kp, u32 vocab) {                                                         \
        embed_impl<FMT>(ids, w, scales, out, t, d, kp, vocab);                                                   \
    }                                                                                                            \
    extern "C" __global__ void DQ(const void* w, const float* scales, float* out, u32 row0, u32 rows, u32 k,     \
                                  u32 kp) {                                                                      \
        dequant_impl<FMT>(w, scales, out, row0, rows, k, kp);                                                    \
    }

EMBED_ENTRY(embed_f32, dequant_f32, FMT_F32)
EMBED_ENTRY(embed_f16, dequant_f16, FMT_F16)
EMBED_ENTRY(embed_bf16, dequant_bf16, FMT_BF16)
EMBED_ENTRY(embed_q8_0, dequant_q8_0, FMT_Q8_0)
EMBED_ENTRY(embed_q4_0, dequant_q4_0, FMT_Q4_0)
EMBED_ENTRY(embed_q4_1, dequant_q4_1, FMT_Q4_1)
EMBED_ENTRY(embed_q8_16, dequant_q8_16, FMT_Q8_16)
