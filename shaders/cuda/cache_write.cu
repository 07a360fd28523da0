// cache_write.cu — copies the K and V of T new tokens into the paged cache:
// k_cache[slot_mapping[t]] = qkv[t, k_off ..], v_cache[...] = qkv[t, v_off ..],
// kv_width floats each (kv_heads · head_dim).
// Launch: grid (ceil(kv_width / 256), T), block 256. A copy, no reduction.

extern "C" __global__ void cache_write(const float* qkv, const u32* slot_mapping, float* k_cache, float* v_cache,
                                       u32 t, u32 kv_width, u32 qkv_stride, u32 k_off, u32 v_off) {
    u32 tok = blockIdx.y;
    u32 e = blockIdx.x * blockDim.x + threadIdx.x;
    if (tok >= t || e >= kv_width) return;
    u64 dst = (u64)slot_mapping[tok] * kv_width + e;
    u64 src = (u64)tok * qkv_stride;
    k_cache[dst] = qkv[src + k_off + e];
    v_cache[dst] = qkv[src + v_off + e];
}
