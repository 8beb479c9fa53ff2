// Warp-level tensor-core MMA (PTX mma.sync m16n8k16, f32 accumulate), the ldmatrix loads that
// fill its fragments from shared memory, and the packing of 16-bit pairs into 32-bit fragment
// registers. Fragment layouts (PTX ISA, "Matrix fragments for
// mma.m16n8k16"), with g = lane / 4 and t = lane % 4:
//   A (16 x 16, row-major) a[0]: (g, 2t..2t+1)  a[1]: (g+8, 2t..)
//                          a[2]: (g, 2t+8..)    a[3]: (g+8, 2t+8..)
//   B (16 x 8, k x n)      b[0]: (k 2t..2t+1, n g)                  b[1]: (k 2t+8.., n g)
//   C, D (16 x 8)          c[0], c[1]: (g, 2t + 0/1)                c[2], c[3]: (g+8, 2t + 0/1)
// A pair (lo, hi) sits in one register with the lower column (or k) in the low 16 bits.
//
// The host emulator has its own version of this header (kernels/emu/include/mma_sync.cuh, same
// functions), which wins the include search there.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace toolsift {

template <typename T>
__device__ __forceinline__ uint16_t bits16(T x);
template <>
__device__ __forceinline__ uint16_t bits16<__nv_bfloat16>(__nv_bfloat16 x) {
    return __bfloat16_as_ushort(x);
}
template <>
__device__ __forceinline__ uint16_t bits16<__half>(__half x) {
    return __half_as_ushort(x);
}

// Two 16-bit values, lo first.
template <typename T>
__device__ __forceinline__ uint32_t pack_pair(T lo, T hi) {
    return (uint32_t)bits16(lo) | ((uint32_t)bits16(hi) << 16);
}

// ldmatrix: four 8 x 8 matrices of 16-bit values from shared memory, one register each. Lane l
// gives the address of one row (16 bytes, 16-byte aligned): lanes 0-7 the rows of matrix 0,
// 8-15 of matrix 1, 16-23 of 2, 24-31 of 3. Lane l receives of matrix m, in r[m], the pair at
// row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 (the A / B fragment layout above); with
// .trans, the pair at rows 2 (l % 4) and 2 (l % 4) + 1 of column l / 4. The "memory" clobber
// keeps the compiler from moving shared-memory stores across the read (the kernels' barriers
// already order them; this does not lean on that).
template <typename T>
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const T* row) {
    const unsigned addr = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

template <typename T>
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const T* row) {
    const unsigned addr = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

// d = a b + c on one m16n8k16 tile held by the whole warp.
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float d[4], const uint32_t a[4], const uint32_t b[2],
                                             const float c[4]);

template <>
__device__ __forceinline__ void mma_m16n8k16<__nv_bfloat16>(float d[4], const uint32_t a[4],
                                                            const uint32_t b[2],
                                                            const float c[4]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]),
          "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

template <>
__device__ __forceinline__ void mma_m16n8k16<__half>(float d[4], const uint32_t a[4],
                                                     const uint32_t b[2], const float c[4]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]),
          "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

}  // namespace toolsift
