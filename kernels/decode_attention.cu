// decode_attention: the tree_attention contract (same tiles, context map and output) for the
// decode steps of sampling, where every tile holds ONE query: one new token per sequence, many
// sequences, each attending to its own list of cached rows in the KV tree.
//
//   for every tile and head h, for each query row r < q_len (1 in decode steps; more rows are
//   handled one after another, correct but not fast):
//     keys j = 0 .. q_pos + r are ctx_tokens[tile_ctx[tile] + j] (rows of this layer's K/V cache)
//     out[q_start + r, h] = softmax_j(q . k_j / sqrt(head_dim)) . v_j
//
// Why not the 64-row WMMA tile kernel: with one query a tile is 1/64 useful (3 of 4 warps idle,
// 15 of 16 WMMA rows wasted) and its 190 KiB of shared memory allow one block per SM, so the
// K/V gather -- all the work of a decode step's attention -- is never overlapped. Here a block
// (128 threads = 4 warps) per (sequence, head) needs 5 * head_dim floats of shared memory, many
// blocks share an SM, and each warp streams a quarter of the keys:
//   per key: lanes take columns c = lane + 32 i, partial q.k, warp_sum -> score (f32);
//   per-warp online softmax (m, l in registers, warp-uniform), O_w[c] = O_w[c] alpha + p v[c]
//   with O_w in shared memory (each lane owns its columns: no barrier, any head_dim);
//   at the end the 4 warps' (m, l, O) are merged. P stays f32 (the tile kernel rounds P to T
//   for its P.V MMA); both are within the tests' tolerance of the f64 reference.
// Launch: grid (n_tiles, n_head), block 128, dynamic shared memory (1 + 4) * head_dim * 4 + 32 B
// (decode_smem_bytes: q, the four warps' O_w, then their m and l).
#include "common.cuh"

using namespace toolsift;

namespace {

constexpr int WARPS = 4;
constexpr int THREADS = WARPS * 32;

template <typename T>
__device__ void decode_attention(const T* __restrict__ q,                 // [n, ld]
                                 const T* __restrict__ k,                 // [capacity, ld]
                                 const T* __restrict__ v,                 // [capacity, ld]
                                 const uint32_t* __restrict__ tiles,      // [n_tiles, 4]
                                 const uint64_t* __restrict__ tile_ctx,   // [n_tiles]
                                 const uint32_t* __restrict__ ctx_tokens,  // [ctx map]
                                 T* __restrict__ out,                     // [n, ld_out]
                                 uint32_t head_dim, uint32_t ld, uint32_t ld_out, float scale) {
    extern __shared__ __align__(16) float dsm[];
    float* sQ = dsm;                        // [head_dim] q * scale
    float* sO = sQ + head_dim;              // [WARPS, head_dim] per-warp accumulators
    float* sM = sO + WARPS * head_dim;      // [WARPS]
    float* sL = sM + WARPS;                 // [WARPS]

    const uint32_t tile = blockIdx.x, head = blockIdx.y;
    const uint32_t q_start = tiles[4 * tile], q_len = tiles[4 * tile + 1];
    const uint32_t q_pos = tiles[4 * tile + 2];
    const uint32_t* ctx = ctx_tokens + tile_ctx[tile];
    const size_t col0 = (size_t)head * head_dim;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float* oW = sO + warp * head_dim;

    for (uint32_t r = 0; r < q_len; ++r) {
        const T* qr = q + (size_t)(q_start + r) * ld + col0;
        for (uint32_t c = threadIdx.x; c < head_dim; c += THREADS) sQ[c] = to_f32(qr[c]) * scale;
        for (uint32_t c = lane; c < head_dim; c += 32) oW[c] = 0.0f;
        __syncthreads();
        float m = -INFINITY, l = 0.0f;
        const uint32_t n_keys = q_pos + r + 1;
        for (uint32_t j = warp; j < n_keys; j += WARPS) {
            const size_t row = (size_t)ctx[j] * ld + col0;
            const T* kr = k + row;
            float s = 0.0f;
            for (uint32_t c = lane; c < head_dim; c += 32) s += sQ[c] * to_f32(kr[c]);
            s = warp_sum(s);
            const float m_new = fmaxf(m, s);
            const float alpha = expf(m - m_new);  // 0 on the first key (m = -inf)
            const float p = expf(s - m_new);
            l = l * alpha + p;
            m = m_new;
            const T* vr = v + row;
            for (uint32_t c = lane; c < head_dim; c += 32) oW[c] = oW[c] * alpha + p * to_f32(vr[c]);
        }
        if (lane == 0) {
            sM[warp] = m;
            sL[warp] = l;
        }
        __syncthreads();
        // Merge the warps: key 0 is visible to every query, so the global max is finite; a warp
        // that saw no key has m = -inf and weight 0.
        float mg = -INFINITY;
        for (int w = 0; w < WARPS; ++w) mg = fmaxf(mg, sM[w]);
        float lg = 0.0f;
        float wt[WARPS];
#pragma unroll
        for (int w = 0; w < WARPS; ++w) {
            wt[w] = sM[w] == -INFINITY ? 0.0f : expf(sM[w] - mg);
            lg += sL[w] * wt[w];
        }
        T* orow = out + (size_t)(q_start + r) * ld_out + col0;
        for (uint32_t c = threadIdx.x; c < head_dim; c += THREADS) {
            float acc = 0.0f;
#pragma unroll
            for (int w = 0; w < WARPS; ++w) acc += sO[w * head_dim + c] * wt[w];
            orow[c] = from_f32<T>(acc / lg);
        }
        __syncthreads();  // sQ, sO, sM, sL are reused by the next row
    }
}

}  // namespace

#define DECODE_ATTENTION(NAME, T)                                                              \
    extern "C" __global__ void __launch_bounds__(THREADS)                                      \
        NAME(const T* q, const T* k, const T* v, const uint32_t* tiles,                        \
             const uint64_t* tile_ctx, const uint32_t* ctx_tokens, T* out, uint32_t head_dim,  \
             uint32_t ld, uint32_t ld_out, float scale) {                                      \
        decode_attention<T>(q, k, v, tiles, tile_ctx, ctx_tokens, out, head_dim, ld, ld_out,   \
                            scale);                                                            \
    }

DECODE_ATTENTION(decode_attention_bf16, __nv_bfloat16)
DECODE_ATTENTION(decode_attention_f16, __half)
