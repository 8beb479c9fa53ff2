// embedding: x[t, :] = wte[ids[t], :] widened to f32 (the residual stream starts in f32).
//
// Launch: grid (n_tokens), block 256 (any multiple of 32 works); each block copies one row,
// threads stride over the d columns. A pure gather: bandwidth-bound, 2 + 4 bytes per element.
// Variants: none tried; the op is <0.1% of a forward.
#include "common.cuh"

using namespace toolsift;

template <typename T>
__device__ void embedding(const uint32_t* __restrict__ ids,  // [n]
                          const T* __restrict__ wte,         // [vocab, ld_wte]
                          float* __restrict__ x,             // [n, ld_x]
                          uint32_t n, uint32_t d, uint32_t ld_wte, uint32_t ld_x) {
    const uint32_t t = blockIdx.x;
    if (t >= n) return;
    const T* src = wte + (size_t)ids[t] * ld_wte;
    float* dst = x + (size_t)t * ld_x;
    for (uint32_t c = threadIdx.x; c < d; c += blockDim.x) dst[c] = to_f32(src[c]);
}

extern "C" __global__ void embedding_bf16(const uint32_t* ids, const __nv_bfloat16* wte, float* x,
                                          uint32_t n, uint32_t d, uint32_t ld_wte, uint32_t ld_x) {
    embedding(ids, wte, x, n, d, ld_wte, ld_x);
}

extern "C" __global__ void embedding_f16(const uint32_t* ids, const __half* wte, float* x,
                                         uint32_t n, uint32_t d, uint32_t ld_wte, uint32_t ld_x) {
    embedding(ids, wte, x, n, d, ld_wte, ld_x);
}
