// layer_norm: out[i, :] = LayerNorm(x[r, :] + residual_bias) * weight + bias, in f32, stored as T,
// where r = rows ? rows[i] : i.
//
// GPT-J's ln_1 and ln_f, with the previous layer's fc_out bias folded in: the layer GEMMs
// accumulate out_proj and fc_out into x without their bias (cuBLASLt beta = 1), and this kernel
// adds it. Two uses:
// - rows == nullptr (ln_1 over all tokens): if residual_bias is set, x += residual_bias is written
//   back, so the residual stream is complete before the next layer accumulates into it.
// - rows != nullptr (ln_f at the LM head's rows only): x is read, never written (rows may be any
//   subset; nothing is written back, so duplicates would also be harmless).
// Statistics are two-pass in f32 (mean, then mean of squared deviations), as torch and the CPU
// engine do; the block tree-reduces, which is no less accurate than the CPU's sequential sum.
//
// Launch: grid (n), block B threads, B any multiple of 32 up to 1024 (the launcher picks from d;
// the fuzz test runs every choice). One row per block: d = 4096 is 16 floats per thread at B = 256,
// and the three passes hit L1. Variants: none measured yet (see docs/kernels.md).
#include "common.cuh"

using namespace toolsift;

template <typename T>
__device__ void layer_norm(float* __restrict__ x,                    // [.., ld_x]
                           const float* __restrict__ residual_bias,  // [d] or null
                           const uint32_t* __restrict__ rows,        // [n] or null
                           const float* __restrict__ weight,         // [d]
                           const float* __restrict__ bias,           // [d]
                           T* __restrict__ out,                      // [n, ld_out]
                           uint32_t n, uint32_t d, uint32_t ld_x, uint32_t ld_out, float eps) {
    __shared__ float scratch[32];
    const uint32_t i = blockIdx.x;
    if (i >= n) return;
    const size_t r = rows ? rows[i] : i;
    float* xr = x + r * ld_x;
    const bool write_back = rows == nullptr && residual_bias != nullptr;
    const bool add_bias = residual_bias != nullptr && !write_back;

    float sum = 0.0f;
    for (uint32_t c = threadIdx.x; c < d; c += blockDim.x) {
        float v = xr[c] + (residual_bias ? residual_bias[c] : 0.0f);
        if (write_back) xr[c] = v;
        sum += v;
    }
    const float mean = block_sum(sum, scratch) / (float)d;
    float sq = 0.0f;
    for (uint32_t c = threadIdx.x; c < d; c += blockDim.x) {
        const float v = xr[c] + (add_bias ? residual_bias[c] : 0.0f) - mean;
        sq += v * v;
    }
    const float var = block_sum(sq, scratch) / (float)d;
    const float inv = 1.0f / sqrtf(var + eps);
    T* o = out + (size_t)i * ld_out;
    for (uint32_t c = threadIdx.x; c < d; c += blockDim.x) {
        const float v = xr[c] + (add_bias ? residual_bias[c] : 0.0f);
        o[c] = from_f32<T>((v - mean) * inv * weight[c] + bias[c]);
    }
}

#define LAYER_NORM(NAME, T)                                                                     \
    extern "C" __global__ void NAME(float* x, const float* residual_bias, const uint32_t* rows, \
                                    const float* weight, const float* bias, T* out, uint32_t n, \
                                    uint32_t d, uint32_t ld_x, uint32_t ld_out, float eps) {    \
        layer_norm<T>(x, residual_bias, rows, weight, bias, out, n, d, ld_x, ld_out, eps);      \
    }

LAYER_NORM(layer_norm_bf16, __nv_bfloat16)
LAYER_NORM(layer_norm_f16, __half)
