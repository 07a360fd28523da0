// runtime.h — a CPU emulation of the CUDA execution model, just enough for
// shaders/cuda, so that the tests can run the cuda backend's op layer and its
// CUDA C on a machine without an NVIDIA GPU. Blocks run one after another on
// one OS thread; the threads of a block are fibers (ucontext) switched by a
// scheduler in launch.h: __syncthreads waits for every live thread of the block,
// __shfl_xor_sync for the 32 lanes of the warp (a divergent one is an error).
// Built with g++ -std=c++20 by tests/common/cuda_emu.rs, followed by the
// program (src/backend/cuda/program.rs) and launch.h.
#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

struct EmuDim {
    unsigned x, y, z;
};
static EmuDim threadIdx, blockIdx, blockDim, gridDim;

enum EmuState { EMU_READY, EMU_AT_WARP, EMU_AT_BLOCK, EMU_DONE };

struct EmuFiber {
    ucontext_t ctx;
    EmuState state;
};

struct EmuSched {
    ucontext_t main;
    std::vector<EmuFiber> fibers;
    std::vector<std::vector<char>> stacks;
    float warp_vals[32][32];
    unsigned cur = 0;
    std::function<void()> kernel;
};
static EmuSched* emu;

// Suspends the current thread until the scheduler releases it.
inline void emu_wait(EmuState s) {
    EmuFiber& f = emu->fibers[emu->cur];
    f.state = s;
    swapcontext(&f.ctx, &emu->main);
}

inline void __syncthreads() { emu_wait(EMU_AT_BLOCK); }

inline float __shfl_xor_sync(unsigned, float v, int o) {
    unsigned w = threadIdx.x / 32, lane = threadIdx.x % 32;
    emu->warp_vals[w][lane] = v;
    emu_wait(EMU_AT_WARP);
    float r = emu->warp_vals[w][lane ^ (unsigned)o];
    emu_wait(EMU_AT_WARP);
    return r;
}

inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }

inline int __popc(unsigned x) { return __builtin_popcount(x); }

inline float wllm_emu_h2f(unsigned short h) {
    unsigned e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? std::ldexp((float)m, -24)
              : e == 31 ? (m ? NAN : INFINITY)
                        : std::ldexp((float)(m + 1024), (int)e - 25);
    return (h >> 15) ? -v : v;
}

// f32 to the nearest half, ties to even (cvt.rn.f16.f32).
inline unsigned short wllm_emu_f2h(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    unsigned short sign = (unsigned short)((u >> 16) & 0x8000u);
    unsigned a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) return sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u);
    if (a >= 0x477ff000u) return sign | 0x7c00u;  // rounds past 65504: infinity
    if (a < 0x38800000u) {                          // below 2^-14: a subnormal half
        float v;
        std::memcpy(&v, &a, 4);
        return sign | (unsigned short)std::nearbyint(v * 16777216.0f);  // v / 2^-24
    }
    unsigned m = a - 0x38000000u;  // rebias the exponent (127 -> 15), 13 low bits to drop
    unsigned h = m >> 13, rest = m & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h += 1;
    return sign | (unsigned short)h;
}

struct float4 {
    float x, y, z, w;
};
struct uint4 {
    unsigned x, y, z, w;
};

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
