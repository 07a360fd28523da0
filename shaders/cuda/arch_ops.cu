// arch_ops.cu — the ops only some architectures run.
//
// bias_add: x[off + t·stride + i] += bias[i] for i < n (Qwen 2's q/k/v biases).
//   Launch: grid (ceil(n / 256), T), block 256. Elementwise.
// head_norm: each head's hd floats v (at off + t·stride + h·hd) become
//   v / sqrt(mean(v²) + eps) · w, in place (Qwen 3's and Gemma 3's q/k norms).
//   Launch: grid (heads, T), block 256; thread l sums v[k]² for k = l, l+256, …
//   in increasing k, then a fixed binary tree: the order depends on hd only.
// elementwise: x = x · a (op 0) or a · tanh(x / a) (op 1) over the first n floats.
//   Launch: grid (min(ceil(n / 256), 4096)), block 256; a grid-stride loop.

extern "C" __global__ void bias_add(const float* bias, float* x, u32 t, u32 n, u32 stride, u32 off) {
    u32 tok = blockIdx.y;
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (tok >= t || i >= n) return;
    u64 at = (u64)off + (u64)tok * stride + i;
    x[at] = x[at] + bias[i];
}

extern "C" __global__ void __launch_bounds__(256)
    head_norm(const float* w, float* x, u32 t, u32 heads, u32 hd, u32 stride, u32 off, float eps) {
    __shared__ float part[256];
    u32 h = blockIdx.x, tok = blockIdx.y;
    if (h >= heads || tok >= t) return;
    u64 base = (u64)off + (u64)tok * stride + (u64)h * hd;
    u32 l = threadIdx.x;
    float acc = 0.0f;
    for (u32 k = l; k < hd; k += 256) acc = fmaf(x[base + k], x[base + k], acc);
    part[l] = acc;
    __syncthreads();
    for (u32 s = 128; s > 0; s >>= 1) {
        if (l < s) part[l] += part[l + s];
        __syncthreads();
    }
    float scale = 1.0f / sqrtf(part[0] / (float)hd + eps);
    for (u32 k = l; k < hd; k += 256) x[base + k] = x[base + k] * scale * w[k];
}

extern "C" __global__ void elementwise(float* x, u32 n, u32 op, float a) {
    u32 width = gridDim.x * blockDim.x;
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += width) {
        x[i] = op == 1 ? a * tanhf(x[i] / a) : x[i] * a;
    }
}
