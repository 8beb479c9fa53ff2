// Kernels that test the emulator itself (src/emu.rs tests): it must expose a race, report a
// barrier that can never complete, and shuffle like the device.
#include "cuda_emu.h"
#include "common.cuh"

// Thread i reads the slot thread i + 1 writes; `barrier` puts a __syncthreads in between.
extern "C" void emu_selftest_neighbour(float* out, int barrier) {
    __shared__ float slots[64];
    slots[threadIdx.x] = (float)threadIdx.x;
    if (barrier) __syncthreads();
    out[threadIdx.x] = slots[(threadIdx.x + 1) % 64];
}

// Odd lanes wait at a warp barrier the even lanes never reach.
extern "C" void emu_selftest_divergent(float* out) {
    if (threadIdx.x & 1) __syncwarp();
    out[threadIdx.x] = 1.0f;
}

// Every thread gets the sum of its warp's thread indices, and of the whole block's.
extern "C" void emu_selftest_sums(float* warp_out, float* block_out) {
    __shared__ float scratch[32];
    warp_out[threadIdx.x] = toolsift::warp_sum((float)threadIdx.x);
    block_out[threadIdx.x] = toolsift::block_sum((float)threadIdx.x, scratch);
}

// A warp sum in a block whose last warp is partial (launch with a blockDim not a multiple of 32).
extern "C" void emu_selftest_partial_warp(float* out) {
    out[threadIdx.x] = toolsift::warp_sum((float)threadIdx.x);
}

// The second warp returns before a __syncthreads the first one reaches.
extern "C" void emu_selftest_exit_before_barrier(float* out) {
    if (threadIdx.x >= 32) return;
    __syncthreads();
    out[threadIdx.x] = 1.0f;
}

// Thread 0 writes element `at` of `out`: past the end of a buffer of fewer elements.
extern "C" void emu_selftest_write_at(float* out, int at) {
    if (threadIdx.x == 0) out[at] = 1.0f;
}

// Two block sums on one scratch, as layer_norm takes its mean and variance. With `barrier` 0 the
// first sum leaves out its trailing __syncthreads, so a warp running ahead can overwrite its
// partial with the second sum's before a warp held back has read it.
extern "C" void emu_selftest_scratch_reuse(float* out, int barrier) {
    __shared__ float scratch[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    float v = toolsift::warp_sum(1.0f);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = toolsift::warp_sum(lane < n_warps ? scratch[lane] : 0.0f);
    if (barrier) __syncthreads();
    out[2 * threadIdx.x] = v;
    out[2 * threadIdx.x + 1] = toolsift::block_sum((float)threadIdx.x, scratch);
}

// From the hand mutation review of the host emulator (session 50).
#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "mma.h"
#include "mma_sync.cuh"

// Every thread writes its threadIdx, blockIdx, blockDim, gridDim and lane (13 values) at its
// global linear index.
extern "C" void emu_selftest_indices(unsigned* out) {
    const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    unsigned* o = out + 13 * (b * blockDim.x * blockDim.y * blockDim.z + t);
    const unsigned v[13] = {threadIdx.x, threadIdx.y, threadIdx.z, blockIdx.x,   blockIdx.y,
                            blockIdx.z,  blockDim.x,  blockDim.y,  blockDim.z,   gridDim.x,
                            gridDim.y,   gridDim.z,   (unsigned)toolsift_emu::lane_id()};
    for (int i = 0; i < 13; ++i) o[i] = v[i];
}

// Thread i of each block reads, before anything writes them, word i of the static and of the
// dynamic shared memory (both must read 0xFFFFFFFF), then writes them; thread 0 also writes the
// dynamic shared memory's address modulo 128 after the block's words.
extern "C" void emu_selftest_fresh_shared(unsigned* out) {
    __shared__ unsigned words[64];
    unsigned* dyn = reinterpret_cast<unsigned*>(toolsift_emu::dynamic_shared());
    const unsigned o = blockIdx.x * 129;
    out[o + threadIdx.x] = words[threadIdx.x];
    out[o + 64 + threadIdx.x] = dyn[threadIdx.x];
    words[threadIdx.x] = threadIdx.x;
    dyn[threadIdx.x] = threadIdx.x;
    if (threadIdx.x == 0) out[o + 128] = (unsigned)(reinterpret_cast<uintptr_t>(dyn) % 128);
}

// Thread 0 writes byte `at` of the dynamic shared memory.
extern "C" void emu_selftest_shared_write_at(int at) {
    if (threadIdx.x == 0) toolsift_emu::dynamic_shared()[at] = 1;
}

// Thread `who` of block 1 reads in[at] into out[0].
extern "C" void emu_selftest_read_at(const float* in, float* out, long at, int who) {
    if (blockIdx.x == 1 && (int)threadIdx.x == who) out[0] = in[at];
}

// One construct the emulator refuses (`which` 0..=7, see the switch), or none (then every thread
// writes 2 at out[threadIdx.x], which the refused ones never reach).
extern "C" void emu_selftest_unsupported(int which, float* out) {
    __shared__ __align__(32) __nv_bfloat16 tile[16 * 32];
    nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, __nv_bfloat16,
                           nvcuda::wmma::row_major>
        a;
    uint32_t r[4];
    switch (which) {
        case 0: __syncwarp(0xffffu); break;
        case 1: out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1, 16); break;
        case 2: out[threadIdx.x] = __shfl_xor_sync(0xffffu, 1.0f, 1); break;
        case 3: nvcuda::wmma::load_matrix_sync(a, tile + 8, 16); break;  // 16-byte aligned only
        case 4: nvcuda::wmma::load_matrix_sync(a, tile, 20); break;      // ldm: 40 bytes
        case 5: toolsift::ldmatrix_x4(r, tile + 16 * threadIdx.x + 4); break;  // 8-byte rows
        case 6: out[threadIdx.x] = (float)toolsift::load_vec16(tile + 4).x; break;  // 8 bytes in
        case 7: toolsift::store_vec16(tile + 8 * threadIdx.x + 4, make_uint4(0, 0, 0, 0)); break;
        default: break;
    }
    out[threadIdx.x] = 2.0f;
}

// __shfl_xor_sync with lane mask `mask`: out[lane] = the value lane ^ mask offers (lane + 100).
extern "C" void emu_selftest_shuffle_xor(float* out, int mask) {
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (float)threadIdx.x + 100.0f, mask);
}

// A WMMA accumulator of ones stored to shared memory, then lane l reads element l + 1 (stored by
// lane l + 1); `sync` puts the __syncwarp in between.
extern "C" void emu_selftest_wmma_store(float* out, int sync) {
    __shared__ __align__(32) float tile[16 * 16];
    nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> acc;
    nvcuda::wmma::fill_fragment(acc, 1.0f);
    nvcuda::wmma::store_matrix_sync(tile, acc, 16, nvcuda::wmma::mem_row_major);
    if (sync) __syncwarp();
    out[threadIdx.x] = tile[(threadIdx.x + 1) % 32];
}

// bf16 and f16 rounding of in[i] (bits out) and the widening of those bits back.
extern "C" void emu_selftest_convert(const float* in, uint16_t* bf, uint16_t* h, float* bf_back,
                                     float* h_back, int n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        bf[i] = __float2bfloat16_rn(in[i]).bits;
        h[i] = __float2half_rn(in[i]).bits;
        bf_back[i] = __bfloat162float(__nv_bfloat16{bf[i]});
        h_back[i] = __half2float(__half{h[i]});
    }
}

// ldmatrix_x4 and ldmatrix_x4_trans of 32 rows of 8 16-bit values, back to back: first lane l
// giving the address of row 31 - l, then of row l. out[128 c + 4 l + m] = register m of lane l
// in call c (0: plain, 1: .trans, rows 31 - l; 2: plain, 3: .trans, rows l).
extern "C" void emu_selftest_ldmatrix(const uint16_t* src, uint32_t* out) {
    __shared__ __align__(16) uint16_t rows[32 * 8];
    for (int i = 0; i < 8; ++i) rows[8 * threadIdx.x + i] = src[8 * threadIdx.x + i];
    __syncwarp();
    for (int call = 0; call < 4; ++call) {
        uint32_t r[4];
        const uint16_t* row = rows + 8 * (call < 2 ? 31 - threadIdx.x : threadIdx.x);
        if (call % 2)
            toolsift::ldmatrix_x4_trans(r, row);
        else
            toolsift::ldmatrix_x4(r, row);
        for (int m = 0; m < 4; ++m) out[128 * call + 4 * threadIdx.x + m] = r[m];
    }
}

// Lane 5 of the first warp returns; the others then shuffle (a warp barrier it never reaches).
extern "C" void emu_selftest_one_lane_exits(float* out) {
    if (threadIdx.x == 5) return;
    out[threadIdx.x] = toolsift::warp_sum(1.0f);
}

// d = a b + c by mma_m16n8k16 (`f16`: __half, else __nv_bfloat16), every register filled and
// read through the PTX ISA's fragment layouts (kernels/mma_sync.cuh), written here afresh:
// a 16 x 16 row-major, b 16 x 8 (k x n) row-major, c and d 16 x 8 row-major.
extern "C" void emu_selftest_mma(const uint16_t* a, const uint16_t* b, const float* c, float* d,
                                 int f16) {
    const int g = threadIdx.x / 4, t = threadIdx.x % 4;
    auto pair = [](uint16_t lo, uint16_t hi) { return (uint32_t)lo | (uint32_t)hi << 16; };
    uint32_t ar[4], br[2];
    for (int i = 0; i < 4; ++i) {
        const int row = g + 8 * (i % 2), k = 2 * t + 8 * (i / 2);
        ar[i] = pair(a[16 * row + k], a[16 * row + k + 1]);
    }
    for (int i = 0; i < 2; ++i) {
        const int k = 2 * t + 8 * i;
        br[i] = pair(b[8 * k + g], b[8 * (k + 1) + g]);
    }
    float cr[4], dr[4];
    for (int i = 0; i < 4; ++i) cr[i] = c[8 * (g + 8 * (i / 2)) + 2 * t + i % 2];
    if (f16)
        toolsift::mma_m16n8k16<__half>(dr, ar, br, cr);
    else
        toolsift::mma_m16n8k16<__nv_bfloat16>(dr, ar, br, cr);
    for (int i = 0; i < 4; ++i) d[8 * (g + 8 * (i / 2)) + 2 * t + i % 2] = dr[i];
}

// Thread i of a warp waits at __syncthreads when i is odd, at __syncwarp when even; then all
// meet at a __syncwarp. The warp is split across two kinds of barrier: it can never go on.
extern "C" void emu_selftest_mixed_barriers(float* out) {
    if (threadIdx.x & 1)
        __syncthreads();
    else
        __syncwarp();
    __syncwarp();
    out[threadIdx.x] = 1.0f;
}

// __shfl_xor_sync of 64-bit values: out[t] = the value lane t ^ mask offers, (t + 1) << 40 | t.
extern "C" void emu_selftest_shuffle_u64(unsigned long long* out, int mask) {
    const unsigned long long mine = (unsigned long long)(threadIdx.x + 1) << 40 | threadIdx.x;
    out[blockDim.x * blockIdx.x + threadIdx.x] = __shfl_xor_sync(0xffffffffu, mine, mask);
}

// The order the threads of each block run in: out[2 t] and out[2 t + 1] (t the thread's index
// in the grid) are its places in the rounds right after the first and the second __syncthreads.
extern "C" void emu_selftest_order(unsigned* out) {
    __shared__ unsigned next;
    const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const unsigned t = blockDim.x * b + threadIdx.x;
    if (threadIdx.x == 0) next = 0;
    __syncthreads();
    out[2 * t] = next++;
    __syncthreads();
    out[2 * t + 1] = next++;
}

// After a __syncthreads, each thread takes `rounds` places in turn, a __syncwarp after each:
// out[rounds t + r] is thread t's (its index in the grid) place in its r-th round.
extern "C" void emu_selftest_rounds(unsigned* out, int rounds) {
    __shared__ unsigned next;
    const unsigned t = blockDim.x * blockIdx.x + threadIdx.x;
    if (threadIdx.x == 0) next = 0;
    __syncthreads();
    for (int r = 0; r < rounds; ++r) {
        out[rounds * t + r] = next++;
        __syncwarp();
    }
}
