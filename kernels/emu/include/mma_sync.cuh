// Host stand-in for kernels/mma_sync.cuh (kernels/emu): the same functions, with mma.sync done
// by the warp together. Every lane offers its fragment registers (toolsift_emu::warp_gather, a
// warp barrier like the device's .sync), then computes its own four elements of D from the
// whole warp's A and B, read through the PTX fragment layouts documented in the device header,
// summing the products in f32 along k.
#pragma once

#include <stdint.h>
#include <string.h>

#include "cuda_bf16.h"
#include "cuda_fp16.h"

namespace toolsift_emu {
int lane_id();
void warp_gather(const void* mine, void* all, size_t bytes);
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

template <typename T>
inline uint32_t load_pair(const T* p) {
    if (reinterpret_cast<uintptr_t>(p) % 4 != 0) __builtin_trap();  // the device faults too
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
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
