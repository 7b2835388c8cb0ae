// Runs the CUDA C of monogen's kernels on the CPU, to check what they compute where there is no
// GPU (tools/cuda_emulate.py includes this before each kernel file and compiles it with g++).
//
// A launch runs its blocks one after another; a block's threads are fibers on the calling
// thread (each started on a stack of its own with makecontext, then switched with _setjmp and
// _longjmp, which unlike swapcontext make no system call), scheduled round by round: each round runs every live thread until it yields.
// __syncthreads is a barrier of the block's live threads (a thread that returned no longer
// counts, as on a GPU): each yields until the last one arrives. A warp shuffle writes the lane's
// value, waits at a barrier of the warp's live lanes, reads its partner's and waits again. That
// is CUDA's semantics for code whose warps are converged at each shuffle and whose threads all
// reach each __syncthreads, which CUDA requires anyway. __shared__ variables are static: one
// block runs at a time. Float arithmetic is the host's (no fused multiply-adds unless the
// compiler makes them, which -ffp-contract=off forbids), so results match a GPU's to rounding.
#pragma once
// Kernels that use an instruction of the GPU's own (a tensor-core mma) take its emulation below.
#define MONOGEN_EMULATED 1

#include <setjmp.h>
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};

inline dim3 threadIdx, blockIdx, blockDim, gridDim;

// CUDA's vector types that the kernels load through.
struct alignas(16) uint4 {
    unsigned int x, y, z, w;
};

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static

namespace emu {

struct Fiber {
    ucontext_t context;
    jmp_buf jump;
    dim3 thread;
    bool started = false;
    bool done = false;
    std::vector<char> stack;
};

inline jmp_buf scheduler;
inline Fiber* current = nullptr;
inline std::function<void()> body;
inline float lanes[1024];
inline int int_lanes[1024];
inline unsigned int mma_a[1024][4];
inline unsigned int mma_b[1024][2];

inline void yield() {
    if (!_setjmp(current->jump)) _longjmp(scheduler, 1);
}

// A barrier of `live` threads: the block's, or one warp's.
struct Barrier {
    unsigned arrived = 0;
    unsigned generation = 0;
    unsigned live = 0;

    void wait() {
        const unsigned generation_now = generation;
        if (++arrived == live) {
            release();
            return;
        }
        while (generation == generation_now) yield();
    }

    void release() {
        arrived = 0;
        generation++;
    }

    // A member returned: the others no longer wait for it.
    void leave() {
        live--;
        if (arrived > 0 && arrived == live) release();
    }
};

inline Barrier block_barrier;
inline Barrier warp_barriers[32];

inline Barrier& warp_barrier() {
    const unsigned lane = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    return warp_barriers[lane / 32];
}

// A fiber runs the kernel for one block after another: the scheduler moves blockIdx on when
// every fiber is done with the current block.
inline void trampoline() {
    for (;;) {
        body();
        current->done = true;
        block_barrier.leave();
        warp_barrier().leave();
        yield();
    }
}

// Runs `kernel` over `grid` blocks of `block` threads.
inline void launch(dim3 grid, dim3 block, std::function<void()> kernel) {
    gridDim = grid;
    blockDim = block;
    body = std::move(kernel);
    const unsigned n = block.x * block.y * block.z;
    // The fibers and their stacks (64 KiB each) outlive a launch: the next one reuses them.
    static std::vector<Fiber> pool(1024);
    if (n > pool.size()) std::abort();  // CUDA's limit of 1024 threads a block
    Fiber* fibers = pool.data();
    for (unsigned i = 0; i < n; i++) {
        if (fibers[i].stack.empty()) fibers[i].stack.resize(64 * 1024);
        fibers[i].started = false;
    }
    for (unsigned i = 0; i < n; i++) {
        Fiber& f = fibers[i];
        f.thread = {i % block.x, (i / block.x) % block.y, i / (block.x * block.y)};
        getcontext(&f.context);
        f.context.uc_stack.ss_sp = f.stack.data();
        f.context.uc_stack.ss_size = f.stack.size();
        f.context.uc_link = nullptr;
        makecontext(&f.context, trampoline, 0);
    }
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                blockIdx = {bx, by, bz};
                for (unsigned i = 0; i < n; i++) fibers[i].done = false;
                block_barrier = Barrier{0, 0, n};
                for (unsigned w = 0; w < 32; w++) warp_barriers[w] = Barrier{0, 0, std::min(32u, n > 32 * w ? n - 32 * w : 0u)};
                for (bool live = true; live;) {
                    live = false;
                    for (unsigned i = 0; i < n; i++) {
                        Fiber& f = fibers[i];
                        if (f.done) continue;
                        live = true;
                        current = &f;
                        threadIdx = f.thread;
                        if (!_setjmp(scheduler)) {
                            if (f.started) _longjmp(f.jump, 1);
                            f.started = true;
                            setcontext(&f.context);
                        }
                    }
                }
            }
    // The fibers wait in their last yield; the next launch starts them afresh.
}

}  // namespace emu

using std::max;
using std::min;

inline void __syncthreads() { emu::block_barrier.wait(); }

inline int __shfl_xor_sync(unsigned, int value, int mask) {
    const unsigned lane = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    emu::int_lanes[lane] = value;
    emu::warp_barrier().wait();
    const int other = emu::int_lanes[lane ^ mask];
    emu::warp_barrier().wait();
    return other;
}

inline float __shfl_sync(unsigned, float value, int source) {
    const unsigned lane = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    emu::lanes[lane] = value;
    emu::warp_barrier().wait();
    const float other = emu::lanes[(lane & ~31u) + (source & 31)];
    emu::warp_barrier().wait();
    return other;
}

inline float __shfl_xor_sync(unsigned, float value, int mask) {
    const unsigned lane = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    emu::lanes[lane] = value;
    emu::warp_barrier().wait();
    const float other = emu::lanes[lane ^ mask];
    emu::warp_barrier().wait();
    return other;
}

inline float __uint_as_float(unsigned int bits) {
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

inline unsigned int __float_as_uint(float value) {
    unsigned int bits;
    std::memcpy(&bits, &value, 4);
    return bits;
}

inline float __int_as_float(int bits) {
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 for the calling thread's warp, d += a · b,
// from the fragments' layout in the PTX ISA: lane l (group g = l / 4, t = l % 4) holds a's rows g
// and g + 8 at columns 2t, 2t + 1 (a[0]: row g, a[1]: row g + 8) and 2t + 8, 2t + 9 (a[2], a[3]);
// b's column g at rows 2t, 2t + 1 (b[0]) and 2t + 8, 2t + 9 (b[1]); d's rows g (d[0], d[1]) and
// g + 8 (d[2], d[3]) at columns 2t, 2t + 1. The lower half of a register holds the lower index.
inline void mma_bf16_16816(float* d, const unsigned int* a, const unsigned int* b) {
    const unsigned linear = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const unsigned base = linear & ~31u;
    for (int i = 0; i < 4; i++) emu::mma_a[linear][i] = a[i];
    for (int i = 0; i < 2; i++) emu::mma_b[linear][i] = b[i];
    emu::warp_barrier().wait();
    auto bf16 = [](unsigned int bits) { return __uint_as_float(bits << 16); };
    float A[16][16];
    float B[16][8];
    for (unsigned j = 0; j < 32; j++) {
        const unsigned g = j / 4, t = j % 4;
        const unsigned* ra = emu::mma_a[base + j];
        const unsigned* rb = emu::mma_b[base + j];
        A[g][2 * t] = bf16(ra[0] & 0xffff);
        A[g][2 * t + 1] = bf16(ra[0] >> 16);
        A[g + 8][2 * t] = bf16(ra[1] & 0xffff);
        A[g + 8][2 * t + 1] = bf16(ra[1] >> 16);
        A[g][2 * t + 8] = bf16(ra[2] & 0xffff);
        A[g][2 * t + 9] = bf16(ra[2] >> 16);
        A[g + 8][2 * t + 8] = bf16(ra[3] & 0xffff);
        A[g + 8][2 * t + 9] = bf16(ra[3] >> 16);
        B[2 * t][g] = bf16(rb[0] & 0xffff);
        B[2 * t + 1][g] = bf16(rb[0] >> 16);
        B[2 * t + 8][g] = bf16(rb[1] & 0xffff);
        B[2 * t + 9][g] = bf16(rb[1] >> 16);
    }
    const unsigned lane = linear & 31u, g = lane / 4, t = lane % 4;
    for (int e = 0; e < 4; e++) {
        const unsigned row = g + 8 * (e / 2), col = 2 * t + e % 2;
        float sum = 0.0f;
        for (int k = 0; k < 16; k++) sum += A[row][k] * B[k][col];
        d[e] += sum;
    }
    emu::warp_barrier().wait();
}
