// tree_attention_mma: the tree_attention contract (same tiles, context maps and packed-row
// masks; see tree_attention.cu) in the FlashAttention-2 layout: S and O live in registers.
//
// Per block: one query tile (<= 64 rows) and one head, 4 warps of 16 rows. Per step of BN = 64
// context keys the block gathers K and V rows into shared memory; then each warp, on its own
// rows, without a block barrier:
//   S = Q K^T      mma.sync m16n8k16 (Q and K fragments loaded by ldmatrix), f32
//   online softmax on S's registers: a lane holds 2 rows x 16 columns; row max and sum over the
//                  4 lanes sharing a row (two shuffles); O *= alpha in registers
//   O += P V       P's C-fragments become A-fragments in place (rounded to T, as FlashAttention
//                  does; l sums the unrounded p), V fragments by ldmatrix.trans
// so nothing of S, P or O goes through shared memory, and shared memory is Q, K and V only
// (100 KiB at head_dim 256: two blocks per SM, against one for tree_attention).
//
// HD is head_dim rounded up to a multiple of 16, at most HD_MAX (64, 128 or 256), which sizes
// the O registers (HD_MAX / 2 floats per lane). head_dim is zero-padded to HD in shared memory,
// so any head_dim up to 256 works. Entry points tree_attention_mma<HD_MAX>_{vec,scalar}_<T>:
// the row gathers load 16-byte vectors (vec: head_dim % 8 == 0, ld % 8 == 0, aligned buffers,
// as tree_attention's) or elements.
#include "common.cuh"
#include "attention_tile.cuh"
#include "mma_sync.cuh"

using namespace toolsift;

namespace {

template <typename T, bool VEC, int HD_MAX>
__device__ void tree_attention_mma(const T* __restrict__ q, const T* __restrict__ k,
                                   const T* __restrict__ v, const uint32_t* __restrict__ tiles,
                                   const uint64_t* __restrict__ tile_ctx,
                                   const uint32_t* __restrict__ ctx_tokens, T* __restrict__ out,
                                   uint32_t head_dim, uint32_t hd_pad, uint32_t ld,
                                   uint32_t ld_out, float scale) {
    extern __shared__ __align__(128) unsigned char smem[];
    const int hd = (int)hd_pad, lds = hd + 8;  // row stride in T: +16 bytes against conflicts
    T* sQ = reinterpret_cast<T*>(smem);        // [BM, lds]
    T* sK = sQ + BM * lds;                     // [BN, lds]
    T* sV = sK + BN * lds;                     // [BN, lds]
    uint32_t* sTok = reinterpret_cast<uint32_t*>(sV + BN * lds);  // [BM]
    unsigned long long* sMask = reinterpret_cast<unsigned long long*>(sTok + BM);  // [BM]

    const uint32_t tile = blockIdx.x, head = blockIdx.y;
    const uint32_t q_start = tiles[4 * tile], q_len = tiles[4 * tile + 1];
    const uint32_t q_pos = tiles[4 * tile + 2];
    const uint32_t* ctx = ctx_tokens + tile_ctx[tile];
    const uint32_t n_ctx = q_pos + q_len;
    const bool packed = tiles[4 * tile + 3] != 0;
    const size_t col0 = (size_t)head * head_dim;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;

    for (int r = threadIdx.x; r < BM; r += THREADS) {
        sTok[r] = q_start + (r < (int)q_len ? r : 0);
        sMask[r] = packed && r < (int)q_len
                       ? (unsigned long long)ctx[n_ctx + 2 * r] |
                             ((unsigned long long)ctx[n_ctx + 2 * r + 1] << 32)
                       : ~0ull;
    }
    __syncthreads();
    gather_rows<T, VEC, THREADS>(sQ, lds, q, ld, sTok, BM, q_len, head_dim, hd, col0);

    // This lane's two rows (g and g + 8 of the warp's 16), what each sees, its running max and
    // sum, and its share of O: o[j][0..1] row g, o[j][2..3] row g + 8, columns 8 j + 2 t + 0/1.
    const int row0 = warp * 16;
    const bool active = row0 < (int)q_len;  // warp-uniform
    uint32_t limit[2];
    unsigned long long mask[2];
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    float o[HD_MAX / 8][4];
#pragma unroll
    for (int j = 0; j < HD_MAX / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;

    for (uint32_t j0 = 0; j0 < n_ctx; j0 += BN) {
        const int valid = min((uint32_t)BN, n_ctx - j0);
        __syncthreads();  // sTok (first step: sMask too) and sK / sV are free to overwrite
        if (j0 == 0)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                // Rows past q_len see every key (finite, never written out).
                const int r = row0 + g + 8 * h;
                limit[h] = r < (int)q_len ? q_pos + r : n_ctx - 1;
                mask[h] = sMask[r];
            }
        for (int r = threadIdx.x; r < BN; r += THREADS) sTok[r] = r < valid ? ctx[j0 + r] : 0;
        __syncthreads();
        gather_rows<T, VEC, THREADS>(sK, lds, k, ld, sTok, BN, valid, head_dim, hd, col0);
        gather_rows<T, VEC, THREADS>(sV, lds, v, ld, sTok, BN, valid, head_dim, hd, col0);
        __syncthreads();
        if (!active) continue;

        // S = Q K^T: s[n] is the 16 x 8 block of keys 8 n .. 8 n + 7.
        float s[BN / 8][4];
#pragma unroll
        for (int n = 0; n < BN / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HD_MAX / 16; ++kk) {
            if (kk * 16 >= hd) break;
            // Q rows row0 + (lane % 16), columns 16 kk + 8 (lane / 16): the A fragment.
            uint32_t a[4];
            ldmatrix_x4(a, sQ + (row0 + (lane & 15)) * lds + kk * 16 + (lane >> 4) * 8);
#pragma unroll
            for (int n = 0; n < BN / 8; n += 2) {
                // Keys 8 n .. 8 n + 15 (lane / 16 picks the block), dims
                // 16 kk + 8 ((lane / 8) % 2): the B fragments of blocks n and n + 1.
                uint32_t b[4];
                ldmatrix_x4(b, sK + ((n + (lane >> 4)) * 8 + (lane & 7)) * lds + kk * 16 +
                                   ((lane >> 3) & 1) * 8);
                mma_m16n8k16<T>(s[n], a, b, s[n]);
                mma_m16n8k16<T>(s[n + 1], a, b + 2, s[n + 1]);
            }
        }

        // Online softmax on the lane's two rows; a row's 64 columns sit in the 4 lanes of its
        // group (lanes 4 g .. 4 g + 3), so its max and sum take two shuffles.
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float mx = -INFINITY;
#pragma unroll
            for (int n = 0; n < BN / 8; ++n)
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    const uint32_t c = j0 + n * 8 + 2 * t + i;
                    const bool seen =
                        c <= limit[h] && (c < q_pos || ((mask[h] >> (c - q_pos)) & 1ull));
                    s[n][2 * h + i] = seen ? s[n][2 * h + i] * scale : -INFINITY;
                    mx = fmaxf(mx, s[n][2 * h + i]);
                }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            // Key 0 is visible to every row and lies in the first step, so m is finite from
            // then on; a later step whose keys this row cannot see leaves it unchanged.
            const float m_new = fmaxf(m[h], mx);
            const float alpha = expf(m[h] - m_new);  // 0 on the first step
            float sum = 0.0f;
#pragma unroll
            for (int n = 0; n < BN / 8; ++n)
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    const float p = expf(s[n][2 * h + i] - m_new);
                    s[n][2 * h + i] = p;
                    sum += p;
                }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            l[h] = l[h] * alpha + sum;
            m[h] = m_new;
#pragma unroll
            for (int j = 0; j < HD_MAX / 8; ++j) {
                o[j][2 * h] *= alpha;
                o[j][2 * h + 1] *= alpha;
            }
        }

        // O += P V, 16 keys at a time: S blocks 2 c and 2 c + 1 are exactly the A fragment of
        // those keys (rows g / g + 8, key pairs 2 t and 8 + 2 t).
#pragma unroll
        for (int c = 0; c < BN / 16; ++c) {
            const uint32_t a[4] = {
                pack_pair(from_f32<T>(s[2 * c][0]), from_f32<T>(s[2 * c][1])),
                pack_pair(from_f32<T>(s[2 * c][2]), from_f32<T>(s[2 * c][3])),
                pack_pair(from_f32<T>(s[2 * c + 1][0]), from_f32<T>(s[2 * c + 1][1])),
                pack_pair(from_f32<T>(s[2 * c + 1][2]), from_f32<T>(s[2 * c + 1][3]))};
#pragma unroll
            for (int j = 0; j < HD_MAX / 8; j += 2) {
                if (j * 8 >= hd) break;
                // V rows c * 16 + (lane % 16), dims 8 (j + lane / 16), transposed: the B
                // fragments (k = key, n = dim) of dim blocks j and j + 1.
                uint32_t b[4];
                ldmatrix_x4_trans(b, sV + (c * 16 + (lane & 15)) * lds + (j + (lane >> 4)) * 8);
                mma_m16n8k16<T>(o[j], a, b, o[j]);
                mma_m16n8k16<T>(o[j + 1], a, b + 2, o[j + 1]);
            }
        }
    }

    // out = O / l for the valid rows and columns.
    if (!active) return;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = row0 + g + 8 * h;
        if (r >= (int)q_len) continue;
        const float inv = 1.0f / l[h];
        T* orow = out + (size_t)(q_start + r) * ld_out + col0;
#pragma unroll
        for (int j = 0; j < HD_MAX / 8; ++j)
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const uint32_t c = j * 8 + 2 * t + i;
                if (c < head_dim) orow[c] = from_f32<T>(o[j][2 * h + i] * inv);
            }
    }
}

}  // namespace

#define TREE_ATTENTION_MMA(NAME, T, VEC, HD_MAX)                                               \
    extern "C" __global__ void __launch_bounds__(THREADS)                                      \
        NAME(const T* q, const T* k, const T* v, const uint32_t* tiles,                        \
             const uint64_t* tile_ctx, const uint32_t* ctx_tokens, T* out, uint32_t head_dim,  \
             uint32_t hd_pad, uint32_t ld, uint32_t ld_out, float scale) {                     \
        tree_attention_mma<T, VEC, HD_MAX>(q, k, v, tiles, tile_ctx, ctx_tokens, out,          \
                                           head_dim, hd_pad, ld, ld_out, scale);               \
    }

TREE_ATTENTION_MMA(tree_attention_mma64_vec_bf16, __nv_bfloat16, true, 64)
TREE_ATTENTION_MMA(tree_attention_mma128_vec_bf16, __nv_bfloat16, true, 128)
TREE_ATTENTION_MMA(tree_attention_mma256_vec_bf16, __nv_bfloat16, true, 256)
TREE_ATTENTION_MMA(tree_attention_mma64_scalar_bf16, __nv_bfloat16, false, 64)
TREE_ATTENTION_MMA(tree_attention_mma128_scalar_bf16, __nv_bfloat16, false, 128)
TREE_ATTENTION_MMA(tree_attention_mma256_scalar_bf16, __nv_bfloat16, false, 256)
TREE_ATTENTION_MMA(tree_attention_mma64_vec_f16, __half, true, 64)
TREE_ATTENTION_MMA(tree_attention_mma128_vec_f16, __half, true, 128)
TREE_ATTENTION_MMA(tree_attention_mma256_vec_f16, __half, true, 256)
TREE_ATTENTION_MMA(tree_attention_mma64_scalar_f16, __half, false, 64)
TREE_ATTENTION_MMA(tree_attention_mma128_scalar_f16, __half, false, 128)
TREE_ATTENTION_MMA(tree_attention_mma256_scalar_f16, __half, false, 256)
