// gelu: x = gelu_new(x + bias) in place over [n, f] (row stride ld), as transformers' "gelu_new":
// 0.5 u (1 + tanh(sqrt(2/pi) (u + 0.044715 u^3))), computed in f32 with the accurate tanhf.
//
// x is the T output of the fc_in GEMM; the bias is kept f32 and added here (not in a cuBLASLt
// epilogue) so that one tested kernel owns the whole elementwise step.
//
// Launch: 1-D grid-stride loop over n * f elements (64-bit index), block 256, grid capped by the
// launcher. Bandwidth-bound: 4 bytes per element (read + write of T).
#include "common.cuh"

using namespace toolsift;

template <typename T>
__device__ void gelu(T* __restrict__ x,              // [n, ld]
                     const float* __restrict__ bias,  // [f]
                     uint32_t n, uint32_t f, uint32_t ld) {
    const float k = 0.7978845608028654f;  // sqrt(2 / pi)
    const size_t total = (size_t)n * f;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        const size_t r = idx / f, c = idx % f;
        T* p = x + r * ld + c;
        const float u = to_f32(*p) + bias[c];
        *p = from_f32<T>(0.5f * u * (1.0f + tanhf(k * (u + 0.044715f * u * u * u))));
    }
}

extern "C" __global__ void gelu_bf16(__nv_bfloat16* x, const float* bias, uint32_t n, uint32_t f,
                                     uint32_t ld) {
    gelu(x, bias, n, f, ld);
}

extern "C" __global__ void gelu_f16(__half* x, const float* bias, uint32_t n, uint32_t f,
                                    uint32_t ld) {
    gelu(x, bias, n, f, ld);
}
