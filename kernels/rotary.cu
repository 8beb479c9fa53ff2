// rotary: GPT-J's rotary embedding ("rotate every two") on q and k, fused with the split of the
// qkv GEMM output into the query buffer and this layer's K/V cache, and the narrowing to T.
//
//   for every token t, head h, dim c < rotary_dim (pairs (2i, 2i+1), angle
//   pos_t * 10000^(-2i/rot)):
//     out[2i]   = x[2i] cos - x[2i+1] sin
//     out[2i+1] = x[2i+1] cos + x[2i] sin
//   dims c >= rotary_dim and all of v are copied.
//
// qkv is the f32 output of one GEMM ([n, ld_qkv]: q at columns 0..d, k at d..2d, v at 2d..3d), so
// the rotation is done on unrounded values and each of q, k, v is rounded to T exactly once.
// cos/sin come from a table built in f64 on the host ([n_positions, rotary_dim / 2], f32).
// k_out and v_out point at the cache row of the plan's first token: rows are flat token indices,
// so a decoder can append later tokens to the same buffers.
//
// Launch: grid (n), block 256 (any multiple of 32); threads stride over the d columns of a row.
// Each thread reads its element and its pair partner (two loads, L1-shared with the neighbour),
// which keeps odd head_dim and rotary_dim < head_dim trivially correct.
#include "common.cuh"

using namespace toolsift;

template <typename T>
__device__ void rotary(const float* __restrict__ qkv,         // [n, ld_qkv]
                       const uint32_t* __restrict__ positions,  // [n]
                       const float* __restrict__ cos_table,     // [n_positions, rotary_dim / 2]
                       const float* __restrict__ sin_table,     // [n_positions, rotary_dim / 2]
                       T* __restrict__ q_out,                   // [n, ld]
                       T* __restrict__ k_out,                   // [n, ld]
                       T* __restrict__ v_out,                   // [n, ld]
                       uint32_t n, uint32_t n_head, uint32_t head_dim, uint32_t rotary_dim,
                       uint32_t ld_qkv, uint32_t ld) {
    const uint32_t t = blockIdx.x;
    if (t >= n) return;
    const uint32_t d = n_head * head_dim, half = rotary_dim / 2;
    const float* row = qkv + (size_t)t * ld_qkv;
    const size_t table = (size_t)positions[t] * half;
    const size_t o = (size_t)t * ld;
    for (uint32_t e = threadIdx.x; e < d; e += blockDim.x) {
        const uint32_t c = e % head_dim;
        float q = row[e], k = row[d + e];
        if (c < rotary_dim) {
            const uint32_t i = c / 2;
            const float cs = cos_table[table + i], sn = sin_table[table + i];
            if (c % 2 == 0) {
                q = q * cs - row[e + 1] * sn;
                k = k * cs - row[d + e + 1] * sn;
            } else {
                q = q * cs + row[e - 1] * sn;
                k = k * cs + row[d + e - 1] * sn;
            }
        }
        q_out[o + e] = from_f32<T>(q);
        k_out[o + e] = from_f32<T>(k);
        v_out[o + e] = from_f32<T>(row[2 * d + e]);
    }
}

#define ROTARY(NAME, T)                                                                         \
    extern "C" __global__ void NAME(const float* qkv, const uint32_t* positions,                \
                                    const float* cos_table, const float* sin_table, T* q_out,   \
                                    T* k_out, T* v_out, uint32_t n, uint32_t n_head,            \
                                    uint32_t head_dim, uint32_t rotary_dim, uint32_t ld_qkv,    \
                                    uint32_t ld) {                                              \
        rotary<T>(qkv, positions, cos_table, sin_table, q_out, k_out, v_out, n, n_head,         \
                  head_dim, rotary_dim, ld_qkv, ld);                                            \
    }

ROTARY(rotary_bf16, __nv_bfloat16)
ROTARY(rotary_f16, __half)
