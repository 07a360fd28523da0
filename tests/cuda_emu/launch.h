// launch.h — the entry points of the emulation (after runtime.h and the
// program): emu_launch runs a kernel by name over a grid, checking the
// arguments' count and kinds (0 = address, 1 = u32, 2 = f32) against the
// kernel's C signature; emu_sgemm_tn stands in for cuBLAS.

template <typename T>
T emu_conv(uint64_t v, unsigned char tag, bool& ok) {
    if constexpr (std::is_pointer_v<T>) {
        ok = ok && tag == 0;
        return reinterpret_cast<T>(v);
    } else if constexpr (std::is_same_v<T, float>) {
        ok = ok && tag == 2;
        return __uint_as_float((unsigned)v);
    } else {
        static_assert(std::is_same_v<T, unsigned>, "kernel arguments are pointers, u32 or f32");
        ok = ok && tag == 1;
        return (unsigned)v;
    }
}

static void emu_fiber_main() {
    emu->kernel();
    emu->fibers[emu->cur].state = EMU_DONE;
}

// Runs one block: every thread from the start until all are done, releasing
// warps whose 32 lanes all wait at a shuffle and the block when every live
// thread waits at __syncthreads. Returns false on a deadlock (divergent barrier).
static bool emu_run_block(EmuSched& s, unsigned n) {
    for (unsigned i = 0; i < n; i++) {
        EmuFiber& f = s.fibers[i];
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = s.stacks[i].data();
        f.ctx.uc_stack.ss_size = s.stacks[i].size();
        f.ctx.uc_link = &s.main;
        makecontext(&f.ctx, emu_fiber_main, 0);
        f.state = EMU_READY;
    }
    for (;;) {
        for (unsigned i = 0; i < n; i++) {
            if (s.fibers[i].state != EMU_READY) continue;
            s.cur = i;
            threadIdx = EmuDim{i, 0, 0};
            swapcontext(&s.main, &s.fibers[i].ctx);
        }
        bool all_done = true, all_block = true, released = false;
        for (unsigned i = 0; i < n; i++) {
            all_done = all_done && s.fibers[i].state == EMU_DONE;
            all_block = all_block && (s.fibers[i].state == EMU_DONE || s.fibers[i].state == EMU_AT_BLOCK);
        }
        if (all_done) return true;
        for (unsigned w = 0; w < n / 32; w++) {
            bool at = true;
            for (unsigned l = 0; l < 32; l++) at = at && s.fibers[w * 32 + l].state == EMU_AT_WARP;
            if (at) {
                for (unsigned l = 0; l < 32; l++) s.fibers[w * 32 + l].state = EMU_READY;
                released = true;
            }
        }
        if (!released && all_block) {
            for (unsigned i = 0; i < n; i++)
                if (s.fibers[i].state == EMU_AT_BLOCK) s.fibers[i].state = EMU_READY;
            released = true;
        }
        if (!released) return false;
    }
}

template <typename... Ts, size_t... I>
int emu_call(void (*f)(Ts...), const uint64_t* a, const unsigned char* tags, unsigned n, EmuDim grid, unsigned block,
             std::index_sequence<I...>) {
    if (n != sizeof...(Ts)) return -2;
    bool ok = true;
    std::tuple<Ts...> args{emu_conv<Ts>(a[I], tags[I], ok)...};
    if (!ok) return -3;
    if (block % 32 != 0 || block > 1024) return -4;
    gridDim = grid;
    blockDim = EmuDim{block, 1, 1};
    EmuSched s;
    s.fibers.resize(block);
    s.stacks.assign(block, std::vector<char>(64 * 1024));
    s.kernel = [&] { std::apply(f, args); };
    emu = &s;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                blockIdx = EmuDim{x, y, z};
                if (!emu_run_block(s, block)) return -5;
            }
    emu = nullptr;
    return 0;
}

template <typename... Ts>
int emu_dispatch(void (*f)(Ts...), const uint64_t* a, const unsigned char* tags, unsigned n, EmuDim grid,
                 unsigned block) {
    return emu_call(f, a, tags, n, grid, block, std::index_sequence_for<Ts...>{});
}

// EMU_KERNELS is defined by the test as K(name) for every entry point.
extern "C" int emu_launch(const char* name, unsigned gx, unsigned gy, unsigned gz, unsigned block, const uint64_t* args,
                          const unsigned char* tags, unsigned n) {
    std::string s(name);
#define K(fn) \
    if (s == #fn) return emu_dispatch(fn, args, tags, n, EmuDim{gx, gy, gz}, block);
    EMU_KERNELS
#undef K
    return -1;
}

extern "C" void emu_sgemm_tn(unsigned m, unsigned n, unsigned k, const float* a, unsigned lda, const float* b,
                             unsigned ldb, float* c, unsigned ldc) {
    for (unsigned j = 0; j < n; j++)
        for (unsigned i = 0; i < m; i++) {
            double s = 0.0;
            for (unsigned p = 0; p < k; p++) s += (double)a[(uint64_t)i * lda + p] * b[(uint64_t)j * ldb + p];
            c[(uint64_t)j * ldc + i] = (float)s;
        }
}
