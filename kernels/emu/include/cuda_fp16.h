// Host stand-in for CUDA's cuda_fp16.h (kernels/emu): IEEE binary16 as 16 bits of storage,
// converted through the compiler's _Float16 (round to nearest even, subnormals kept).
#pragma once

#include <stdint.h>
#include <string.h>

struct __half {
    uint16_t bits;
};

inline float __half2float(__half h) {
    _Float16 x;
    memcpy(&x, &h.bits, 2);
    return (float)x;
}

inline __half __float2half_rn(float f) {
    const _Float16 x = (_Float16)f;
    __half h;
    memcpy(&h.bits, &x, 2);
    return h;
}
