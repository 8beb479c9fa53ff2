// Host stand-in for kernels/mma_sync.cuh (kernels/emu): the same functions, with mma.sync and
// ldmatrix done by the warp together. Every lane offers its fragment registers
// (toolsift_emu::warp_gather, a warp barrier like the device's .sync), then computes its own four
// elements of D from the whole warp's A and B, read through the PTX fragment layouts documented in
// the device header, summing the products in f32 along k.
#pragma once

#include <stdint.h>
#include <string.h>

#include "cuda_bf16.h"
#include "cuda_fp16.h"

namespace toolsift_emu {
int lane_id();
void warp_gather(const void* mine, void* all, size_t bytes);
[[noreturn]] void unsupported(const char* what);
}  // namespace toolsift_emu

namespace toolsift {

template <typename T>
inline uint16_t bits16(T x) {
    return x.bits;
}

template <typename T>
inline uint32_t pack_pair(T lo, T hi) {
    return (uint32_t)bits16(lo) | ((uint32_t)bits16(hi) << 16);
}

// ldmatrix (see the device header): the warp gathers the 32 row addresses, then each lane reads
// its pairs. Rows must be 16-byte aligned, as on the device (which faults otherwise).
inline void ldmatrix_x4_impl(uint32_t r[4], const void* row, bool trans) {
    if (reinterpret_cast<uintptr_t>(row) % 16 != 0)
        toolsift_emu::unsupported("ldmatrix row address not 16-byte aligned (the device faults)");
    const void* rows[32];
    toolsift_emu::warp_gather(&row, rows, sizeof(const void*));
    const int lane = toolsift_emu::lane_id(), g = lane / 4, t = lane % 4;
    auto at = [&](int m, int i, int j) {  // element (i, j) of matrix m, as stored
        uint16_t v;
        memcpy(&v, static_cast<const unsigned char*>(rows[8 * m + i]) + 2 * j, 2);
        return (uint32_t)v;
    };
    for (int m = 0; m < 4; ++m)
        r[m] = trans ? at(m, 2 * t, g) | at(m, 2 * t + 1, g) << 16
                     : at(m, g, 2 * t) | at(m, g, 2 * t + 1) << 16;
}

template <typename T>
inline void ldmatrix_x4(uint32_t r[4], const T* row) {
    ldmatrix_x4_impl(r, row, false);
}

template <typename T>
inline void ldmatrix_x4_trans(uint32_t r[4], const T* row) {
    ldmatrix_x4_impl(r, row, true);
}

inline float widen_bits(__nv_bfloat16*, uint16_t b) { return __bfloat162float({b}); }
inline float widen_bits(__half*, uint16_t b) { return __half2float({b}); }

template <typename T>
inline void mma_m16n8k16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
    struct Fragments {
        uint32_t a[4];
        uint32_t b[2];
    };
    Fragments mine, all[32];
    memcpy(mine.a, a, sizeof mine.a);
    memcpy(mine.b, b, sizeof mine.b);
    toolsift_emu::warp_gather(&mine, all, sizeof(Fragments));
    // Element (row, k) of A and (k, col) of B, from the lane and register that hold it.
    auto half_of = [](uint32_t reg, int k) { return (uint16_t)(k % 2 ? reg >> 16 : reg & 0xffff); };
    auto A = [&](int row, int k) {
        const uint32_t reg = all[4 * (row % 8) + (k % 8) / 2].a[(row >= 8) + 2 * (k >= 8)];
        return widen_bits((T*)nullptr, half_of(reg, k));
    };
    auto B = [&](int k, int col) {
        const uint32_t reg = all[4 * col + (k % 8) / 2].b[k >= 8];
        return widen_bits((T*)nullptr, half_of(reg, k));
    };
    const int lane = toolsift_emu::lane_id(), g = lane / 4, t = lane % 4;
    float out[4];
    for (int i = 0; i < 4; ++i) {
        const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
        float acc = c[i];
        for (int k = 0; k < 16; ++k) acc += A(row, k) * B(k, col);
        out[i] = acc;
    }
    memcpy(d, out, sizeof out);
}

}  // namespace toolsift
