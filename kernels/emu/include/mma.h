// Host stand-in for CUDA's mma.h (kernels/emu): the WMMA fragments the kernels use.
//
// Every lane holds the whole tile in f32 (16-bit inputs widen exactly) and mma_sync sums the
// products in f32 along k, as the tensor cores accumulate. Loads read the whole tile; a store of
// an accumulator writes only the calling lane's share (element e of the row-major tile belongs
// to lane e % 32), so other lanes see it only after a __syncwarp, as on the device.
#pragma once

#include <type_traits>

#include "cuda_bf16.h"
#include "cuda_fp16.h"

namespace toolsift_emu {
int lane_id();
void sync_warp();
}  // namespace toolsift_emu

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

inline float widen(float x) { return x; }
inline float widen(__nv_bfloat16 x) { return __bfloat162float(x); }
inline float widen(__half x) { return __half2float(x); }

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
    static constexpr int rows = std::is_same<Use, matrix_b>::value ? K : M;
    static constexpr int cols = std::is_same<Use, matrix_a>::value ? K : N;
    static constexpr int num_elements = rows * cols;
    float x[rows * cols];
};

template <typename Use, int M, int N, int K, typename T, typename Layout>
inline void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, float v) {
    for (float& e : f.x) e = v;
}

// matrix_a / matrix_b from 16-bit storage: element (r, c) of the fragment's rows x cols tile is
// p[r * ldm + c] (row_major) or p[c * ldm + r] (col_major).
template <typename Use, int M, int N, int K, typename T, typename Layout>
inline void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const T* p, unsigned ldm) {
    using F = fragment<Use, M, N, K, T, Layout>;
    static_assert(!std::is_same<Use, accumulator>::value, "accumulators load with a layout");
    constexpr bool row = std::is_same<Layout, row_major>::value;
    for (int r = 0; r < F::rows; ++r)
        for (int c = 0; c < F::cols; ++c)
            f.x[r * F::cols + c] = widen(row ? p[r * ldm + c] : p[c * ldm + r]);
}

template <int M, int N, int K>
inline void load_matrix_sync(fragment<accumulator, M, N, K, float>& f, const float* p, unsigned ldm,
                             layout_t layout) {
    for (int r = 0; r < M; ++r)
        for (int c = 0; c < N; ++c)
            f.x[r * N + c] = layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
}

template <int M, int N, int K>
inline void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float>& f,
                              unsigned ldm, layout_t layout) {
    const int lane = toolsift_emu::lane_id();
    for (int e = lane; e < M * N; e += 32) {
        const int r = e / N, c = e % N;
        (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[e];
    }
}

template <int M, int N, int K, typename T, typename LA, typename LB>
inline void mma_sync(fragment<accumulator, M, N, K, float>& d,
                     const fragment<matrix_a, M, N, K, T, LA>& a,
                     const fragment<matrix_b, M, N, K, T, LB>& b,
                     const fragment<accumulator, M, N, K, float>& c) {
    float out[M * N];
    for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) {
            float acc = c.x[i * N + j];
            for (int k = 0; k < K; ++k) acc += a.x[i * K + k] * b.x[k * N + j];
            out[i * N + j] = acc;
        }
    for (int e = 0; e < M * N; ++e) d.x[e] = out[e];
}

}  // namespace wmma
}  // namespace nvcuda
