// masked_argmax.cu — greedy sampling under a structured-output mask (see
// shaders/masked_argmax.wgsl): out[i] = the lowest index of the largest value of
// logits row rows[i] among the tokens whose bit is set in mask row i
// (bit k % 32 of word k / 32); 0xffffffff when none is allowed. NaN never wins;
// an allowed −∞ still does.
// Launch: grid (count), block 256; one block per entry.
// Reduction: argmax.cu's block_best. Exact, so order-free.

extern "C" __global__ void __launch_bounds__(256) masked_argmax(const float* x, const u32* mask, const u32* rows,
                                                                u32* out, u32 count, u32 n, u32 words) {
    __shared__ float best_v[256];
    __shared__ u32 best_i[256];
    u32 e = blockIdx.x;
    if (e >= count) return;
    u32 l = threadIdx.x;
    const float* row = x + (u64)rows[e] * n;
    const u32* m = mask + (u64)e * words;
    float bv = __uint_as_float(0xff800000u);  // −∞
    u32 bi = 0xffffffffu;
    for (u32 k = l; k < n; k += 256) {
        float v = row[k];
        if (((m[k >> 5] >> (k & 31)) & 1u) && v == v && better(v, k, bv, bi)) {
            bv = v;
            bi = k;
        }
    }
    u32 best = block_best(best_v, best_i, bv, bi);
    if (l == 0) out[e] = best;
}
