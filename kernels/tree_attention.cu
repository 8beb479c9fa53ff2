// tree_attention: softmax attention over a prefix tree of token segments (cascade attention).
//
//   for every query tile (<= 64 consecutive tokens of one segment, or several whole sibling
//   segments packed together) and head h:
//     ctx token j (j = 0 .. q_pos + q_len - 1) is ctx_tokens[ctx_offset + j]: the tokens of the
//     segment's ancestors, root first, then the segment's own tokens; a query at ctx position
//     q_pos + r sees keys j <= q_pos + r (all ancestors, causally its own segment).
//     out[q_start + r, h] = softmax_j(q . k_j / sqrt(head_dim)) . v_j
//   A packed tile (tiles[4 t + 3] != 0) holds small subtrees of the plan that share their
//   ancestors (q_pos tokens): the context map is those ancestors, then the tile's query tokens,
//   then per row a 64-bit mask (two u32, low first) of the tile tokens the row sees (its
//   ancestors inside the tile and itself causally); row r sees keys j < q_pos, and j = q_pos + b
//   for the mask's bits b <= r. Inline candidates are short branches under one long text
//   prefix: packing them reads that prefix once per tile instead of once per branch.
//
// Inputs are T (bf16/f16): q [n, ld] (rotated), this layer's K and V cache [capacity, ld] indexed
// by flat token index; out is T [n, ld_out] (the input of out_proj). Scores, the running max and
// sum, and the output accumulator are f32; P is rounded to T for the P.V product (as
// FlashAttention does), l sums the unrounded p.
//
// Launch: grid (n_tiles, n_head), block 128 = 4 warps, BM = 64 query rows (16 per warp), BN = 64
// keys per step, dynamic shared memory (the Layout below; its size is smem_bytes in
// src/cuda/tree_attention.rs: 191.25 KiB at head_dim 256, so one block per SM on an H200 --
// attention is ~1% of GPT-J's FLOPs at these sequence lengths, so simplicity wins over occupancy
// here). head_dim is zero-padded to hd_pad (multiple of 16) in shared memory, so any head_dim up
// to 256 works, odd ones included.
// Per key tile: the block loads K and V rows through the ctx map (gather), then each warp, on its
// own 16 rows only (no block barrier between these steps):
//   S = Q K^T     WMMA 16x16x16 (tensor cores), f32 accumulate, stored to shared
//   online softmax in f32: mask, new max, p = exp(s - m), l = l * alpha + sum p, O *= alpha
//   O += P V      WMMA, the f32 accumulator round-trips through shared memory (its register
//                 layout is opaque, and the per-row rescale needs rows)
// Warps whose 16 rows are all past q_len skip the math (they still help load).
//
// Variants (exported): _vec_ loads K/V/Q rows as 16-byte vectors (needs head_dim % 8 == 0, ld % 8
// == 0, 16-byte aligned buffers: GPT-J); _scalar_ loads element by element (any shape). What was
// tried and measured lives in docs/kernels.md.
#include <mma.h>

#include "common.cuh"
#include "attention_tile.cuh"

using namespace toolsift;
using namespace nvcuda;

namespace {

// Shared-memory layout (element strides padded by 16 bytes against bank conflicts; every WMMA
// pointer stays 32-byte aligned: all row strides are multiples of 16 bytes and tiles start at
// multiples of 16 rows).
struct Layout {
    int hdp;  // head_dim padded to a multiple of 16
    __device__ __host__ int ldq() const { return hdp + 8; }  // T elements, sQ / sK / sV
    __device__ __host__ int lds() const { return BN + 4; }   // floats, sS
    __device__ __host__ int ldp() const { return BN + 8; }   // T elements, sP
    __device__ __host__ int ldo() const { return hdp + 4; }  // floats, sO
};

template <typename T, bool VEC>
__device__ void tree_attention(const T* __restrict__ q,                // [n, ld]
                               const T* __restrict__ k,                // [capacity, ld]
                               const T* __restrict__ v,                // [capacity, ld]
                               const uint32_t* __restrict__ tiles,     // [n_tiles, 4]
                               const uint64_t* __restrict__ tile_ctx,  // [n_tiles]
                               const uint32_t* __restrict__ ctx_tokens,  // [ctx map]
                               T* __restrict__ out,                    // [n, ld_out]
                               uint32_t head_dim, uint32_t hd_pad, uint32_t ld, uint32_t ld_out,
                               float scale) {
    extern __shared__ __align__(128) unsigned char smem[];
    const Layout L{(int)hd_pad};
    const int hdp = L.hdp, ldq = L.ldq(), lds = L.lds(), ldp = L.ldp(), ldo = L.ldo();
    T* sQ = reinterpret_cast<T*>(smem);                // [BM, ldq]
    T* sK = sQ + BM * ldq;                             // [BN, ldq]
    T* sV = sK + BN * ldq;                             // [BN, ldq]
    float* sS = reinterpret_cast<float*>(sV + BN * ldq);  // [BM, lds]
    T* sP = reinterpret_cast<T*>(sS + BM * lds);       // [BM, ldp]
    float* sO = reinterpret_cast<float*>(sP + BM * ldp);  // [BM, ldo]
    float* sM = sO + BM * ldo;                         // [BM] running max
    float* sL = sM + BM;                               // [BM] running sum
    uint32_t* sTok = reinterpret_cast<uint32_t*>(sL + BM);  // [BM] (query and key token ids)
    unsigned long long* sMask =
        reinterpret_cast<unsigned long long*>(sTok + BM);  // [BM] packed tiles: visible tile keys

    const uint32_t tile = blockIdx.x, head = blockIdx.y;
    const uint32_t q_start = tiles[4 * tile], q_len = tiles[4 * tile + 1];
    const uint32_t q_pos = tiles[4 * tile + 2];
    const uint32_t* ctx = ctx_tokens + tile_ctx[tile];
    const uint32_t n_ctx = q_pos + q_len;
    const bool packed = tiles[4 * tile + 3] != 0;
    const size_t col0 = (size_t)head * head_dim;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

    // Q tile, O = 0, m = -inf, l = 0.
    for (int r = threadIdx.x; r < BM; r += THREADS) {
        sTok[r] = q_start + (r < (int)q_len ? r : 0);
        sM[r] = -INFINITY;
        sL[r] = 0.0f;
        sMask[r] = packed && r < (int)q_len
                       ? (unsigned long long)ctx[n_ctx + 2 * r] |
                             ((unsigned long long)ctx[n_ctx + 2 * r + 1] << 32)
                       : ~0ull;
    }
    for (int idx = threadIdx.x; idx < BM * ldo; idx += THREADS) sO[idx] = 0.0f;
    __syncthreads();
    gather_rows<T, VEC, THREADS>(sQ, ldq, q, ld, sTok, BM, q_len, head_dim, hdp, col0);
    __syncthreads();

    const bool active = warp * 16 < (int)q_len;  // warp-uniform
    const int row0 = warp * 16;
    for (uint32_t j0 = 0; j0 < n_ctx; j0 += BN) {
        const int valid = min((uint32_t)BN, n_ctx - j0);
        for (int r = threadIdx.x; r < BN; r += THREADS) sTok[r] = r < valid ? ctx[j0 + r] : 0;
        __syncthreads();
        gather_rows<T, VEC, THREADS>(sK, ldq, k, ld, sTok, BN, valid, head_dim, hdp, col0);
        gather_rows<T, VEC, THREADS>(sV, ldq, v, ld, sTok, BN, valid, head_dim, hdp, col0);
        __syncthreads();
        if (active) {
            // S[row0 .. row0 + 16, 0 .. BN] = Q K^T
            for (int jn = 0; jn < BN / 16; ++jn) {
                wmma::fragment<wmma::accumulator, 16, 16, 16, float> s;
                wmma::fill_fragment(s, 0.0f);
                for (int kk = 0; kk < hdp / 16; ++kk) {
                    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b;
                    wmma::load_matrix_sync(a, sQ + row0 * ldq + kk * 16, ldq);
                    wmma::load_matrix_sync(b, sK + jn * 16 * ldq + kk * 16, ldq);
                    wmma::mma_sync(s, a, b, s);
                }
                wmma::store_matrix_sync(sS + row0 * lds + jn * 16, s, lds, wmma::mem_row_major);
            }
            __syncwarp();
            // Online softmax, one row at a time; lane owns columns lane and lane + 32.
            for (int rr = 0; rr < 16; ++rr) {
                const int r = row0 + rr;
                // Rows past q_len see every loaded key (finite, never written out). In a packed
                // tile, a key of the tile itself is visible only if the row's mask has its bit.
                const uint32_t limit = r < (int)q_len ? q_pos + r : n_ctx - 1;
                const unsigned long long mask = sMask[r];
                const uint32_t c0 = j0 + lane, c1 = j0 + lane + 32;
                const bool v0 = c0 <= limit && (c0 < q_pos || ((mask >> (c0 - q_pos)) & 1ull));
                const bool v1 = c1 <= limit && (c1 < q_pos || ((mask >> (c1 - q_pos)) & 1ull));
                const float s0 = v0 ? sS[r * lds + lane] * scale : -INFINITY;
                const float s1 = v1 ? sS[r * lds + lane + 32] * scale : -INFINITY;
                const float m_old = sM[r];
                // Key 0 is visible to every row (packed tiles have ancestors), so m_new is
                // finite from the first tile on.
                const float m_new = fmaxf(m_old, warp_max(fmaxf(s0, s1)));
                const float p0 = expf(s0 - m_new), p1 = expf(s1 - m_new);
                const float sum = warp_sum(p0 + p1);
                const float alpha = expf(m_old - m_new);  // 0 on the first tile
                const float l_old = sL[r];
                __syncwarp();
                if (lane == 0) {
                    sM[r] = m_new;
                    sL[r] = l_old * alpha + sum;
                }
                sP[r * ldp + lane] = from_f32<T>(p0);
                sP[r * ldp + lane + 32] = from_f32<T>(p1);
                for (int c = lane; c < hdp; c += 32) sO[r * ldo + c] *= alpha;
            }
            __syncwarp();
            // O[row0 .. row0 + 16, :] += P V
            for (int jd = 0; jd < hdp / 16; ++jd) {
                wmma::fragment<wmma::accumulator, 16, 16, 16, float> o;
                wmma::load_matrix_sync(o, sO + row0 * ldo + jd * 16, ldo, wmma::mem_row_major);
                for (int kk = 0; kk < BN / 16; ++kk) {
                    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> b;
                    wmma::load_matrix_sync(a, sP + row0 * ldp + kk * 16, ldp);
                    wmma::load_matrix_sync(b, sV + kk * 16 * ldq + jd * 16, ldq);
                    wmma::mma_sync(o, a, b, o);
                }
                wmma::store_matrix_sync(sO + row0 * ldo + jd * 16, o, ldo, wmma::mem_row_major);
            }
        }
        __syncthreads();  // sK, sV, sTok are overwritten by the next tile
    }
    // out = O / l for the valid rows.
    for (int idx = threadIdx.x; idx < (int)q_len * (int)head_dim; idx += THREADS) {
        const int r = idx / head_dim, c = idx % head_dim;
        out[(size_t)(q_start + r) * ld_out + col0 + c] = from_f32<T>(sO[r * ldo + c] / sL[r]);
    }
}

}  // namespace

#define TREE_ATTENTION(NAME, T, VEC)                                                           \
    extern "C" __global__ void __launch_bounds__(THREADS)                                      \
        NAME(const T* q, const T* k, const T* v, const uint32_t* tiles,                        \
             const uint64_t* tile_ctx, const uint32_t* ctx_tokens, T* out, uint32_t head_dim,  \
             uint32_t hd_pad, uint32_t ld, uint32_t ld_out, float scale) {                     \
        tree_attention<T, VEC>(q, k, v, tiles, tile_ctx, ctx_tokens, out, head_dim, hd_pad,    \
                               ld, ld_out, scale);                                             \
    }

TREE_ATTENTION(tree_attention_vec_bf16, __nv_bfloat16, true)
TREE_ATTENTION(tree_attention_scalar_bf16, __nv_bfloat16, false)
TREE_ATTENTION(tree_attention_vec_f16, __half, true)
TREE_ATTENTION(tree_attention_scalar_f16, __half, false)
