// Shared helpers for toolsift's kernels: storage types, f32 conversion, warp and block reductions.
//
// Conventions for every kernel in this folder:
// - extern "C" entry points named <stem>_<dtype> (layer_norm_bf16, layer_norm_f16, ...), one .cu
//   per op, launched from src/cuda/<stem>.rs with the C signature restated there (the attention
//   variants, decode_attention and tree_attention_mma, from src/cuda/tree_attention.rs; the
//   sampling steps' log_softmax_f32, in lm_head_xent.cu, from src/cuda/lm_head_xent.rs).
// - Matrices are row-major with an explicit row stride `ld` (elements); the Rust side pads strides
//   to multiples of 8 so that rows are 16-byte aligned for cuBLASLt and vector loads.
// - Every offset into a [tokens x width] buffer is computed in 64 bits (size_t).
// - Arithmetic is f32 (norms, softmax, cross-entropy accumulate in f32); 16-bit types are storage.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

// The host emulator (kernels/emu/cuda_emu.h, included first there) defines this to stop the
// launch when `p` is not `bytes`-aligned; on the device a misaligned vector access faults.
#ifndef TOOLSIFT_CHECK_ALIGNED
#define TOOLSIFT_CHECK_ALIGNED(p, bytes, what)
#endif

namespace toolsift {

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// 16-byte vector load and store: `p` must be 16-byte aligned ("misaligned address" on the
// device; x86 would read or write it, so the emulator checks).
__device__ __forceinline__ uint4 load_vec16(const void* p) {
    TOOLSIFT_CHECK_ALIGNED(p, 16, "16-byte vector load not 16-byte aligned");
    return *reinterpret_cast<const uint4*>(p);
}
__device__ __forceinline__ void store_vec16(void* p, uint4 v) {
    TOOLSIFT_CHECK_ALIGNED(p, 16, "16-byte vector store not 16-byte aligned");
    *reinterpret_cast<uint4*>(p) = v;
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024). Every thread gets the result.
// `scratch` holds 32 floats; the function ends with a barrier so it can be reused at once.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    v = warp_sum(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < n_warps ? scratch[lane] : 0.0f;
    v = warp_sum(v);
    __syncthreads();
    return v;
}

// A running (max, sum of exp(x - max)) pair: log-sum-exp in one pass, combinable.
struct MaxSum {
    float m;
    float s;
};

__device__ __forceinline__ MaxSum max_sum_combine(MaxSum a, MaxSum b) {
    const float m = fmaxf(a.m, b.m);
    if (m == -INFINITY) return {m, 0.0f};
    const float sa = a.m == -INFINITY ? 0.0f : a.s * expf(a.m - m);
    const float sb = b.m == -INFINITY ? 0.0f : b.s * expf(b.m - m);
    return {m, sa + sb};
}

// One more element x into a thread's running pair. A -inf (a masked token) adds nothing: taken
// as the first element, its exp(x - max) would be exp(-inf + inf) = NaN for the whole row.
__device__ __forceinline__ MaxSum max_sum_push(MaxSum acc, float x) {
    if (x > acc.m) {
        acc.s = acc.s * expf(acc.m - x) + 1.0f;  // expf(-inf) = 0 on the first element
        acc.m = x;
    } else if (x != -INFINITY) {
        acc.s += expf(x - acc.m);
    }
    return acc;
}

__device__ __forceinline__ MaxSum warp_max_sum(MaxSum v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        MaxSum other = {__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)};
        v = max_sum_combine(v, other);
    }
    return v;
}

}  // namespace toolsift
