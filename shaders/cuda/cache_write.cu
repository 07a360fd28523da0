// cache_write.cu — copies the K and V of T new tokens into the paged cache:
// k_cache[slot_mapping[t]] = qkv[t, k_off ..], v_cache[...] = qkv[t, v_off ..],
// kv_width values each (kv_heads · head_dim): f32, or halves (`f16` = 1, each
// rounded to the nearest half, ties to even).
// Launch: grid (ceil(kv_width / 256), T), block 256. A copy, no reduction.

extern "C" __global__ void cache_write(const float* qkv, const u32* slot_mapping, void* k_cache, void* v_cache,
                                       u32 t, u32 kv_width, u32 qkv_stride, u32 k_off, u32 v_off, u32 f16) {
    u32 tok = blockIdx.y;
    u32 e = blockIdx.x * blockDim.x + threadIdx.x;
    if (tok >= t || e >= kv_width) return;
    u64 dst = (u64)slot_mapping[tok] * kv_width + e;
    u64 src = (u64)tok * qkv_stride;
    if (f16) {
        ((u16*)k_cache)[dst] = f2h(qkv[src + k_off + e]);
        ((u16*)v_cache)[dst] = f2h(qkv[src + v_off + e]);
    } else {
        ((float*)k_cache)[dst] = qkv[src + k_off + e];
        ((float*)v_cache)[dst] = qkv[src + v_off + e];
    }
}
