// paged_attention.cu — varlen causal attention over the paged KV cache; one
// launch serves prefill chunks and decodes of many sequences together.
//
// Arguments: q (T, q_stride) f32, query head h of token t at t·q_stride + h·hd (rope
//   applied); k_cache, v_cache (num_blocks·block_size, kv_heads·hd) of `dtype`
//   (common.cuh's KV_*: f32, halves, q8_0 rows); positions,
//   token_seq (T) u32; block_tables (S, max_blocks) u32; out (T, heads·hd) f32.
//   Token t attends to positions 0..=positions[t] of sequence token_seq[t]; query
//   head h reads KV head h / (heads / kv_heads). hd ≤ 256. Under a sliding window
//   (window > 0) a token with n keys attends to keys n - window .. n - 1 only; a
//   score is q·k · scale, then softcap · tanh(score / softcap) where softcap > 0.
// Launch: grid (heads, T), block ATT_WARPS·32. Lane l of a warp owns dimensions
//   l, l+32, … of the head; warp w visits keys j ≡ w (mod ATT_WARPS) from the
//   window's start rounded down to ATT_WARPS, in increasing j
//   with an online softmax (running max m, sum s, acc[hd]); each score is a
//   per-lane fma chain over its dimensions, then warp_sum.
// Reduction order (batch invariance): warps are merged in warp order 0..ATT_WARPS-1.
//   The order depends only on the key count, never on T, on other sequences, on
//   chunking, or on which blocks hold the keys.

#define ATT_WARPS 8
#define ATT_DPL 8  // dimensions per lane: hd ≤ 32·ATT_DPL

extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32)
    paged_attention(const float* q, const void* k_cache, const void* v_cache, const u32* positions,
                    const u32* token_seq, const u32* block_tables, float* out, u32 t, u32 heads, u32 kv_heads,
                    u32 hd, u32 q_stride, u32 block_size, u32 max_blocks, float scale, u32 window,
                    float softcap, u32 dtype) {
    __shared__ float sh_m[ATT_WARPS];
    __shared__ float sh_s[ATT_WARPS];
    __shared__ float sh_acc[ATT_WARPS][32 * ATT_DPL];
    u32 h = blockIdx.x, tok = blockIdx.y;
    if (h >= heads || tok >= t) return;
    u32 warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    u32 kvh = h / (heads / kv_heads);
    u32 kv_w = kv_heads * hd;
    const float* qh = q + (u64)tok * q_stride + (u64)h * hd;
    float qv[ATT_DPL], acc[ATT_DPL];
#pragma unroll
    for (int i = 0; i < ATT_DPL; i++) {
        u32 d = lane + 32 * i;
        // q8_0 keys are stored rotated (H·k): read them with H·q / 32.
        qv[i] = d >= hd ? 0.0f : dtype == KV_Q8_0 ? hadamard32_at(qh + d / 32 * 32, d % 32) * (1.0f / 32.0f) : qh[d];
        acc[i] = 0.0f;
    }
    u32 pos = positions[tok];
    const u32* table = block_tables + (u64)token_seq[tok] * max_blocks;
    float m = NEG_BIG, s = 0.0f;
    u32 lo = window > 0 && pos + 1 > window ? pos + 1 - window : 0;
    for (u32 j = lo / ATT_WARPS * ATT_WARPS + warp; j <= pos; j += ATT_WARPS) {
        if (j < lo) continue;
        u64 slot = (u64)table[j / block_size] * block_size + j % block_size;
        u64 row = slot * kv_row_bytes(kv_w, dtype);
        const u8* kr = (const u8*)k_cache + row;
        const u8* vr = (const u8*)v_cache + row;
        u32 e0 = kvh * hd;
        float part = 0.0f;
#pragma unroll
        for (int i = 0; i < ATT_DPL; i++) {
            u32 d = lane + 32 * i;
            if (d < hd) part = fmaf(qv[i], kv_at(kr, kv_w, e0 + d, dtype), part);
        }
        float score = warp_sum(part) * scale;
        if (softcap > 0.0f) score = softcap * tanhf(score / softcap);
        float m_new = fmaxf(m, score);
        float corr = expf(m - m_new);
        float p = expf(score - m_new);
        s = s * corr + p;
#pragma unroll
        for (int i = 0; i < ATT_DPL; i++) {
            u32 d = lane + 32 * i;
            if (d < hd) acc[i] = fmaf(p, kv_at(vr, kv_w, e0 + d, dtype), acc[i] * corr);
        }
        m = m_new;
    }
    if (lane == 0) {
        sh_m[warp] = m;
        sh_s[warp] = s;
    }
#pragma unroll
    for (int i = 0; i < ATT_DPL; i++) sh_acc[warp][lane + 32 * i] = acc[i];
    __syncthreads();
    if (warp != 0) return;
    float mm = NEG_BIG;
    for (int w = 0; w < ATT_WARPS; w++) mm = fmaxf(mm, sh_m[w]);
    float total = 0.0f;
    float f[ATT_WARPS];
    for (int w = 0; w < ATT_WARPS; w++) {
        f[w] = expf(sh_m[w] - mm);
        total = fmaf(sh_s[w], f[w], total);
    }
    float* o = out + (u64)tok * heads * hd + (u64)h * hd;
#pragma unroll
    for (int i = 0; i < ATT_DPL; i++) {
        u32 d = lane + 32 * i;
        if (d < hd) {
            float v = 0.0f;
            for (int w = 0; w < ATT_WARPS; w++) v = fmaf(sh_acc[w][d], f[w], v);
            o[d] = v / total;
        }
    }
}
