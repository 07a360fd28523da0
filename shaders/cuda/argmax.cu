// argmax.cu — out[r] = the lowest index of the largest value of row r (NaN never wins;
// an all-NaN row gives 0).
// Launch: grid (rows), block 256; one block per row.
// Reduction: thread l scans k = l, l+256, … keeping the first maximum; a fixed tree
//   then keeps the larger value, the lower index on ties. Exact, so order-free.

__device__ __forceinline__ bool better(float v, u32 i, float bv, u32 bi) {
    return v > bv || (v == bv && i < bi);
}

// The fixed tree over a block of 256 threads: each thread's best (bv, bi) in,
// the block's best index out (to every thread). Also used by masked_argmax.cu.
__device__ __forceinline__ u32 block_best(float* best_v, u32* best_i, float bv, u32 bi) {
    u32 l = threadIdx.x;
    best_v[l] = bv;
    best_i[l] = bi;
    __syncthreads();
    for (u32 s = 128; s > 0; s >>= 1) {
        if (l < s && better(best_v[l + s], best_i[l + s], best_v[l], best_i[l])) {
            best_v[l] = best_v[l + s];
            best_i[l] = best_i[l + s];
        }
        __syncthreads();
    }
    return best_i[0];
}

extern "C" __global__ void __launch_bounds__(256) argmax(const float* x, u32* out, u32 rows, u32 n) {
    __shared__ float best_v[256];
    __shared__ u32 best_i[256];
    u32 r = blockIdx.x;
    if (r >= rows) return;
    u32 l = threadIdx.x;
    float bv = -3.4028235e38f;
    u32 bi = 0xffffffffu;
    for (u32 k = l; k < n; k += 256) {
        float v = x[(u64)r * n + k];
        if (v == v && better(v, k, bv, bi)) {
            bv = v;
            bi = k;
        }
    }
    u32 best = block_best(best_v, best_i, bv, bi);
    if (l == 0) out[r] = best == 0xffffffffu ? 0 : best;
}
