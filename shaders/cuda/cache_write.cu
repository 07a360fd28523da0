// cache_write.cu — copies the K and V of T new tokens into the paged cache:
// k_cache[slot_mapping[t]] = qkv[t, k_off ..], v_cache[...] = qkv[t, v_off ..],
// kv_width values each (kv_heads · head_dim) of `dtype` (common.cuh's KV_*):
// f32; halves (each rounded to the nearest half, ties to even); or q8_0, where
// thread e quantises block e of 32 values (kv_width a multiple of 32), a K
// block after rotating it (hadamard32_at, as cache_write.wgsl).
// Launch: grid (ceil(kv_width / 256), T), block 256. A copy, no reduction.

extern "C" __global__ void cache_write(const float* qkv, const u32* slot_mapping, void* k_cache, void* v_cache,
                                       u32 t, u32 kv_width, u32 qkv_stride, u32 k_off, u32 v_off, u32 dtype) {
    u32 tok = blockIdx.y;
    u32 e = blockIdx.x * blockDim.x + threadIdx.x;
    if (tok >= t || e >= kv_width) return;
    u64 slot = slot_mapping[tok];
    u64 src = (u64)tok * qkv_stride;
    if (dtype == KV_Q8_0) {
        if (e >= kv_width / 32) return;
        u64 row = slot * kv_row_bytes(kv_width, dtype);
        u8* k = (u8*)k_cache + row;
        u8* v = (u8*)v_cache + row;
        float rk[32];
        for (u32 i = 0; i < 32; i++) rk[i] = hadamard32_at(qkv + src + k_off + 32 * e, i);
        q8_block(rk, k + 32 * e, (float*)(k + kv_width) + e);
        q8_block(qkv + src + v_off + 32 * e, v + 32 * e, (float*)(v + kv_width) + e);
        return;
    }
    u64 dst = slot * kv_width + e;
    if (dtype == KV_F16) {
        ((u16*)k_cache)[dst] = f2h(qkv[src + k_off + e]);
        ((u16*)v_cache)[dst] = f2h(qkv[src + v_off + e]);
    } else {
        ((float*)k_cache)[dst] = qkv[src + k_off + e];
        ((float*)v_cache)[dst] = qkv[src + v_off + e];
    }
}
