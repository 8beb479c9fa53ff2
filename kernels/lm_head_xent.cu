// lm_head_xent: log-softmax over all vocab_size logits of a row, fused with the target gather.
//
//   lse_i        = log sum_v exp(logits[i, v] + bias[v])           (f32, one pass)
//   out[slot[t]] = logits[i, token[t]] + bias[token[t]] - lse_i   for t in offsets[i]..offsets[i+1]
//
// `logits` is the f32 output of the LM head GEMM over ONE chunk of the plan's weighted rows
// ([rows, ld], rows <= the chunk bound): the batch never has a [tokens x vocab] buffer, only this
// bounded scratch. The lm_head bias is added here, in f32. The targets of the chunk are grouped by
// row (CSR `offsets`); `slot` is the target's index in Plan::targets, so the host reduces the
// returned log-probs with Plan::reduce (weights, variants, candidates) exactly as the CPU does.
//
// Launch: grid (rows), block B (multiple of 32, <= 1024; the launcher picks 512 for GPT-J's 50400
// and the fuzz test runs every choice). `block_row_lse` reads the row once (201.6 KB for GPT-J).
#include "common.cuh"

using namespace toolsift;

// log sum_v exp(row[v] + bias[v]) over v < vocab, the same value in every thread of the block:
// each thread keeps a running (max, sum exp) over a strided slice of the row, then warp and block
// combine them. Every thread of the block must call it (it synchronises the block).
__device__ float block_row_lse(const float* __restrict__ row, const float* __restrict__ bias,
                               uint32_t vocab) {
    __shared__ float sm[32], ss[32];
    __shared__ float lse_shared;
    MaxSum acc = {-INFINITY, 0.0f};
    for (uint32_t v = threadIdx.x; v < vocab; v += blockDim.x) {
        acc = max_sum_push(acc, row[v] + bias[v]);
    }
    acc = warp_max_sum(acc);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    if (lane == 0) {
        sm[warp] = acc.m;
        ss[warp] = acc.s;
    }
    __syncthreads();
    if (warp == 0) {
        MaxSum w = lane < n_warps ? MaxSum{sm[lane], ss[lane]} : MaxSum{-INFINITY, 0.0f};
        w = warp_max_sum(w);
        if (lane == 0) lse_shared = w.m + logf(w.s);
    }
    __syncthreads();
    return lse_shared;
}

__device__ void lm_head_xent(const float* __restrict__ logits,    // [rows, ld]
                             const float* __restrict__ bias,      // [vocab]
                             const uint32_t* __restrict__ offsets,  // [rows + 1], into tokens
                             const uint32_t* __restrict__ tokens,   // [all targets]
                             const uint32_t* __restrict__ slots,    // [all targets]
                             float* __restrict__ out,             // [all targets of the plan]
                             uint32_t rows, uint32_t vocab, uint32_t ld) {
    const uint32_t i = blockIdx.x;
    if (i >= rows) return;
    const float* row = logits + (size_t)i * ld;
    const float lse = block_row_lse(row, bias, vocab);
    for (uint32_t t = offsets[i] + threadIdx.x; t < offsets[i + 1]; t += blockDim.x) {
        const uint32_t tok = tokens[t];
        out[slots[t]] = row[tok] + bias[tok] - lse;
    }
}

extern "C" __global__ void lm_head_xent_f32(const float* logits, const float* bias,
                                            const uint32_t* offsets, const uint32_t* tokens,
                                            const uint32_t* slots, float* out, uint32_t rows,
                                            uint32_t vocab, uint32_t ld) {
    lm_head_xent(logits, bias, offsets, tokens, slots, out, rows, vocab, ld);
}

// log_softmax_f32: the whole row, for the sampling steps (the host draws from it).
//   out[i, v] = logits[i, v] + bias[v] - lse_i     for v < vocab ([rows, ld_out], f32)
// Same launch and the same one-pass (max, sum) as lm_head_xent, then a second read to write.
extern "C" __global__ void log_softmax_f32(const float* __restrict__ logits,
                                           const float* __restrict__ bias,
                                           float* __restrict__ out, uint32_t rows, uint32_t vocab,
                                           uint32_t ld, uint32_t ld_out) {
    const uint32_t i = blockIdx.x;
    if (i >= rows) return;
    const float* row = logits + (size_t)i * ld;
    const float lse = block_row_lse(row, bias, vocab);
    float* o = out + (size_t)i * ld_out;
    for (uint32_t v = threadIdx.x; v < vocab; v += blockDim.x) o[v] = row[v] + bias[v] - lse;
}
