// The emulated device's libcublasLt.so (see driver.cpp): the matmuls src/cuda/gemm.rs issues,
// computed on the host in f32 with the operands checked against the device's allocations.
//
// D = alpha op(A) op(B) + beta C, column-major, op() from the descriptor's TRANSA / TRANSB;
// A and B bf16, f16 or f32 (the same type), C and D f32, bf16 or f16 (the same layout), f32
// compute and scale. Each output is one f32 dot product in k order, then rounded once to D's
// type (round to nearest even), which is what cuBLASLt computes up to the order of the sum.
// The heuristic offers a single "algorithm"; workspaces are accepted and unused.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <string>

#define EXPORT extern "C" __attribute__((visibility("default")))

// From the emulated libcuda.so (linked as a dependency).
extern "C" int toolsift_emu_device_span(const void* ptr, size_t bytes);

typedef int cublasStatus_t;
enum : cublasStatus_t {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum : int { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 };
enum : int { CUBLAS_COMPUTE_32F = 68 };

struct cublasLtContext {
    int unused;
};
struct cublasLtMatmulDescOpaque_st {
    int compute_type, scale_type;
    int transa = 0, transb = 0;
};
struct cublasLtMatrixLayoutOpaque_st {
    int type;
    uint64_t rows, cols;
    int64_t ld;
};
struct cublasLtMatmulPreferenceOpaque_st {
    int unused;
};
struct cublasLtMatmulAlgo_t {
    uint64_t data[8];
};
struct cublasLtMatmulHeuristicResult_t {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
};
typedef cublasLtContext* cublasLtHandle_t;
typedef cublasLtMatmulDescOpaque_st* cublasLtMatmulDesc_t;
typedef cublasLtMatrixLayoutOpaque_st* cublasLtMatrixLayout_t;
typedef cublasLtMatmulPreferenceOpaque_st* cublasLtMatmulPreference_t;

namespace {

size_t type_size(int type) {
    switch (type) {
        case CUDA_R_32F: return 4;
        case CUDA_R_16F:
        case CUDA_R_16BF: return 2;
        default: return 0;
    }
}

float bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40);  // NaN
    bits += 0x7fffu + ((bits >> 16) & 1);
    return (uint16_t)(bits >> 16);
}

float f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    float f;
    if (exp == 0) {
        f = ldexpf((float)man, -24);
        return sign ? -f : f;
    }
    uint32_t bits = exp == 31 ? sign | 0x7f800000u | (man << 13)
                              : sign | ((exp + 112) << 23) | (man << 13);
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t f32_to_f16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, 4);
    const uint16_t sign = (uint16_t)((bits >> 16) & 0x8000);
    const uint32_t abs = bits & 0x7fffffffu;
    if (abs > 0x7f800000u) return sign | 0x7e00;         // NaN
    if (abs >= 0x477ff000u) return sign | 0x7c00;        // rounds to infinity (>= 65520)
    if (abs < 0x38800000u) {                             // subnormal or zero in f16
        float a;
        memcpy(&a, &abs, 4);
        // Multiples of 2^-24: nearbyintf rounds to nearest even.
        return sign | (uint16_t)nearbyintf(a * 16777216.0f);
    }
    uint32_t r = abs + 0xfffu + ((abs >> 13) & 1);     // round mantissa to 10 bits, ties to even
    return sign | (uint16_t)((r - 0x38000000u) >> 13);
}

float load(const void* base, int type, size_t i) {
    switch (type) {
        case CUDA_R_32F: return static_cast<const float*>(base)[i];
        case CUDA_R_16BF: return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
        default: return f16_to_f32(static_cast<const uint16_t*>(base)[i]);
    }
}

void store(void* base, int type, size_t i, float v) {
    switch (type) {
        case CUDA_R_32F: static_cast<float*>(base)[i] = v; break;
        case CUDA_R_16BF: static_cast<uint16_t*>(base)[i] = f32_to_bf16(v); break;
        default: static_cast<uint16_t*>(base)[i] = f32_to_f16(v); break;
    }
}

cublasStatus_t reject(const std::string& why) {
    fprintf(stderr, "toolsift emulated cuBLASLt: %s\n", why.c_str());
    return CUBLAS_STATUS_INVALID_VALUE;
}

// Bytes a column-major layout spans.
size_t span(const cublasLtMatrixLayoutOpaque_st& l) {
    if (l.rows == 0 || l.cols == 0) return 0;
    return ((l.cols - 1) * (uint64_t)l.ld + l.rows) * type_size(l.type);
}

}  // namespace

EXPORT cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
    if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
    *handle = new cublasLtContext{0};
    return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, int compute_type,
                                               int scale_type) {
    if (!desc) return CUBLAS_STATUS_INVALID_VALUE;
    if (compute_type != CUBLAS_COMPUTE_32F || scale_type != CUDA_R_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    *desc = new cublasLtMatmulDescOpaque_st{compute_type, scale_type};
    return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
    delete desc;
    return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, int attribute,
                                                     const void* buf, size_t size) {
    if (!desc || !buf) return CUBLAS_STATUS_INVALID_VALUE;
    if (attribute == 3 || attribute == 4) {  // TRANSA, TRANSB (cublasOperation_t, 4 bytes)
        int32_t op;
        if (size != 4) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&op, buf, 4);
        if (op != 0 && op != 1) return CUBLAS_STATUS_NOT_SUPPORTED;
        (attribute == 3 ? desc->transa : desc->transb) = op;
        return CUBLAS_STATUS_SUCCESS;
    }
    return reject("matmul descriptor attribute " + std::to_string(attribute) +
                  " is not emulated");
}

EXPORT cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, int type,
                                                 uint64_t rows, uint64_t cols, int64_t ld) {
    if (!layout || type_size(type) == 0) return CUBLAS_STATUS_INVALID_VALUE;
    if (ld < (int64_t)rows || (rows > 0 && ld < 1)) return CUBLAS_STATUS_INVALID_VALUE;
    *layout = new cublasLtMatrixLayoutOpaque_st{type, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
    delete layout;
    return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
    if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
    *pref = new cublasLtMatmulPreferenceOpaque_st{0};
    return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    delete pref;
    return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref, int,
                                                           const void* buf, size_t) {
    return pref && buf ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

// Checks the shapes and types of D = op(A) op(B) + C; empty on success, else the reason.
static std::string check_shapes(const cublasLtMatmulDescOpaque_st& d,
                                const cublasLtMatrixLayoutOpaque_st& a,
                                const cublasLtMatrixLayoutOpaque_st& b,
                                const cublasLtMatrixLayoutOpaque_st& c,
                                const cublasLtMatrixLayoutOpaque_st& dd) {
    const uint64_t m = d.transa ? a.cols : a.rows, k = d.transa ? a.rows : a.cols;
    const uint64_t kb = d.transb ? b.cols : b.rows, n = d.transb ? b.rows : b.cols;
    if (k != kb) return "op(A) is m x " + std::to_string(k) + " but op(B) is " +
                        std::to_string(kb) + " x n";
    if (c.rows != m || c.cols != n || dd.rows != m || dd.cols != n)
        return "C / D are not " + std::to_string(m) + " x " + std::to_string(n);
    if (a.type != b.type) return "A and B have different types";
    if (c.type != dd.type || c.ld != dd.ld) return "C and D have different layouts";
    return "";
}

EXPORT cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
    cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
    cublasLtMatmulPreference_t pref, int requested, cublasLtMatmulHeuristicResult_t* results,
    int* returned) {
    if (!handle || !desc || !a || !b || !c || !d || !pref || !results || !returned ||
        requested < 1)
        return CUBLAS_STATUS_INVALID_VALUE;
    std::string why = check_shapes(*desc, *a, *b, *c, *d);
    if (!why.empty()) return reject("heuristic: " + why);
    memset(results, 0, sizeof *results);
    results->algo.data[0] = 1;
    results->state = CUBLAS_STATUS_SUCCESS;
    results->wavesCount = 1.0f;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                     const void* alpha_p, const void* A,
                                     cublasLtMatrixLayout_t a, const void* B,
                                     cublasLtMatrixLayout_t b, const void* beta_p, const void* C,
                                     cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t d,
                                     const cublasLtMatmulAlgo_t* algo, void* workspace,
                                     size_t workspace_bytes, void* stream) {
    (void)workspace, (void)workspace_bytes, (void)stream;
    if (!handle || !desc || !alpha_p || !beta_p || !a || !b || !c || !d || !algo)
        return CUBLAS_STATUS_INVALID_VALUE;
    std::string why = check_shapes(*desc, *a, *b, *c, *d);
    if (!why.empty()) return reject("matmul: " + why);
    const struct {
        const void* p;
        const cublasLtMatrixLayoutOpaque_st* l;
        const char* name;
    } operands[] = {{A, a, "A"}, {B, b, "B"}, {C, c, "C"}, {D, d, "D"}};
    for (const auto& o : operands)
        if (span(*o.l) > 0 && !toolsift_emu_device_span(o.p, span(*o.l)))
            return reject(std::string("matmul: operand ") + o.name + " (" +
                          std::to_string(o.l->rows) + " x " + std::to_string(o.l->cols) +
                          ", ld " + std::to_string(o.l->ld) +
                          ") is not inside one device allocation");
    const float alpha = *static_cast<const float*>(alpha_p);
    const float beta = *static_cast<const float*>(beta_p);
    const uint64_t m = d->rows, n = d->cols, k = desc->transa ? a->rows : a->cols;
    // op(X)(i, p) of a column-major X: X[i + p ld] or, transposed, X[p + i ld].
    auto at = [](const cublasLtMatrixLayoutOpaque_st& l, bool t, uint64_t i, uint64_t p) {
        return t ? p + i * (uint64_t)l.ld : i + p * (uint64_t)l.ld;
    };
    for (uint64_t j = 0; j < n; ++j)
        for (uint64_t i = 0; i < m; ++i) {
            float acc = 0.0f;
            for (uint64_t p = 0; p < k; ++p)
                acc += load(A, a->type, at(*a, desc->transa, i, p)) *
                       load(B, b->type, at(*b, desc->transb, p, j));
            float v = alpha * acc;
            if (beta != 0.0f) v += beta * load(C, c->type, i + j * (uint64_t)c->ld);
            store(D, d->type, i + j * (uint64_t)d->ld, v);
        }
    return CUBLAS_STATUS_SUCCESS;
}
