// Host stand-in for CUDA's mma.h (kernels/emu): the WMMA fragments the kernels use.
//
// Fragments are stored as whole tiles in f32 (16-bit inputs widen exactly), but each lane owns a
// share of an accumulator (element e of the row-major tile belongs to lane e % 32): mma_sync
// computes, and store_matrix_sync writes, only the calling lane's elements (summing products in
// f32 along k, as the tensor cores accumulate), and matrix loads read only what those need. So
// other lanes see a store only after a __syncwarp, as on the device, and a warp's mma costs
// what one lane's full-tile mma would.
#pragma once

#include <stdint.h>

#include <type_traits>

#include "cuda_bf16.h"
#include "cuda_fp16.h"

namespace toolsift_emu {
int lane_id();
void sync_warp();
[[noreturn]] void unsupported(const char* what);

// WMMA's load/store contract: a 256-bit aligned pointer and a leading dimension of a whole
// number of 16 bytes (the device's behaviour is undefined otherwise).
template <typename T>
inline void check_wmma_operand(const T* p, unsigned ldm) {
    if (reinterpret_cast<uintptr_t>(p) % 32 != 0)
        unsupported("WMMA load/store pointer not 32-byte aligned (undefined on the device)");
    if (ldm * sizeof(T) % 16 != 0)
        unsupported("WMMA load/store ldm not a multiple of 16 bytes (undefined on the device)");
}
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

// Lane `lane` owns element e = r * N + c of an M x N accumulator when e % 32 == lane; it needs
// row r of A and column c of B for it.
template <int N>
inline bool owns_row(int r, int lane) {
    for (int c = 0; c < N; ++c)
        if ((r * N + c) % 32 == lane) return true;
    return false;
}
template <int M, int N>
inline bool owns_col(int c, int lane) {
    for (int r = 0; r < M; ++r)
        if ((r * N + c) % 32 == lane) return true;
    return false;
}

// matrix_a / matrix_b from 16-bit storage: element (r, c) of the fragment's rows x cols tile is
// p[r * ldm + c] (row_major) or p[c * ldm + r] (col_major). A lane reads the rows of A and the
// columns of B its accumulator elements need (the rest of the tile stays unread, as on the
// device, where each lane holds a slice of the fragment).
template <typename Use, int M, int N, int K, typename T, typename Layout>
inline void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const T* p, unsigned ldm) {
    using F = fragment<Use, M, N, K, T, Layout>;
    static_assert(!std::is_same<Use, accumulator>::value, "accumulators load with a layout");
    constexpr bool row = std::is_same<Layout, row_major>::value;
    constexpr bool is_a = std::is_same<Use, matrix_a>::value;
    toolsift_emu::check_wmma_operand(p, ldm);
    const int lane = toolsift_emu::lane_id();
    for (int r = 0; r < F::rows; ++r)
        for (int c = 0; c < F::cols; ++c) {
            if (is_a ? !owns_row<N>(r, lane) : !owns_col<M, N>(c, lane)) continue;
            f.x[r * F::cols + c] = widen(row ? p[r * ldm + c] : p[c * ldm + r]);
        }
}

template <int M, int N, int K>
inline void load_matrix_sync(fragment<accumulator, M, N, K, float>& f, const float* p, unsigned ldm,
                             layout_t layout) {
    toolsift_emu::check_wmma_operand(p, ldm);
    for (int r = 0; r < M; ++r)
        for (int c = 0; c < N; ++c)
            f.x[r * N + c] = layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
}

template <int M, int N, int K>
inline void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float>& f,
                              unsigned ldm, layout_t layout) {
    toolsift_emu::check_wmma_operand(p, ldm);
    const int lane = toolsift_emu::lane_id();
    for (int e = lane; e < M * N; e += 32) {
        const int r = e / N, c = e % N;
        (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[e];
    }
}

// D = A B + C on the calling lane's elements (its share of D is all a store or a later mma of
// this lane reads).
template <int M, int N, int K, typename T, typename LA, typename LB>
inline void mma_sync(fragment<accumulator, M, N, K, float>& d,
                     const fragment<matrix_a, M, N, K, T, LA>& a,
                     const fragment<matrix_b, M, N, K, T, LB>& b,
                     const fragment<accumulator, M, N, K, float>& c) {
    for (int e = toolsift_emu::lane_id(); e < M * N; e += 32) {
        const int i = e / N, j = e % N;
        float acc = c.x[e];
        for (int k = 0; k < K; ++k) acc += a.x[i * K + k] * b.x[k * N + j];
        d.x[e] = acc;
    }
}

}  // namespace wmma
}  // namespace nvcuda
