// Kernels that test the emulator itself (src/emu.rs tests): it must expose a race, report a
// barrier that can never complete, and shuffle like the device.
#include "cuda_emu.h"
#include "common.cuh"

// Thread i reads the slot thread i + 1 writes; `barrier` puts a __syncthreads in between.
extern "C" void emu_selftest_neighbour(float* out, int barrier) {
    __shared__ float slots[64];
    slots[threadIdx.x] = (float)threadIdx.x;
    if (barrier) __syncthreads();
    out[threadIdx.x] = slots[(threadIdx.x + 1) % 64];
}

// Odd lanes wait at a warp barrier the even lanes never reach.
extern "C" void emu_selftest_divergent(float* out) {
    if (threadIdx.x & 1) __syncwarp();
    out[threadIdx.x] = 1.0f;
}

// Every thread gets the sum of its warp's thread indices, and of the whole block's.
extern "C" void emu_selftest_sums(float* warp_out, float* block_out) {
    __shared__ float scratch[32];
    warp_out[threadIdx.x] = toolsift::warp_sum((float)threadIdx.x);
    block_out[threadIdx.x] = toolsift::block_sum((float)threadIdx.x, scratch);
}

// A warp sum in a block whose last warp is partial (launch with a blockDim not a multiple of 32).
extern "C" void emu_selftest_partial_warp(float* out) {
    out[threadIdx.x] = toolsift::warp_sum((float)threadIdx.x);
}

// The second warp returns before a __syncthreads the first one reaches.
extern "C" void emu_selftest_exit_before_barrier(float* out) {
    if (threadIdx.x >= 32) return;
    __syncthreads();
    out[threadIdx.x] = 1.0f;
}

// Thread 0 writes element `at` of `out`: past the end of a buffer of fewer elements.
extern "C" void emu_selftest_write_at(float* out, int at) {
    if (threadIdx.x == 0) out[at] = 1.0f;
}

// Two block sums on one scratch, as layer_norm takes its mean and variance. With `barrier` 0 the
// first sum leaves out its trailing __syncthreads, so a warp running ahead can overwrite its
// partial with the second sum's before a warp held back has read it.
extern "C" void emu_selftest_scratch_reuse(float* out, int barrier) {
    __shared__ float scratch[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    float v = toolsift::warp_sum(1.0f);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = toolsift::warp_sum(lane < n_warps ? scratch[lane] : 0.0f);
    if (barrier) __syncthreads();
    out[2 * threadIdx.x] = v;
    out[2 * threadIdx.x + 1] = toolsift::block_sum((float)threadIdx.x, scratch);
}
