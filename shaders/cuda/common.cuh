// common.cuh — types and helpers shared by the CUDA kernels. The backend
// (src/backend/cuda/) prepends this file to every kernel file and compiles the
// whole program once with NVRTC at start-up; no CUDA headers are needed.
//
// Weight layouts (src/quant.rs `repack`), matrix W[N][K], Kp = roundup(K, 8):
//   F32:        rows of Kp floats (zero padding past K)
//   F16 / BF16: rows of Kp halves
//   Q8_0:       data[N][K/32][32] int8, scales[N][K/32] f32 d; w = d·q
//   Q4_0:       data[N][K/32][16] bytes, scales f32 d; element j < 16 is the low
//               nibble of byte j, element j + 16 its high nibble; w = d·(q − 8)
//   Q4_1:       as Q4_0 with scales[N][K/32] = (d, m) pairs; w = d·q + m

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;
typedef unsigned long long u64;

#define FMT_F32 0
#define FMT_F16 1
#define FMT_BF16 2
#define FMT_Q8_0 3
#define FMT_Q4_0 4
#define FMT_Q4_1 5
#define FMT_Q8_16 6

#define NEG_BIG (-3.0e38f)

__device__ __forceinline__ float h2f(u16 h) {
#ifdef __CUDACC_RTC__
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#else
    return wllm_emu_h2f(h);  // the tests' CPU emulation (tests/cuda_emu/runtime.h)
#endif
}

// f32 to the nearest half (ties to even): the f16 KV cache's writes.
__device__ __forceinline__ u16 f2h(float f) {
#ifdef __CUDACC_RTC__
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
#else
    return wllm_emu_f2h(f);
#endif
}

// KV cache dtypes (`KvDtype`): f32, halves, or q8_0 rows of kv_w int8 values
// then kv_w / 32 f32 scales (the layout of shaders/cache_write.wgsl).
#define KV_F32 0
#define KV_F16 1
#define KV_Q8_0 2

// Bytes of a KV cache row of kv_w values of `dtype`.
__device__ __forceinline__ u64 kv_row_bytes(u32 kv_w, u32 dtype) {
    return dtype == KV_Q8_0 ? (u64)kv_w + kv_w / 8 : (u64)kv_w * (dtype == KV_F16 ? 2 : 4);
}

// Element e of the KV cache row at `row` (kv_w values of `dtype`).
__device__ __forceinline__ float kv_at(const u8* row, u32 kv_w, u32 e, u32 dtype) {
    if (dtype == KV_Q8_0) return (float)((const signed char*)row)[e] * ((const float*)(row + kv_w))[e / 32];
    return dtype == KV_F16 ? h2f(((const u16*)row)[e]) : ((const float*)row)[e];
}

// 32 values as a q8_0 block: d = amax / 127, q = round(x · 127 / amax), half
// away from zero (as cache_write.wgsl and `KvDtype::round_trip`).
__device__ __forceinline__ void q8_block(const float* x, u8* q, float* d) {
    float amax = 0.0f;
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
    float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int i = 0; i < 32; i++) {
        float v = x[i] * id;
        float r = fminf(fmaxf(copysignf(floorf(fabsf(v) + 0.5f), v), -127.0f), 127.0f);
        ((signed char*)q)[i] = (signed char)(int)r;
    }
    *d = amax / 127.0f;
}

// Element i of a block of 32 times the Walsh–Hadamard matrix:
// Σ_m (−1)^popcount(i & m) x[m], m ascending (`KvDtype::rotate_block`; each
// term ±x[m], so the sum's bits are the WGSL writer's). q8_0 caches hold
// their K blocks rotated; attention reads them with the query rotated too.
__device__ __forceinline__ float hadamard32_at(const float* x, u32 i) {
    float y = 0.0f;
    for (u32 m = 0; m < 32; m++) y = (__popc(i & m) & 1) ? y - x[m] : y + x[m];
    return y;
}

__device__ __forceinline__ float bf2f(u16 h) {
    return __uint_as_float(((u32)h) << 16);
}

// Sum over the 32 lanes of a warp by a fixed xor butterfly: every lane gets the
// same bits, and the order depends on nothing but the lane values.
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Element e of row `row` of a weight matrix, dequantised (`nb` = K/32 blocks per row).
template <int FMT>
__device__ __forceinline__ float w_at(const void* w, const float* scales, u64 row, u32 e, u32 kp, u32 nb) {
    if (FMT == FMT_F32) return ((const float*)w)[row * kp + e];
    if (FMT == FMT_F16) return h2f(((const u16*)w)[row * kp + e]);
    if (FMT == FMT_BF16) return bf2f(((const u16*)w)[row * kp + e]);
    u64 b = row * nb + e / 32;
    u32 j = e % 32;
    if (FMT == FMT_Q8_0) return scales[b] * (float)((const signed char*)w)[b * 32 + j];
    if (FMT == FMT_Q8_16) {
        float d = scales[4 * b + 2 * (j / 16)], m = scales[4 * b + 2 * (j / 16) + 1];
        float q = (float)((const signed char*)w)[b * 32 + j];
        return m == 0.0f ? d * q : d * q + m;
    }
    u8 byte = ((const u8*)w)[b * 16 + (j & 15)];
    float q = (float)(j < 16 ? (byte & 15) : (byte >> 4));
    if (FMT == FMT_Q4_0) return scales[b] * (q - 8.0f);
    return scales[2 * b] * q + scales[2 * b + 1];
}
