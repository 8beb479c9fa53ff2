// What the attention kernels (tree_attention.cu, tree_attention_mma.cu) share: the tile
// contract with the host, and gathering K / V / Q rows of one head into a shared-memory tile.
#pragma once

#include "common.cuh"

namespace toolsift {

// The tile contract, restated on the host as src/cuda/tree_attention.rs's BM, BN and THREADS:
// a tile holds up to BM query rows, keys and values stream through in blocks of BN rows, and one
// block of WARPS warps computes a (tile, head).
constexpr int BM = 64;
constexpr int BN = 64;
constexpr int WARPS = 4;
constexpr int THREADS = WARPS * 32;

// dst[r, c] = src[tok[r], col0 + c] for r < valid_rows and c < head_dim; 0 elsewhere in
// [n_rows, hdp) (padding rows and the columns that pad head_dim to hdp). The block's THREADS
// threads share the work. VEC: 16-byte vectors (head_dim % 8 == 0, ld % 8 == 0, aligned src).
template <typename T, bool VEC, int THREADS>
__device__ void gather_rows(T* __restrict__ dst, int ldd, const T* __restrict__ src, size_t ld,
                            const uint32_t* __restrict__ tok, int n_rows, int valid_rows,
                            int head_dim, int hdp, size_t col0) {
    if (VEC) {
        // 8 elements per 16-byte vector; head_dim % 8 == 0 so a vector never straddles it.
        const int vecs = hdp / 8;
        for (int idx = threadIdx.x; idx < n_rows * vecs; idx += THREADS) {
            const int r = idx / vecs, c = (idx % vecs) * 8;
            uint4 val = make_uint4(0, 0, 0, 0);
            if (r < valid_rows && c < head_dim)
                val = load_vec16(src + (size_t)tok[r] * ld + col0 + c);
            store_vec16(dst + r * ldd + c, val);
        }
    } else {
        for (int idx = threadIdx.x; idx < n_rows * hdp; idx += THREADS) {
            const int r = idx / hdp, c = idx % hdp;
            T val = from_f32<T>(0.0f);
            if (r < valid_rows && c < head_dim) val = src[(size_t)tok[r] * ld + col0 + c];
            dst[r * ldd + c] = val;
        }
    }
}

}  // namespace toolsift
