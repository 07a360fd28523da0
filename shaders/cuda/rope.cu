// rope.cu — rotary position embedding, in place, for the first `heads` heads of
// each row (q heads then k heads of a fused qkv row).
//
// Arguments: pos (T) u32; table (max_pos, head_dim/2) (cos, sin) f32 pairs built on
//   the host in f64; x (T, stride) f32, head h of row t at t·stride + h·head_dim.
// Pairing: 0 = rotate-half (i, i + head_dim/2), 1 = adjacent (2i, 2i+1).
// Launch: grid (ceil(heads·head_dim/2 / 256), T), block 256; one thread per pair.

extern "C" __global__ void rope(const u32* pos, const float* table, float* x, u32 t, u32 heads, u32 head_dim,
                                u32 stride, u32 pairing, u32 max_pos) {
    u32 half_d = head_dim / 2;
    u32 tok = blockIdx.y;
    u32 g = blockIdx.x * blockDim.x + threadIdx.x;
    if (tok >= t || g >= heads * half_d) return;
    u32 h = g / half_d, i = g % half_d;
    u32 p = min(pos[tok], max_pos - 1);
    float c = table[2 * ((u64)p * half_d + i)];
    float s = table[2 * ((u64)p * half_d + i) + 1];
    u64 base = (u64)tok * stride + (u64)h * head_dim;
    u64 a = base + i, b = base + i + half_d;
    if (pairing == 1) {
        a = base + 2 * i;
        b = a + 1;
    }
    float x0 = x[a], x1 = x[b];
    x[a] = x0 * c - x1 * s;
    x[b] = x0 * s + x1 * c;
}
