// The host emulator of CUDA's execution model for kernels/*.cu (cargo feature `emu`).
//
// build.rs compiles every kernel unchanged except for one rewrite (an `extern __shared__` array
// becomes a pointer into the launch's dynamic shared memory) with this header forced in front,
// and links kernels/emu/runtime.cpp, which runs a launch:
// - blocks one after another (so a kernel's static __shared__ arrays are plain statics, kept in
//   one section that is poisoned like dynamic shared memory below);
// - every thread of a block is a fiber on its own stack; a fiber runs until it reaches a barrier
//   (__syncthreads, __syncwarp, a warp shuffle) or returns, so barrier semantics are exact and a
//   barrier that can never complete (divergent __syncthreads, a shuffle with exited lanes) is an
//   error naming the block and the waiting threads, not a hang;
// - between barriers the fibers of a block run in an order drawn from the launch's seed, so a
//   read of shared memory another thread writes without a barrier in between shows up as a
//   result that changes with the seed; a seeded launch also holds some warps back a few rounds
//   at the start of each __syncthreads phase, so one warp can run shuffles and a phase's worth
//   of code ahead of another, as on the device;
// - shared memory, static and dynamic, starts every block filled with 0xFF bytes (NaN as
//   floats), so a read of shared memory nobody wrote poisons the output instead of reading zeros
//   or what the previous block left.
// Tensor-core fragments (include/mma.h) accumulate in f32; each lane computes and stores only its
// share of an accumulator (element e goes to lane e % 32), so a missing __syncwarp after
// store_matrix_sync is a visible race too.
// Numerics are the host's IEEE f32 (expf, logf, tanhf from libm), not the GPU's: results match
// the device within the kernels' own f32 budgets, not bit for bit.
#pragma once

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
// Static shared arrays live in one section, which the runtime fills with 0xFF before each block.
#define __shared__ static __attribute__((section("toolsift_emu_shared")))

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};

struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

namespace toolsift_emu {

const dim3& thread_idx();
const dim3& block_idx();
const dim3& block_dim();
const dim3& grid_dim();
// The calling thread's lane (threadIdx linearised, modulo 32).
int lane_id();
// Block-wide barrier (__syncthreads).
void sync_block();
// Warp-wide barrier of the calling thread's warp (__syncwarp with the full mask).
void sync_warp();
// Warp shuffle: every lane offers `value`, each gets the one offered by `src_lane`.
uint64_t shuffle(uint64_t value, int src_lane);
// Warp all-gather: every lane offers `bytes` (<= 32) at `mine`; each gets all 32 lanes' offers,
// lane order, at `all`.
void warp_gather(const void* mine, void* all, size_t bytes);
// Stops the launch with an error (a construct the emulator does not support).
[[noreturn]] void unsupported(const char* what);
// The launch's dynamic shared memory (128-byte aligned).
unsigned char* dynamic_shared();

}  // namespace toolsift_emu

// kernels/common.cuh's alignment hook: an access the device would fault on stops the launch.
#define TOOLSIFT_CHECK_ALIGNED(p, bytes, what)                                   \
    do {                                                                         \
        if (reinterpret_cast<uintptr_t>(p) % (bytes) != 0)                       \
            ::toolsift_emu::unsupported(what " (the device faults)");            \
    } while (0)

#define threadIdx (::toolsift_emu::thread_idx())
#define blockIdx (::toolsift_emu::block_idx())
#define blockDim (::toolsift_emu::block_dim())
#define gridDim (::toolsift_emu::grid_dim())

inline void __syncthreads() { ::toolsift_emu::sync_block(); }

inline void __syncwarp(unsigned mask = 0xffffffffu) {
    if (mask != 0xffffffffu) ::toolsift_emu::unsupported("__syncwarp with a partial mask");
    ::toolsift_emu::sync_warp();
}

template <typename T>
inline T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = 32) {
    static_assert(sizeof(T) <= 8, "shuffles of at most 64 bits");
    if (mask != 0xffffffffu || width != 32)
        ::toolsift_emu::unsupported("__shfl_xor_sync with a partial mask or width");
    uint64_t bits = 0;
    memcpy(&bits, &value, sizeof(T));
    bits = ::toolsift_emu::shuffle(bits, ::toolsift_emu::lane_id() ^ lane_mask);
    T out;
    memcpy(&out, &bits, sizeof(T));
    return out;
}

// CUDA's integer min/max overloads (same-type arguments, as the kernels call them).
template <typename T>
inline T min(T a, T b) {
    return b < a ? b : a;
}
template <typename T>
inline T max(T a, T b) {
    return a < b ? b : a;
}
